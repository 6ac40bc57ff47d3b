//! Causation and correlation on outbox rows: which message (and consumer)
//! caused an event, and the conversation it belongs to, so an operator can
//! follow a message's journey from one service to the next.

use crate::columns::{CONSUMER_LEN, MESSAGE_ID_LEN, bounded};
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

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite can add only one column per ALTER TABLE.
        for column in [
            bounded(OutboxMessage::CausationId, MESSAGE_ID_LEN, true),
            bounded(OutboxMessage::CausationConsumer, CONSUMER_LEN, true),
            bounded(OutboxMessage::CorrelationId, MESSAGE_ID_LEN, true),
        ] {
            let mut column = column;
            manager
                .alter_table(
                    Table::alter()
                        .table(OutboxMessage::Table)
                        .add_column(&mut column)
                        .to_owned(),
                )
                .await?;
        }
        for (name, column) in [
            ("ix_outbox_message_causation_id", OutboxMessage::CausationId),
            (
                "ix_outbox_message_correlation_id",
                OutboxMessage::CorrelationId,
            ),
        ] {
            manager
                .create_index(
                    Index::create()
                        .name(name)
                        .table(OutboxMessage::Table)
                        .col(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for name in [
            "ix_outbox_message_causation_id",
            "ix_outbox_message_correlation_id",
        ] {
            manager
                .drop_index(
                    Index::drop()
                        .name(name)
                        .table(OutboxMessage::Table)
                        .to_owned(),
                )
                .await?;
        }
        for column in [
            OutboxMessage::CausationId,
            OutboxMessage::CausationConsumer,
            OutboxMessage::CorrelationId,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(OutboxMessage::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
