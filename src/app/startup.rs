//! Start-up steps that wait out a database or a broker that cannot answer
//! yet (a failover, a restart, a leader election) instead of exiting into
//! a supervisor's restart loop.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::Result;
use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;

use super::connecting_to;
use crate::config::Migrations;

/// What start-up is doing now, for the log line of a signal that
/// interrupts it (see [`until_stopped`]). One per process: start-up runs
/// once, and only this line reads it.
static STEP: Mutex<String> = Mutex::new(String::new());

/// Notes (and logs, at `info`) that start-up is now doing `what`.
pub(super) fn now_doing(what: &str) {
    if let Ok(mut step) = STEP.lock() {
        if *step == what {
            return;
        }
        what.clone_into(&mut step);
    }
    tracing::info!(step = what, "starting up");
}

/// What start-up was doing last (see [`now_doing`]).
fn current_step() -> String {
    STEP.lock()
        .map(|s| s.clone())
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect()
}

/// Runs a start-up `work` (connecting, waiting for a server, migrating)
/// until it ends or `stop` is cancelled. A start-up can wait minutes for a
/// database, JetStream or a migration job; a SIGTERM meanwhile (a rollout,
/// a scale-down, a node drain) must end the process now, not at the end of
/// the wait or of Kubernetes' grace period. Dropping `work` half-way is
/// safe: a PostgreSQL or SQLite migration rolls back with its transaction,
/// a MySQL one applies again step by step (see `migration::apply`).
///
/// `None` when stopped, after a warning naming what was interrupted.
///
/// # Errors
/// `work`'s own error.
pub async fn until_stopped<T>(
    stop: &CancellationToken,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<Option<T>> {
    tokio::select! {
        biased;
        () = stop.cancelled() => {
            tracing::warn!(
                interrupted = %current_step(),
                "stopped by a signal during start-up"
            );
            Ok(None)
        }
        done = work => done.map(Some),
    }
}

/// Makes sure the schema this release needs is in place, as `mode` says:
/// applies the pending migrations, or waits for `seawall migrate` (a
/// migration job) to. Migrations of a newer release are expected (a
/// rolling upgrade, a rollback): logged and counted
/// (`seawall_schema_unknown_migrations`), not refused.
///
/// # Errors
/// A migration failing, or the database unable to answer (see
/// [`wait_out_database`]).
pub(super) async fn ensure_schema(mode: Migrations, db: &DatabaseConnection) -> Result<()> {
    let status = match mode {
        Migrations::Apply => {
            wait_out_database("applying migrations", || migration::apply(db)).await?
        }
        Migrations::Wait => wait_for_migrations(db).await?,
    };
    report_unknown(&status);
    Ok(())
}

/// What start-up says it does while it waits for the migration job.
const WAITING_FOR_THE_JOB: &str = "waiting for the migration job (seawall migrate)";

/// How often a process waiting for a migration job looks again.
const MIGRATIONS_POLL: Duration = Duration::from_secs(1);

/// Waits until every migration this release needs is applied, by someone
/// else; as long as it takes (a long migration job), logging what it waits
/// for whenever that changes. A pod's `startupProbe` bounds the wait, and a
/// signal ends it (see [`until_stopped`]).
async fn wait_for_migrations(db: &DatabaseConnection) -> Result<migration::Status> {
    let mut told: Option<Vec<String>> = None;
    loop {
        let status = wait_out_database(WAITING_FOR_THE_JOB, || migration::status(db)).await?;
        if status.pending.is_empty() {
            return Ok(status);
        }
        if told.as_ref() != Some(&status.pending) {
            tracing::warn!(
                pending = %status.pending.join(", "),
                "waiting for migrations this release needs; run `seawall migrate` (the migration job) or set SEAWALL_MIGRATIONS=apply"
            );
            told = Some(status.pending);
        }
        tokio::time::sleep(MIGRATIONS_POLL).await;
    }
}

/// Logs, once per start-up, the migrations the database holds that this
/// release does not know, and exports how many there are.
pub fn report_unknown(status: &migration::Status) {
    metrics::gauge!("seawall_schema_unknown_migrations").set(status.unknown.len() as f64);
    if !status.unknown.is_empty() {
        tracing::warn!(
            migrations = %status.unknown.join(", "),
            "the database holds migrations this release does not know (a newer release's); running beside them, as docs/operations.md's upgrade rule allows"
        );
    }
}

/// How long a starting process waits for a database that is down or
/// changing hands: well past a failover (about 15 s with the reference
/// cluster's settings), short enough that a wrong address is reported
/// within a minute.
const START_UP_DATABASE_WAIT: Duration = Duration::from_secs(60);

/// [`connect_db`](super::connect_db) for a long-running process, waiting out an outage.
///
/// A process restarted during a failover meets a proxy with no server
/// behind it, which accepts connections and closes them. Exiting then
/// would turn a 15 s failover into a supervisor's restart loop with
/// growing pauses, so the connection is tried as [`wait_out_database`]
/// tells: an outage (a refused, closed or unanswered connection, and also
/// what cannot be told from one, such as a host name that does not resolve
/// yet or a TLS handshake that fails) or a server short of a resource is
/// retried; any other error (a bad password, an unknown database) stops
/// start-up at once.
///
/// # Errors
/// The database answers with an error, or is still unreachable after the wait.
pub async fn connect_db_waiting(
    url: &str,
    max: u32,
    sqlite: service::db::SqliteOptions,
) -> Result<DatabaseConnection> {
    wait_out_database(&connecting_to(url), || {
        service::db::connect_with(url, max, sqlite)
    })
    .await
}

/// A set-up error that can tell JetStream being unable to answer now from
/// JetStream refusing.
pub(super) trait Unavailable: std::error::Error + Send + Sync + 'static {
    /// Whether JetStream could not answer now.
    fn unavailable(&self) -> bool;
}

impl Unavailable for worker::StreamError {
    fn unavailable(&self) -> bool {
        self.is_unavailable()
    }
}

impl Unavailable for worker::consumer::ConsumerError {
    fn unavailable(&self) -> bool {
        self.is_unavailable()
    }
}

/// Runs the JetStream set-up `step` (the stream, the consumers) until
/// JetStream answers it, for up to [`START_UP_DATABASE_WAIT`]: a process
/// (re)started while a NATS node is down or a leader is being elected meets
/// timeouts and "no responders" for some seconds, and exiting into its
/// supervisor's restart loop then would only start it again into the same
/// wait. An answer that refuses (a bad configuration) stops start-up at
/// once.
///
/// # Errors
/// The step's error when JetStream refused, or still could not answer when
/// the wait ran out.
pub(super) async fn wait_out_broker<T, E, F, Fut>(what: &str, step: F) -> Result<T>
where
    E: Unavailable,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    retry_at_start_up(what, "JetStream cannot answer yet", E::unavailable, step)
        .await
        .map_err(|(err, gave_up)| {
            let err = anyhow::Error::new(err);
            if gave_up {
                err.context(format!(
                    "JetStream still could not answer after {} s",
                    START_UP_DATABASE_WAIT.as_secs()
                ))
            } else {
                err
            }
        })
}

/// Runs `step` until it succeeds or fails with an error `waitable` does not
/// accept, retrying with backoff (0.2 s doubling to 5 s, each attempt's
/// error logged) until [`START_UP_DATABASE_WAIT`] has passed. The deadline
/// decides only whether another attempt starts; a running attempt is never
/// cut off. The error comes back with whether the wait ran out.
async fn retry_at_start_up<T, E, F, Fut>(
    what: &str,
    waiting: &str,
    waitable: impl Fn(&E) -> bool,
    mut step: F,
) -> Result<T, (E, bool)>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    now_doing(what);
    let deadline = tokio::time::Instant::now() + START_UP_DATABASE_WAIT;
    let backoff = service::Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    let mut failures = 0;
    loop {
        let err = match step().await {
            Ok(done) => return Ok(done),
            Err(err) if waitable(&err) => err,
            Err(err) => return Err((err, false)),
        };
        failures += 1;
        let pause = backoff
            .delay(failures)
            .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        if pause.is_zero() {
            return Err((err, true));
        }
        tracing::warn!(
            error = %err,
            attempt = failures,
            step = what,
            "{waiting}; waiting for it before starting"
        );
        tokio::time::sleep(pause).await;
    }
}

/// Runs a start-up step against the database (connecting, applying
/// migrations), retrying it while the database cannot do it yet.
///
/// A process restarted by its supervisor during a failover, a read-only
/// window (a disk filling up, an operator's `default_transaction_read_only`)
/// or a lock storm would otherwise exit at its first statement and be
/// restarted again and again with growing pauses, coming back long after
/// the database has. So an error that is the database's (an outage, a
/// resource failure, or a transient one such as a deadlock or a busy SQLite
/// file: [`service::classify::Failure::Transient`] and `Resource`) is
/// logged and the step retried with backoff until [`START_UP_DATABASE_WAIT`]
/// has passed; an error of the request itself (a bad password, a migration
/// that does not apply) stops start-up at once. The deadline decides only
/// whether another attempt starts: an attempt that is running (a migration
/// rewriting a large table) is never cut off, since a migration dropped
/// half-way would be repeated, and dropped again, at every restart. A
/// connection attempt is bounded by the pool's own acquire timeout.
///
/// # Errors
/// The step failing for a reason of its own, or the database still unable
/// to do it after the wait; either names `what`.
pub async fn wait_out_database<T, E, F, Fut>(what: &str, step: F) -> Result<T>
where
    E: DatabaseStepError,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    use service::classify::{Failure, classify};
    let waitable = |err: &E| {
        err.database_error().is_some_and(|err| {
            matches!(
                classify(err),
                Failure::Transient { .. } | Failure::Resource { .. }
            )
        })
    };
    retry_at_start_up(what, "the database cannot do this yet", waitable, step)
        .await
        .map_err(|(err, gave_up)| {
            let context = if gave_up {
                format!(
                    "{what}: the database still could not do it after {} s",
                    START_UP_DATABASE_WAIT.as_secs()
                )
            } else {
                what.to_owned()
            };
            anyhow::Error::new(err).context(context)
        })
}

/// The error of a start-up step that talks to the database: the step is
/// waited out (see [`wait_out_database`]) when the database's own error
/// underneath is one to wait for, and stops start-up otherwise (a slot of
/// another service, say).
pub trait DatabaseStepError: std::error::Error + Send + Sync + 'static {
    /// The database's error this one is, if it is one.
    fn database_error(&self) -> Option<&sea_orm::DbErr>;
}

impl DatabaseStepError for sea_orm::DbErr {
    fn database_error(&self) -> Option<&sea_orm::DbErr> {
        Some(self)
    }
}

impl DatabaseStepError for worker::relay::wal::SlotError {
    fn database_error(&self) -> Option<&sea_orm::DbErr> {
        match self {
            Self::Database(err) => Some(err),
            _ => None,
        }
    }
}
