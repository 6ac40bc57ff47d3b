//! The outbox table and the indexes the relay scans by.

use crate::columns::{NAME_LEN, bounded, bytes, create_index_if_missing, text, utc};
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
                .col(OutboxMessage::MessageId)
                .unique()
                .to_owned(),
            // The relay's scan: unpublished rows in id order.
            Index::create()
                .name("ix_outbox_message_pending")
                .col(OutboxMessage::PublishedAt)
                .col(OutboxMessage::Id)
                .to_owned(),
            // Per-key ordering: "is an earlier row of this key unpublished?".
            Index::create()
                .name("ix_outbox_message_ordering_key")
                .col(OutboxMessage::OrderingKey)
                .col(OutboxMessage::Id)
                .to_owned(),
        ];
        // By name only: 000008 makes two of them partial on PostgreSQL and
        // SQLite, and a second run must leave those as they are.
        for index in indexes {
            create_index_if_missing(manager, OutboxMessage::Table, index).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(OutboxMessage::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
