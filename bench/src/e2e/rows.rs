//! The table's rows: the databases they run on, each opened fresh for the
//! run, and how each row runs on them.

use anyhow::{Context, Result};
use migration::MigratorTrait;
use sea_orm::DatabaseConnection;

use super::SLOW_FLUSH_US;
use crate::pg::{self, PgServer};
use crate::report::Report;

/// The SQLite database of the SQLite rows, in `dir`, migrated and with the
/// ledger's tables: the same schema the PostgreSQL rows get from `pg.fresh`.
pub(super) async fn open_sqlite(dir: &std::path::Path) -> Result<DatabaseConnection> {
    let sqlite = service::db::connect(
        &format!("sqlite://{}?mode=rwc", dir.join("e2e.db").display()),
        16,
    )
    .await?;
    migration::Migrator::up(&sqlite, None).await?;
    testkit::ledger::create_tables(&sqlite).await?;
    Ok(sqlite)
}

/// A fresh PostgreSQL database whose sessions wait [`SLOW_FLUSH_US`] per
/// WAL flush, for the slow-flush rows; the flush it measured goes into
/// `report`'s setup, since those rows mean little without it.
pub(super) async fn open_slow_flush(
    pg: &mut PgServer,
    report: &mut Report,
) -> Result<DatabaseConnection> {
    // `commit_siblings = 0`: every flush waits, not only those with five
    // other transactions open.
    let (_, slow_url) = pg.fresh("e2eslow").await?;
    let slow_db = service::db::connect(
        &format!(
            "{slow_url}?options%5Bcommit_delay%5D={SLOW_FLUSH_US}&options%5Bcommit_siblings%5D=0"
        ),
        32,
    )
    .await
    .context("connecting with commit_delay set (the slow-flush rows need a superuser)")?;
    let slow_wait = pg::flush_wait_ms(&slow_db).await?;
    report.setup(
        "slow flush",
        format!(
            "rows so named run on a database whose sessions set commit_delay = {SLOW_FLUSH_US} us and commit_siblings = 0, as on storage where a flush takes {} ms: a commit's WAL flush {slow_wait:.3} ms, measured as on the versions line; commits that arrive during a flush share the next one",
            f64::from(SLOW_FLUSH_US) / 1_000.0
        ),
    );
    Ok(slow_db)
}

/// A row of the table: its label, the database it runs on, the WAL relay's
/// database URL (`None` for table mode) and `INBOX_BATCH` (`None` for its
/// default).
pub(super) type RowPlan<'a> = (
    &'static str,
    DatabaseConnection,
    Option<&'a str>,
    Option<usize>,
);

/// The rows that drain a backlog: each database with `INBOX_BATCH` from
/// one commit per message up, so the table shows what group commit buys
/// where commits are cheap and where a flush is slow.
pub(super) fn backlog_rows<'a>(
    sqlite: &DatabaseConnection,
    pg_db: &DatabaseConnection,
    wal_db: DatabaseConnection,
    wal_url: &'a str,
    slow_db: DatabaseConnection,
) -> [RowPlan<'a>; 11] {
    [
        (
            "SQLite, one commit per message (INBOX_BATCH = 1)",
            sqlite.clone(),
            None,
            Some(1),
        ),
        ("SQLite", sqlite.clone(), None, None),
        (
            "PostgreSQL, one commit per message (INBOX_BATCH = 1)",
            pg_db.clone(),
            None,
            Some(1),
        ),
        ("PostgreSQL", pg_db.clone(), None, None),
        (
            "PostgreSQL, batches of up to 4 (INBOX_BATCH = 4)",
            pg_db.clone(),
            None,
            Some(4),
        ),
        (
            "PostgreSQL, batches of up to 8 (INBOX_BATCH = 8)",
            pg_db.clone(),
            None,
            Some(8),
        ),
        (
            "PostgreSQL, WAL outbox (outbox_mode = wal)",
            wal_db,
            Some(wal_url),
            None,
        ),
        (
            "PostgreSQL, slow flush, one commit per message (INBOX_BATCH = 1)",
            slow_db.clone(),
            None,
            Some(1),
        ),
        ("PostgreSQL, slow flush", slow_db.clone(), None, None),
        (
            "PostgreSQL, slow flush, batches of up to 4 (INBOX_BATCH = 4)",
            slow_db.clone(),
            None,
            Some(4),
        ),
        (
            "PostgreSQL, slow flush, batches of up to 8 (INBOX_BATCH = 8)",
            slow_db,
            None,
            Some(8),
        ),
    ]
}

/// The rows paced at [`PACED_PER_S`](super::PACED_PER_S): they measure a
/// message's delay, where the backlog rows measure what a path drains.
pub(super) fn steady_rows<'a>(
    sqlite: DatabaseConnection,
    pg_db: DatabaseConnection,
) -> [RowPlan<'a>; 4] {
    // The same paths at a steady 1,000 requests a second, far below what
    // they drain: what group commit costs a message's delay when there is
    // little to batch.
    [
        (
            "SQLite, 1,000/s, one commit per message (INBOX_BATCH = 1)",
            sqlite.clone(),
            None,
            Some(1),
        ),
        ("SQLite, 1,000/s", sqlite, None, None),
        (
            "PostgreSQL, 1,000/s, one commit per message (INBOX_BATCH = 1)",
            pg_db.clone(),
            None,
            Some(1),
        ),
        ("PostgreSQL, 1,000/s", pg_db, None, None),
    ]
}
