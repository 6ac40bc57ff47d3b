//! Two-phase claims keep the message they claim.
//!
//! A claim abandoned by a crash may be quarantined by the sweeper long after
//! the delivery is gone; the dead letter it writes must still carry the
//! subject and payload so a person can judge it and replay it.

use crate::columns::{NAME_LEN, add_column_if_missing, bounded, drop_column_if_present};
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
        // One statement per column (SQLite alters one at a time), each only
        // if missing: a run stopped on MySQL between the two keeps the first.
        add_column_if_missing(
            manager,
            InboxMessage::Table,
            bounded(InboxMessage::Subject, NAME_LEN, true),
        )
        .await?;
        add_column_if_missing(manager, InboxMessage::Table, payload).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_column_if_present(manager, InboxMessage::Table, InboxMessage::Payload).await?;
        drop_column_if_present(manager, InboxMessage::Table, InboxMessage::Subject).await
    }
}
