//! The outbox table and the indexes the relay scans by.

use crate::columns::{NAME_LEN, bounded, bytes, text, utc};
use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::{big_pk_auto, integer, json};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OutboxMessage {
    Table,
    Id,
    MessageId,
    Subject,
    Payload,
    Headers,
    OrderingKey,
    CreatedAt,
    PublishedAt,
    Attempts,
    LastError,
    NextAttemptAt,
    LockedBy,
    LockedUntil,
    DeadAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(OutboxMessage::Table)
                    .if_not_exists()
                    .col(big_pk_auto(OutboxMessage::Id))
                    .col(bounded(OutboxMessage::MessageId, NAME_LEN, false))
                    .col(bounded(OutboxMessage::Subject, NAME_LEN, false))
                    .col(bytes(db, OutboxMessage::Payload))
                    .col(json(OutboxMessage::Headers))
                    .col(bounded(OutboxMessage::OrderingKey, NAME_LEN, true))
                    .col(utc(db, OutboxMessage::CreatedAt, false))
                    .col(utc(db, OutboxMessage::PublishedAt, true))
                    .col(integer(OutboxMessage::Attempts).default(0))
                    .col(text(OutboxMessage::LastError, true))
                    .col(utc(db, OutboxMessage::NextAttemptAt, false))
                    .col(bounded(OutboxMessage::LockedBy, NAME_LEN, true))
                    .col(utc(db, OutboxMessage::LockedUntil, true))
                    .col(utc(db, OutboxMessage::DeadAt, true))
                    .to_owned(),
            )
            .await?;
        let indexes = [
            // The id JetStream dedupes on is unique here too.
            Index::create()
                .name("ix_outbox_message_message_id")
                .table(OutboxMessage::Table)
                .col(OutboxMessage::MessageId)
                .unique()
                .if_not_exists()
                .to_owned(),
            // The relay's scan: unpublished rows in id order.
            Index::create()
                .name("ix_outbox_message_pending")
                .table(OutboxMessage::Table)
                .col(OutboxMessage::PublishedAt)
                .col(OutboxMessage::Id)
                .if_not_exists()
                .to_owned(),
            // Per-key ordering: "is an earlier row of this key unpublished?".
            Index::create()
                .name("ix_outbox_message_ordering_key")
                .table(OutboxMessage::Table)
                .col(OutboxMessage::OrderingKey)
                .col(OutboxMessage::Id)
                .if_not_exists()
                .to_owned(),
        ];
        for index in indexes {
            manager.create_index(index).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(OutboxMessage::Table).to_owned())
            .await
    }
}
