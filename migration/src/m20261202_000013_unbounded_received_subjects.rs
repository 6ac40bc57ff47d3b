//! Subjects of received messages in unbounded text columns.
//!
//! A consumer records the subject of a message it dead-letters
//! (`dead_letter.subject`) or claims an effect for (`inbox_message.subject`).
//! Those subjects come from the broker, which accepts any length up to its
//! control line (4 KiB by default), not from seawall: a 300-byte subject in a
//! `varchar(255)` made the insert fail with a value-too-long error, the
//! message was nak'ed again and again, and neither a dead letter nor a claim
//! was ever written. Neither column is indexed, so `text` costs nothing.
//! The outbox's own subject stays bounded (it is indexed, and seawall checks
//! it when an event is recorded). SQLite does not enforce a `varchar`'s
//! length and needs no change.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let statements: &[&str] = match manager.get_database_backend() {
            DbBackend::Postgres => &[
                // Binary-coercible: no table rewrite.
                "ALTER TABLE dead_letter ALTER COLUMN subject TYPE text",
                "ALTER TABLE inbox_message ALTER COLUMN subject TYPE text",
            ],
            DbBackend::MySql => &[
                "ALTER TABLE dead_letter MODIFY subject TEXT NOT NULL",
                "ALTER TABLE inbox_message MODIFY subject TEXT NULL",
            ],
            _ => &[],
        };
        execute(manager, statements).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let statements: &[&str] = match manager.get_database_backend() {
            DbBackend::Postgres => &[
                "ALTER TABLE dead_letter ALTER COLUMN subject TYPE varchar(255)",
                "ALTER TABLE inbox_message ALTER COLUMN subject TYPE varchar(255)",
            ],
            DbBackend::MySql => &[
                "ALTER TABLE dead_letter MODIFY subject VARCHAR(255) NOT NULL",
                "ALTER TABLE inbox_message MODIFY subject VARCHAR(255) NULL",
            ],
            _ => &[],
        };
        execute(manager, statements).await
    }
}

/// Runs `statements` in order.
async fn execute(manager: &SchemaManager<'_>, statements: &[&str]) -> Result<(), DbErr> {
    let db = manager.get_connection();
    for sql in statements {
        db.execute_unprepared(sql).await?;
    }
    Ok(())
}
