//! Compares seawall's text columns byte for byte on MySQL and MariaDB, and
//! stores any Unicode character there.
//!
//! A table takes its database's default character set and collation, and
//! those are usually case-insensitive (`latin1_swedish_ci` without a
//! configuration file, `utf8mb4_general_ci` with Debian's). The inbox's
//! unique index on (message id, consumer) then held `Order-1` and `order-1`
//! for one message: the second was reported a duplicate and acknowledged,
//! never applied. Outside latin1 (an emoji, most scripts) an id could not
//! be stored at all. `utf8mb4_bin` makes the index compare what the
//! producer sent, as PostgreSQL and SQLite do.
//!
//! The database's default becomes the same, so tables created after this
//! (the domain's) compare the same way; a domain's tables that exist
//! already keep theirs. Converting rewrites each table once; on a large outbox or inbox, run
//! `seawall migrate` in a quiet hour. PostgreSQL and SQLite are untouched.

use sea_orm::DbBackend;
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The platform's tables; a domain's tables are its own to declare.
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
    /// that the domain's tables created after this (a fresh database runs
    /// the domain's migrations last) compare the same way.
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        let db = manager.get_connection();
        db.execute_unprepared("ALTER DATABASE CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
            .await?;
        for table in TABLES {
            db.execute_unprepared(&format!(
                "ALTER TABLE `{table}` CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
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
