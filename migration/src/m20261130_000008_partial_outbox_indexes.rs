//! Makes two outbox indexes partial on PostgreSQL and SQLite, so that writing
//! an event (the inbox's hot path) and marking it published (the relay's)
//! touch fewer index pages:
//! - `ix_outbox_message_ordering_key` only for rows with a key: most rows
//!   carry none, and the per-key ordering check only ever asks for given keys.
//! - `ix_outbox_message_pending` (`published_at, id`) only for published rows:
//!   retention and the throughput figures ask for published rows by time,
//!   while unpublished rows are found through `ix_outbox_message_unpublished`.
//!   A new row no longer gets an entry here until it is published.
//!
//! MySQL has no partial indexes and keeps the full ones.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// (name, columns, predicate of the partial index).
const INDEXES: &[(&str, &str, &str)] = &[
    (
        "ix_outbox_message_ordering_key",
        "ordering_key, id",
        "ordering_key IS NOT NULL",
    ),
    (
        "ix_outbox_message_pending",
        "published_at, id",
        "published_at IS NOT NULL",
    ),
];

async fn recreate(manager: &SchemaManager<'_>, partial: bool) -> Result<(), DbErr> {
    if manager.get_database_backend() == DbBackend::MySql {
        return Ok(());
    }
    let db = manager.get_connection();
    for (name, columns, predicate) in INDEXES {
        db.execute_unprepared(&format!("DROP INDEX IF EXISTS {name}"))
            .await?;
        let filter = if partial {
            format!(" WHERE {predicate}")
        } else {
            String::new()
        };
        db.execute_unprepared(&format!(
            "CREATE INDEX {name} ON outbox_message ({columns}){filter}"
        ))
        .await?;
    }
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
        recreate(manager, true).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        recreate(manager, false).await
    }
}
