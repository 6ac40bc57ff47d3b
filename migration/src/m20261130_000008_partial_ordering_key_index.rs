//! Makes the ordering-key index partial (`WHERE ordering_key IS NOT NULL`) on
//! PostgreSQL and SQLite.
//!
//! Most outbox rows carry no ordering key, and a full index still gets an
//! entry for each of them on every insert and every "mark published" update
//! (the relay's hottest write). Only the per-key ordering check reads the
//! index, and it always asks for given keys, so the rows without one never
//! need to be in it. MySQL has no partial indexes and keeps the full one.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

const NAME: &str = "ix_outbox_message_ordering_key";

async fn recreate(manager: &SchemaManager<'_>, predicate: &str) -> Result<(), DbErr> {
    if manager.get_database_backend() == DbBackend::MySql {
        return Ok(());
    }
    let db = manager.get_connection();
    db.execute_unprepared(&format!("DROP INDEX IF EXISTS {NAME}"))
        .await?;
    db.execute_unprepared(&format!(
        "CREATE INDEX {NAME} ON outbox_message (ordering_key, id){predicate}"
    ))
    .await?;
    Ok(())
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// Drop and create on one connection, in one transaction (SQLite would
    /// otherwise run them on two pooled connections, the second of which
    /// may still see the old index), so the index is never missing either.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        recreate(manager, " WHERE ordering_key IS NOT NULL").await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        recreate(manager, "").await
    }
}
