//! Two-phase claims keep the message they claim.
//!
//! A claim abandoned by a crash may be quarantined by the sweeper long after
//! the delivery is gone; the dead letter it writes must still carry the
//! subject and payload so a person can judge it and replay it.

use crate::columns::{NAME_LEN, bounded};
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum InboxMessage {
    Table,
    Subject,
    Payload,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let mut payload = ColumnDef::new(InboxMessage::Payload);
        match manager.get_database_backend() {
            DbBackend::MySql => payload.custom(Alias::new("longblob")),
            _ => payload.blob(),
        };
        payload.null();
        // SQLite can add only one column per ALTER TABLE.
        manager
            .alter_table(
                Table::alter()
                    .table(InboxMessage::Table)
                    .add_column(bounded(InboxMessage::Subject, NAME_LEN, true))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(InboxMessage::Table)
                    .add_column(payload)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(InboxMessage::Table)
                    .drop_column(InboxMessage::Payload)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(InboxMessage::Table)
                    .drop_column(InboxMessage::Subject)
                    .to_owned(),
            )
            .await
    }
}
