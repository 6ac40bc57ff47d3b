//! How far the admin API's read replica (`admin_database_url`) is behind.
//!
//! Lists and stats read from a replica so that operators can look while the
//! primary is busy or failing over; what they see is then as old as the
//! replica's replay, and the dashboard has to say how old.

use std::future::Future;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, FromQueryResult, Statement};
use serde::{Deserialize, Serialize};

/// How long a question for the primary may take on a page served from the
/// replica. A primary that is down holds a query for the pool's acquire
/// timeout (30 s), behind HAProxy until its connect timeout: without this
/// bound the replica would not keep the pages answering, which is its job.
pub const PRIMARY_PROBE: Duration = Duration::from_secs(2);

/// Runs `query` against the primary for a page served from the replica: its
/// answer, or `None` (logged, naming `what`) when it fails or takes longer
/// than [`PRIMARY_PROBE`].
pub async fn ask_primary<T>(
    what: &str,
    query: impl Future<Output = Result<T, DbErr>>,
) -> Option<T> {
    match tokio::time::timeout(PRIMARY_PROBE, query).await {
        Ok(Ok(answer)) => Some(answer),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "{what}: the primary cannot be read");
            None
        }
        Err(_) => {
            tracing::warn!("{what}: the primary did not answer within {PRIMARY_PROBE:?}");
            None
        }
    }
}

/// The read replica's state, as the dashboard shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, FromQueryResult)]
pub struct ReplicaStatus {
    /// The server still replays a primary's WAL. False once it has been
    /// promoted (or when the URL names a primary): the reads are then current.
    pub in_recovery: bool,
    /// Its WAL receiver is streaming from a primary: false when no receiver
    /// runs (the primary is down or unreachable, so nothing new arrives);
    /// `None` once promoted, or when the database role may not see the
    /// receiver (needs `pg_read_all_stats`).
    pub streaming: Option<bool>,
    /// Seconds between now and the commit time of the last transaction it
    /// replayed, or 0 when it has replayed all it received. While it is not
    /// streaming this stays 0 even as the primary moves on: look at
    /// `streaming` and `behind_bytes` too.
    pub lag_seconds: Option<f64>,
    /// WAL the primary has written that the replica has not replayed, in
    /// bytes; `None` when the primary cannot be asked (it is down).
    pub behind_bytes: Option<i64>,
}

/// Reads the state of the replica behind `reads`, comparing it with the
/// WAL position of `primary` when that answers. `None` off PostgreSQL.
///
/// # Errors
/// The replica's query failing (the primary's failing or hanging leaves
/// `behind_bytes` unset instead: that is the outage the replica is for).
pub async fn status<R: ConnectionTrait, P: ConnectionTrait>(
    reads: &R,
    primary: &P,
) -> Result<Option<ReplicaStatus>, DbErr> {
    if reads.get_database_backend() != DbBackend::Postgres {
        return Ok(None);
    }
    let primary_lsn = ask_primary(
        "replica status",
        primary.query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT pg_current_wal_lsn()::text AS lsn",
        )),
    )
    .await
    .flatten()
    .and_then(|row| row.try_get::<String>("", "lsn").ok());
    ReplicaStatus::find_by_statement(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT pg_is_in_recovery() AS in_recovery,
                CASE WHEN pg_is_in_recovery() THEN
                    (SELECT CASE WHEN count(*) = 0 THEN false ELSE bool_or(status = 'streaming') END
                     FROM pg_stat_wal_receiver)
                END AS streaming,
                CASE WHEN NOT pg_is_in_recovery() THEN 0
                     WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
                     ELSE GREATEST(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), 0)
                END::float8 AS lag_seconds,
                CASE WHEN $1::text IS NULL THEN NULL
                     WHEN NOT pg_is_in_recovery() THEN 0
                     ELSE GREATEST(pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_replay_lsn()), 0)
                END::bigint AS behind_bytes",
        [primary_lsn.into()],
    ))
    .one(reads)
    .await
}
