//! The inbox table and the unique index that decides races.

use crate::columns::{
    CONSUMER_LEN, MESSAGE_ID_LEN, NAME_LEN, bounded, create_index_if_missing, text, utc,
};
use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::{big_pk_auto, integer};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum InboxMessage {
    Table,
    Id,
    MessageId,
    Consumer,
    ReceivedAt,
    ProcessedAt,
    ClaimedBy,
    ClaimedAt,
    LeaseUntil,
    Attempts,
    Result,
    QuarantinedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(InboxMessage::Table)
                    .if_not_exists()
                    .col(big_pk_auto(InboxMessage::Id))
                    .col(bounded(InboxMessage::MessageId, MESSAGE_ID_LEN, false))
                    .col(bounded(InboxMessage::Consumer, CONSUMER_LEN, false))
                    .col(utc(db, InboxMessage::ReceivedAt, false))
                    .col(utc(db, InboxMessage::ProcessedAt, true))
                    .col(bounded(InboxMessage::ClaimedBy, NAME_LEN, true))
                    .col(utc(db, InboxMessage::ClaimedAt, true))
                    .col(utc(db, InboxMessage::LeaseUntil, true))
                    .col(integer(InboxMessage::Attempts).default(0))
                    .col(text(InboxMessage::Result, true))
                    .col(utc(db, InboxMessage::QuarantinedAt, true))
                    .to_owned(),
            )
            .await?;
        create_index_if_missing(
            manager,
            InboxMessage::Table,
            Index::create()
                .name("ix_inbox_message_id_consumer")
                .col(InboxMessage::MessageId)
                .col(InboxMessage::Consumer)
                .unique()
                .to_owned(),
        )
        .await?;
        // Retention pruning and the admin views walk the table by age.
        create_index_if_missing(
            manager,
            InboxMessage::Table,
            Index::create()
                .name("ix_inbox_message_processed_at")
                .col(InboxMessage::ProcessedAt)
                .to_owned(),
        )
        .await?;
        // The claim sweeper looks for open claims whose lease ran out.
        create_index_if_missing(
            manager,
            InboxMessage::Table,
            Index::create()
                .name("ix_inbox_message_lease_until")
                .col(InboxMessage::LeaseUntil)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(InboxMessage::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
