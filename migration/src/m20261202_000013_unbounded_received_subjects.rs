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
use sea_orm_migration::sea_orm::{DbBackend, Statement};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        match manager.get_database_backend() {
            // Binary-coercible: no table rewrite, and nothing at all once
            // the column is `text`.
            DbBackend::Postgres => {
                execute(
                    manager,
                    &[
                        "ALTER TABLE dead_letter ALTER COLUMN subject TYPE text",
                        "ALTER TABLE inbox_message ALTER COLUMN subject TYPE text",
                    ],
                )
                .await
            }
            DbBackend::MySql => unbound_on_mysql(manager).await,
            _ => Ok(()),
        }
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

/// Makes each table's `subject` a `TEXT`, unless it is a text type already.
///
/// A run stopped between the two tables keeps the first one's (DDL commits
/// as it goes on MySQL), and `MODIFY` copies the whole table each time. And
/// a `TEXT` column that 000016 converted to `utf8mb4` from a narrower
/// character set (`latin1`, `utf8mb3`) came out a `MEDIUMTEXT` (MySQL
/// widens it to hold as many characters as before): a second `MODIFY`
/// would narrow it back.
async fn unbound_on_mysql(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    for (table, sql) in [
        (
            "dead_letter",
            "ALTER TABLE dead_letter MODIFY subject TEXT NOT NULL",
        ),
        (
            "inbox_message",
            "ALTER TABLE inbox_message MODIFY subject TEXT NULL",
        ),
    ] {
        if !subject_is_text(manager, table).await? {
            manager.get_connection().execute_unprepared(sql).await?;
        }
    }
    Ok(())
}

/// Whether `table.subject` is one of MySQL's text types. A missing column
/// is not, so that the `MODIFY` after says what is wrong.
async fn subject_is_text(manager: &SchemaManager<'_>, table: &str) -> Result<bool, DbErr> {
    manager
        .get_connection()
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::MySql,
            "SELECT COUNT(*) > 0 AS is_text FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'subject' \
             AND DATA_TYPE IN ('tinytext', 'text', 'mediumtext', 'longtext')",
            [table.into()],
        ))
        .await?
        .map_or(Ok(false), |row| row.try_get::<bool>("", "is_text"))
}

/// Runs `statements` in order.
async fn execute(manager: &SchemaManager<'_>, statements: &[&str]) -> Result<(), DbErr> {
    let db = manager.get_connection();
    for sql in statements {
        db.execute_unprepared(sql).await?;
    }
    Ok(())
}
