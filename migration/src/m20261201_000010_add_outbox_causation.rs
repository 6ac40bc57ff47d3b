//! Causation and correlation on outbox rows: which message (and consumer)
//! caused an event, and the conversation it belongs to, so an operator can
//! follow a message's journey from one service to the next.

use crate::columns::{
    CONSUMER_LEN, MESSAGE_ID_LEN, add_column_if_missing, bounded, create_index_if_missing,
    drop_column_if_present, drop_index_if_present,
};
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum OutboxMessage {
    Table,
    CausationId,
    CausationConsumer,
    CorrelationId,
}

/// The indexes, each on one of the new columns.
const INDEXES: [(&str, OutboxMessage); 2] = [
    ("ix_outbox_message_causation_id", OutboxMessage::CausationId),
    (
        "ix_outbox_message_correlation_id",
        OutboxMessage::CorrelationId,
    ),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// Each column and index only if missing: a run stopped on MySQL, where
    /// DDL commits as it goes, keeps what it made.
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite can add only one column per ALTER TABLE.
        for column in [
            bounded(OutboxMessage::CausationId, MESSAGE_ID_LEN, true),
            bounded(OutboxMessage::CausationConsumer, CONSUMER_LEN, true),
            bounded(OutboxMessage::CorrelationId, MESSAGE_ID_LEN, true),
        ] {
            add_column_if_missing(manager, OutboxMessage::Table, column).await?;
        }
        for (name, column) in INDEXES {
            let index = Index::create().name(name).col(column).to_owned();
            create_index_if_missing(manager, OutboxMessage::Table, index).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (name, _) in INDEXES {
            drop_index_if_present(manager, OutboxMessage::Table, name).await?;
        }
        for column in [
            OutboxMessage::CausationId,
            OutboxMessage::CausationConsumer,
            OutboxMessage::CorrelationId,
        ] {
            drop_column_if_present(manager, OutboxMessage::Table, column).await?;
        }
        Ok(())
    }
}
