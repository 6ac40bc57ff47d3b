//! Indexes that keep the admin API fast on big tables.
//!
//! The list pages walk rows newest first (`ORDER BY id DESC LIMIT n`) under a
//! filter. A filter that matches few rows (dead outbox rows, open claims)
//! would make that walk read the whole table, so those get partial indexes on
//! PostgreSQL and SQLite; MySQL, which has none, gets composite ones.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// (name, table, columns, partial-index predicate).
const INDEXES: &[(&str, &str, &str, Option<&str>)] = &[
    (
        "ix_outbox_message_subject",
        "outbox_message",
        "subject, id",
        None,
    ),
    (
        "ix_outbox_message_dead",
        "outbox_message",
        "id",
        Some("dead_at IS NOT NULL"),
    ),
    (
        "ix_outbox_message_unpublished",
        "outbox_message",
        "id",
        Some("published_at IS NULL"),
    ),
    (
        "ix_inbox_message_consumer",
        "inbox_message",
        "consumer, id",
        None,
    ),
    (
        "ix_inbox_message_open",
        "inbox_message",
        "id",
        Some("processed_at IS NULL"),
    ),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        let db = manager.get_connection();
        for &(name, table, columns, predicate) in INDEXES {
            // MySQL 8 has no `CREATE INDEX IF NOT EXISTS` (MariaDB has), and a
            // run stopped there half-way keeps the indexes it made.
            if backend == DbBackend::MySql && manager.has_index(table, name).await? {
                continue;
            }
            let sql = match (backend, predicate) {
                (DbBackend::MySql, Some(p)) => {
                    // No partial indexes: lead with the filtered column instead.
                    let column = p.split_whitespace().next().unwrap_or("id");
                    format!("CREATE INDEX {name} ON {table} ({column}, {columns})")
                }
                (DbBackend::MySql, None) => format!("CREATE INDEX {name} ON {table} ({columns})"),
                (_, Some(p)) => {
                    format!("CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns}) WHERE {p}")
                }
                (_, None) => format!("CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns})"),
            };
            db.execute_unprepared(&sql).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        let db = manager.get_connection();
        for &(name, table, _, _) in INDEXES {
            // MySQL 8 has no `DROP INDEX IF EXISTS` either.
            if backend == DbBackend::MySql && !manager.has_index(table, name).await? {
                continue;
            }
            let sql = match backend {
                DbBackend::MySql => format!("DROP INDEX {name} ON {table}"),
                _ => format!("DROP INDEX IF EXISTS {name}"),
            };
            db.execute_unprepared(&sql).await?;
        }
        Ok(())
    }
}
