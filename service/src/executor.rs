//! Runs a whole unit of work in a transaction, and runs it again on a
//! transient failure.
//!
//! A failed transaction's state is never reused (docs/architecture.md, rule 7): every attempt
//! begins a new transaction and calls the unit from the start. Because the
//! executor owns begin and commit, units never open transactions themselves,
//! so there is no nested strategy for a retry to fight with.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use sea_orm::{
    AccessMode, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    IsolationLevel, SqliteTransactionMode, TransactionOptions, TransactionTrait,
};
use tokio::sync::Notify;

use crate::backoff::Backoff;
use crate::classify::{Failure, classify};
use crate::error::HandlerError;

/// How often and how patiently a unit is re-run after transient errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included. At least 1.
    pub max_attempts: u32,
    /// Backoff before the second attempt; doubles each time.
    pub base_delay: Duration,
    /// Upper bound for one backoff.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(500),
        }
    }
}

impl RetryPolicy {
    /// The pause before attempt `attempt + 1` (see [`Backoff`]).
    pub fn backoff(&self, attempt: u32) -> Duration {
        Backoff::new(self.base_delay, self.max_delay).delay(attempt)
    }
}

/// A unit of work. It is called once per attempt, each time with a fresh
/// transaction, so it must not keep state from an earlier attempt.
pub trait Unit<T>: Send + Sync {
    /// Runs the unit's statements on `txn`. The executor commits on `Ok`.
    fn run<'a>(&'a self, txn: &'a DatabaseTransaction) -> BoxFuture<'a, Result<T, HandlerError>>;

    /// True when the unit's first write is a unique marker (the inbox's
    /// units), so running it again after a commit that did happen fails on
    /// the marker instead of applying the work twice. Only such units are
    /// re-run when the connection is lost during `COMMIT`; for the others
    /// that loss is [`HandlerError::CommitUnknown`].
    fn guarded_by_marker(&self) -> bool {
        false
    }

    /// Sets `savepoint` on `txn` and runs the unit there (a batch's unit,
    /// [`crate::group`]). A unit whose first statement can carry the
    /// savepoint's statement sends both in one round trip instead.
    fn run_after_savepoint<'a>(
        &'a self,
        txn: &'a DatabaseTransaction,
        savepoint: &'a Savepoint,
    ) -> BoxFuture<'a, Result<T, HandlerError>> {
        Box::pin(async move {
            txn.execute_unprepared(&savepoint.statement()).await?;
            self.run(txn).await
        })
    }
}

/// The savepoint a batch's unit runs under ([`crate::group`]), with what
/// the batch runs just before it: on PostgreSQL, the batch's isolation
/// level before its first unit and a reset of what the unit before left
/// set for the rest of the transaction before the others. Sent in one
/// round trip with the savepoint, so they cost none of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Savepoint {
    name: String,
    prelude: Option<String>,
}

impl Savepoint {
    /// The savepoint `name`, made after the statements of `prelude` (if any).
    pub(crate) fn new(name: String, prelude: Option<String>) -> Self {
        Self { name, prelude }
    }

    /// Its name, for `ROLLBACK TO`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The statements that make it: the prelude, then `SAVEPOINT`. The
    /// text is the platform's own (no value of a message's in it).
    pub fn statement(&self) -> String {
        match &self.prelude {
            Some(prelude) => format!("{prelude}; SAVEPOINT {}", self.name),
            None => format!("SAVEPOINT {}", self.name),
        }
    }
}

impl<T, F> Unit<T> for F
where
    F: for<'a> Fn(&'a DatabaseTransaction) -> BoxFuture<'a, Result<T, HandlerError>> + Send + Sync,
{
    fn run<'a>(&'a self, txn: &'a DatabaseTransaction) -> BoxFuture<'a, Result<T, HandlerError>> {
        self(txn)
    }
}

/// Lets the compiler see a closure as a [`Unit`]: closures only get the
/// higher-ranked signature `for<'a> Fn(&'a DatabaseTransaction) -> BoxFuture<'a, _>`
/// when they are written directly where that bound is expected.
pub fn unit<T, F>(f: F) -> F
where
    F: for<'a> Fn(&'a DatabaseTransaction) -> BoxFuture<'a, Result<T, HandlerError>> + Send + Sync,
{
    f
}

/// Runs units of work against one database with a retry policy.
#[derive(Debug, Clone)]
pub struct Executor {
    db: DatabaseConnection,
    policy: RetryPolicy,
    options: TransactionOptions,
    committed: Option<Arc<Notify>>,
}

impl Executor {
    /// An executor with the default policy. On SQLite transactions begin
    /// `IMMEDIATE`, so the write lock is taken (waiting on the busy timeout) at
    /// `BEGIN` instead of failing later on a read-to-write upgrade.
    pub fn new(db: DatabaseConnection) -> Self {
        Self {
            db,
            policy: RetryPolicy::default(),
            options: crate::db::BEGIN_IMMEDIATE,
            committed: None,
        }
    }

    /// Replaces the retry policy.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets the isolation level (ignored by SQLite).
    pub fn with_isolation(mut self, level: IsolationLevel) -> Self {
        self.options.isolation_level = Some(level);
        self
    }

    /// Sets the access mode (ignored by SQLite).
    pub fn with_access_mode(mut self, mode: AccessMode) -> Self {
        self.options.access_mode = Some(mode);
        self
    }

    /// Sets how SQLite transactions begin. `Deferred` lets readers run in
    /// parallel but may fail with `SQLITE_BUSY` on the first write, which the
    /// executor then retries.
    pub fn with_sqlite_mode(mut self, mode: SqliteTransactionMode) -> Self {
        self.options.sqlite_transaction_mode = Some(mode);
        self
    }

    /// Wakes `signal` after every successful commit, so an outbox relay in the
    /// same process can publish right away instead of waiting for its poll.
    pub fn with_commit_signal(mut self, signal: Arc<Notify>) -> Self {
        self.committed = Some(signal);
        self
    }

    /// The connection the executor runs on.
    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// The backend of that connection.
    pub fn backend(&self) -> DbBackend {
        self.db.get_database_backend()
    }

    /// Runs `unit` to commit, re-running it in a new transaction after a
    /// transient error (serialization failure, deadlock, SQLite busy, lost
    /// connection) until the policy's attempt limit.
    ///
    /// A connection lost during `COMMIT` is different: the transaction may
    /// have committed. A unit guarded by an inbox marker is re-run (the
    /// marker turns a committed first run into a duplicate); any other unit
    /// is not, and the caller gets [`HandlerError::CommitUnknown`] to resolve
    /// by its own means (look the effect up, or make the unit idempotent).
    ///
    /// # Errors
    /// The unit's own error, a non-transient database error,
    /// [`HandlerError::CommitUnknown`], or the last transient error once the
    /// attempts are used up. A panic in the unit is
    /// caught and returned as [`HandlerError::Panicked`]; its transaction is
    /// rolled back.
    pub async fn run<T, U>(&self, unit: &U) -> Result<T, HandlerError>
    where
        U: Unit<T> + ?Sized,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.attempt(unit).await {
                Ok(value) => {
                    self.notify_committed();
                    return Ok(value);
                }
                Err(HandlerError::Database(err)) => match classify(&err) {
                    // A resource failure (a lock timeout) may clear within
                    // the unit's few retries; a longer one is the caller's to
                    // wait out.
                    Failure::Transient { reason } | Failure::Resource { reason }
                        if attempt < self.policy.max_attempts =>
                    {
                        metrics::counter!("seawall_executor_retries_total", "reason" => reason)
                            .increment(1);
                        let pause = self.policy.backoff(attempt);
                        tracing::debug!(attempt, reason, ?pause, error = %err, "transient database error; re-running the unit");
                        tokio::time::sleep(pause).await;
                    }
                    Failure::Transient { reason } | Failure::Resource { reason } => {
                        // One series, no reason label (the log line has
                        // it): started at 0, it is an increase at the first
                        // exhaustion, whatever the reason.
                        metrics::counter!("seawall_executor_exhausted_total").increment(1);
                        tracing::warn!(attempt, reason, error = %err, "transient database error; attempts used up");
                        return Err(HandlerError::Database(err));
                    }
                    _ => return Err(HandlerError::Database(err)),
                },
                Err(other) => return Err(other),
            }
        }
    }

    /// The options of a transaction that commits several units at once
    /// (see [`crate::group`]): READ COMMITTED, so a unit that joins late
    /// sees what other transactions committed before it, as its own
    /// transaction would have; `None` when the executor asks for a stricter
    /// level, which a shared transaction cannot give each unit. On MySQL
    /// the level is set here (before `BEGIN`); on PostgreSQL the batch sets
    /// it with its first unit's savepoint, sparing a round trip.
    pub(crate) fn batch_options(&self) -> Option<TransactionOptions> {
        match self.options.isolation_level {
            Some(IsolationLevel::RepeatableRead | IsolationLevel::Serializable) => None,
            level => {
                let mut options = self.options;
                if self.backend() == DbBackend::MySql && level.is_none() {
                    options.isolation_level = Some(IsolationLevel::ReadCommitted);
                }
                Some(options)
            }
        }
    }

    /// Wakes the commit signal's listener (see
    /// [`Executor::with_commit_signal`]).
    pub(crate) fn notify_committed(&self) {
        if let Some(signal) = &self.committed {
            signal.notify_one();
        }
    }

    async fn attempt<T, U>(&self, unit: &U) -> Result<T, HandlerError>
    where
        U: Unit<T> + ?Sized,
    {
        let txn = self.db.begin_with_options(self.options).await?;
        let outcome = AssertUnwindSafe(unit.run(&txn)).catch_unwind().await;
        match outcome {
            Ok(Ok(value)) => match txn.commit().await {
                Ok(()) => Ok(value),
                Err(err) if crate::classify::is_outage(&err) && !unit.guarded_by_marker() => {
                    Err(HandlerError::CommitUnknown(err))
                }
                Err(err) => Err(err.into()),
            },
            Ok(Err(err)) => {
                rollback(txn).await;
                Err(err)
            }
            Err(panic) => {
                rollback(txn).await;
                Err(HandlerError::Panicked(panic_message(panic.as_ref())))
            }
        }
    }
}

async fn rollback(txn: DatabaseTransaction) {
    if let Err(err) = txn.rollback().await {
        // The connection is gone or the transaction already aborted: nothing
        // was committed either way, and the pool discards broken connections.
        tracing::debug!(error = %err, "rollback failed");
    }
}

/// The text of a caught panic's payload, for the error that reports it.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Turns a database error into a unit error; lets units use `?` on SeaORM calls.
impl From<DbErr> for HandlerError {
    fn from(err: DbErr) -> Self {
        HandlerError::Database(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_stays_bounded() {
        let policy = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(100),
        };
        for attempt in 1..40 {
            let d = policy.backoff(attempt);
            assert!(d <= policy.max_delay, "attempt {attempt}: {d:?}");
        }
        assert!(policy.backoff(1) >= Duration::from_millis(5));
        assert!(policy.backoff(6) >= Duration::from_millis(50));
    }
}
