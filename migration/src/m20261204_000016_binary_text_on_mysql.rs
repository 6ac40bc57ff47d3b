//! Compares seawall's text columns byte for byte on MySQL and MariaDB, and
//! stores any Unicode character there.
//!
//! A table takes its database's default character set and collation, and
//! those are usually case-insensitive (`latin1_swedish_ci` without a
//! configuration file, `utf8mb4_general_ci` with Debian's). The inbox's
//! unique index on (message id, consumer) then held `Order-1` and `order-1`
//! for one message: the second was reported a duplicate and acknowledged,
//! never applied. Outside latin1 (an emoji, most scripts) an id could not
//! be stored at all. A binary collation that does not pad
//! (`utf8mb4_nopad_bin` on MariaDB, `utf8mb4_0900_bin` on MySQL 8) makes
//! the index compare what the producer sent, as PostgreSQL and SQLite do;
//! the padding `utf8mb4_bin` would still take `order-1 ` (a trailing space)
//! for `order-1`, and is used only where neither exists.
//!
//! The database's default becomes the same, so tables created after this
//! (the domain's) compare the same way; a domain's tables that exist
//! already keep theirs. Converting copies each table once, and
//! writes to it wait meanwhile: on a large outbox or inbox, stop the
//! fleet and run `seawall migrate` on its own. A table already converted
//! is skipped, so a run that failed half-way resumes. PostgreSQL and SQLite are untouched.

use sea_orm::{ConnectionTrait, DbBackend, Statement};
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The platform's tables; a domain's tables are its own to declare
/// ([`crate::columns::binary_text`]).
const TABLES: [&str; 6] = [
    "inbox_message",
    "outbox_message",
    "dead_letter",
    "throughput_minute",
    "wal_relay_position",
    "wal_slot_loss",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// Converts the platform's tables, and sets the database's default, so
    /// that tables created later compare the same way.
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        let db = manager.get_connection();
        let collation = nopad_binary(db).await?;
        db.execute_unprepared(&format!(
            "ALTER DATABASE CHARACTER SET utf8mb4 COLLATE {collation}"
        ))
        .await?;
        for table in TABLES {
            let current = db
                .query_one_raw(Statement::from_sql_and_values(
                    DbBackend::MySql,
                    "SELECT TABLE_COLLATION AS c FROM information_schema.TABLES \
                     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                    [table.into()],
                ))
                .await?
                .map(|row| row.try_get::<Option<String>>("", "c"))
                .transpose()?
                .flatten();
            if current.as_deref() == Some(collation.as_str()) {
                continue;
            }
            db.execute_unprepared(&format!(
                "ALTER TABLE `{table}` CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}"
            ))
            .await?;
        }
        Ok(())
    }

    /// Nothing to undo: the collation before is not recorded, and going
    /// back to a case-insensitive one could not hold ids that differ only
    /// in case.
    async fn down(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
        Ok(())
    }
}

/// The server's binary `utf8mb4` collation that does not pad, or the
/// padding `utf8mb4_bin` on a server that has none.
async fn nopad_binary<C: ConnectionTrait>(db: &C) -> Result<String, DbErr> {
    let found = db
        .query_one_raw(Statement::from_string(
            DbBackend::MySql,
            "SELECT COLLATION_NAME AS c FROM information_schema.COLLATIONS \
             WHERE COLLATION_NAME IN ('utf8mb4_nopad_bin', 'utf8mb4_0900_bin') \
             ORDER BY COLLATION_NAME LIMIT 1",
        ))
        .await?
        .map(|row| row.try_get::<String>("", "c"))
        .transpose()?;
    Ok(found.unwrap_or_else(|| "utf8mb4_bin".to_owned()))
}
