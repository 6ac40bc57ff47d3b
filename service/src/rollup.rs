//! Per-minute throughput, counted where it happens.
//!
//! Grouping the rows of the last minutes by minute costs a scan of every one
//! of them (a million at 1,000 messages/s), on every dashboard refresh. So
//! the relay adds what it published, and the inbox and claims what they
//! processed, to `throughput_minute` in the transaction that already does
//! the work: the count commits or rolls back with it, and a re-run after a
//! lost `COMMIT` that ends as a duplicate counts nothing.
//!
//! Each database session adds to its own row of the minute (PostgreSQL's
//! backend pid, MySQL's connection id): a session runs one transaction at a
//! time, so no two transactions ever wait on the same counter, whatever the
//! rate or the number of processes. SQLite has one writer at a time anyway
//! and uses one row. The readers sum the sessions' rows of each minute.

use chrono::{DateTime, Duration, DurationRound, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, QueryFilter,
    QuerySelect, Statement,
};

use entity::throughput_minute::{self, Column};

/// What a minute counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tally {
    /// Outbox rows JetStream acknowledged.
    Published,
    /// Inbox markers recorded as processed (handled or claim completed).
    Processed,
}

impl Tally {
    /// The `tally` column's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::Processed => "processed",
        }
    }
}

/// The start of the minute `at` falls in.
pub fn minute_of(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(Duration::minutes(1)).unwrap_or(at)
}

/// Adds `n` to this session's count of `tally` for the minute of `at`, on
/// `db` (the transaction that did the work).
///
/// # Errors
/// The upsert's database error; the caller's transaction then rolls back
/// with it, as for any other statement of the unit.
pub async fn add<C: ConnectionTrait>(
    db: &C,
    tally: Tally,
    at: DateTime<Utc>,
    n: u64,
) -> Result<(), DbErr> {
    if n == 0 {
        return Ok(());
    }
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            "INSERT INTO throughput_minute (minute, tally, shard, n) VALUES ($1, $2, pg_backend_pid(), $3) \
             ON CONFLICT (minute, tally, shard) DO UPDATE SET n = throughput_minute.n + EXCLUDED.n"
        }
        DbBackend::MySql => {
            "INSERT INTO throughput_minute (minute, tally, shard, n) VALUES (?, ?, CONNECTION_ID(), ?) \
             ON DUPLICATE KEY UPDATE n = n + VALUES(n)"
        }
        _ => {
            "INSERT INTO throughput_minute (minute, tally, shard, n) VALUES (?, ?, 0, ?) \
             ON CONFLICT (minute, tally, shard) DO UPDATE SET n = n + excluded.n"
        }
    };
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    db.execute_raw(Statement::from_sql_and_values(
        backend,
        sql,
        [minute_of(at).into(), tally.as_str().into(), n.into()],
    ))
    .await?;
    Ok(())
}

/// Per-minute sums of every tally since `since` (inclusive), unordered:
/// (minute, tally, count).
///
/// # Errors
/// The query's database error.
pub async fn since(
    db: &DatabaseConnection,
    since: DateTime<Utc>,
) -> Result<Vec<(DateTime<Utc>, String, i64)>, DbErr> {
    // SUM of a bigint is numeric on PostgreSQL and decimal on MySQL.
    let sum = match db.get_database_backend() {
        DbBackend::Postgres => "CAST(SUM(n) AS BIGINT)",
        DbBackend::MySql => "CAST(SUM(n) AS SIGNED)",
        _ => "SUM(n)",
    };
    throughput_minute::Entity::find()
        .select_only()
        .column(Column::Minute)
        .column(Column::Tally)
        .column_as(Expr::cust(sum), "n")
        .filter(Column::Minute.gte(minute_of(since)))
        .group_by(Column::Minute)
        .group_by(Column::Tally)
        .into_tuple()
        .all(db)
        .await
}

/// How long per-minute counts are kept: a day, far more than the chart
/// shows, and at most a few hundred thousand small rows.
pub const KEEP: Duration = Duration::days(1);

/// Deletes counts of minutes older than [`KEEP`] before `now`; returns how
/// many rows went.
///
/// # Errors
/// The delete's database error.
pub async fn prune(db: &DatabaseConnection, now: DateTime<Utc>) -> Result<u64, DbErr> {
    Ok(throughput_minute::Entity::delete_many()
        .filter(Column::Minute.lt(minute_of(now - KEEP)))
        .exec(db)
        .await?
        .rows_affected)
}
