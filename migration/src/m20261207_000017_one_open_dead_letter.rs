//! At most one open dead letter per (consumer, message id).
//!
//! A copy of a message that reaches a second process while the first
//! still holds it (its ack wait ran out) fails there too; without this,
//! each process wrote a dead letter, and an operator replaying both applied
//! the message's failure twice over. A unique index now decides, as the
//! inbox's does: the second insert finds the open row and writes nothing
//! (the consumer acknowledges that copy). A row stops counting as open
//! once it is replayed; rows without a message id, and the WAL relay's own,
//! are not constrained.
//!
//! - PostgreSQL and SQLite: a partial unique index on (consumer,
//!   message_id) over open rows.
//! - MySQL and MariaDB, which have no partial indexes: a generated column
//!   holding the message id while the row is open (NULL otherwise, and
//!   NULLs do not collide), under a unique index with the consumer.
//!
//! Copies already stored are kept: all but the first of each open group
//! get `duplicate_of` (the id of that first row), which takes them out of
//! the index. The previous release works on this schema: it does not name
//! the new columns, and a second dead letter it would write fails on the
//! index, so it naks that copy (as for any failed dead-letter write) until
//! a process of this release acknowledges it.

use sea_orm::{ConnectionTrait, DbBackend};
use sea_orm_migration::prelude::*;

use crate::columns::{MESSAGE_ID_LEN, add_column_if_missing, drop_column_if_present};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum DeadLetter {
    Table,
    DuplicateOf,
    OpenMessageId,
}

/// The unique index over open dead letters.
const INDEX: &str = "ux_dead_letter_open";

/// Which rows are open, and so unique per (consumer, message id). The WAL
/// relay's own dead letters (consumer `wal-relay`: events it could not
/// publish) are not: two different events may carry one id there, and
/// each must keep its row.
const OPEN: &str = "replayed_at IS NULL AND duplicate_of IS NULL AND consumer <> 'wal-relay'";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// On one connection, in one transaction where the backend has
    /// transactional DDL: the marking and the index see the same rows.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_column_if_missing(
            manager,
            DeadLetter::Table,
            ColumnDef::new(DeadLetter::DuplicateOf)
                .big_integer()
                .null()
                .to_owned(),
        )
        .await?;
        let db = manager.get_connection();
        let backend = manager.get_database_backend();
        db.execute_unprepared(&mark_copies(backend)).await?;
        if backend == DbBackend::MySql {
            add_column_if_missing(
                manager,
                DeadLetter::Table,
                // No NULL / NOT NULL: MariaDB refuses either on a
                // generated column.
                ColumnDef::new(DeadLetter::OpenMessageId)
                    .string_len(MESSAGE_ID_LEN)
                    .extra(format!("AS (IF({OPEN}, message_id, NULL)) VIRTUAL"))
                    .to_owned(),
            )
            .await?;
            if !manager.has_index("dead_letter", INDEX).await? {
                db.execute_unprepared(&format!(
                    "CREATE UNIQUE INDEX {INDEX} ON dead_letter (consumer, open_message_id)"
                ))
                .await?;
            }
        } else {
            db.execute_unprepared(&format!(
                "CREATE UNIQUE INDEX IF NOT EXISTS {INDEX} ON dead_letter (consumer, message_id) \
                 WHERE {OPEN}"
            ))
            .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        crate::columns::drop_index_if_present(manager, DeadLetter::Table, INDEX).await?;
        drop_column_if_present(manager, DeadLetter::Table, DeadLetter::OpenMessageId).await?;
        drop_column_if_present(manager, DeadLetter::Table, DeadLetter::DuplicateOf).await
    }
}

/// Marks every open dead letter that has an earlier open one of its
/// (consumer, message id) as a copy of the earliest.
fn mark_copies(backend: DbBackend) -> String {
    let firsts = format!(
        "SELECT consumer, message_id, MIN(id) AS first FROM dead_letter \
         WHERE {OPEN} AND message_id IS NOT NULL \
         GROUP BY consumer, message_id HAVING COUNT(*) > 1"
    );
    match backend {
        // MySQL cannot name the updated table in a subquery of its own.
        DbBackend::MySql => format!(
            "UPDATE dead_letter d JOIN ({firsts}) f \
             ON d.consumer = f.consumer AND d.message_id = f.message_id \
             SET d.duplicate_of = f.first \
             WHERE d.replayed_at IS NULL AND d.duplicate_of IS NULL AND d.id > f.first"
        ),
        _ => format!(
            "UPDATE dead_letter SET duplicate_of = f.first FROM ({firsts}) AS f \
             WHERE dead_letter.consumer = f.consumer AND dead_letter.message_id = f.message_id \
             AND dead_letter.replayed_at IS NULL AND dead_letter.duplicate_of IS NULL \
             AND dead_letter.id > f.first"
        ),
    }
}
