//! Group commit: concurrent inbox units share one transaction, each under a
//! savepoint of its own, so a batch of messages costs one commit (one WAL
//! flush on a durable database) instead of one each.
//!
//! There is no batcher task and no waiting for a batch to fill. A unit
//! starts on the first of the first `ceil(lanes / batch size)` lanes whose
//! queue would not fill a batch, and joins the batch open there (or opens
//! one); units of a lane run one after another (they share a connection),
//! so a lane runs at once beside the first only when the load fills it:
//! batches grow with the load instead of spreading it thin. The
//! unit that finds nobody queued behind it, fills the batch, or finds it
//! open for [`PATIENCE`] commits it. A message arriving alone therefore
//! commits at once, as without batching. A unit queued longer than
//! [`PATIENCE`] (behind a slow handler) moves to the next lane, so slow
//! handlers run side by side as they do without batching; a fast unit that
//! shares a batch with a slow one waits for that one's handler, at most.
//!
//! - **One message's failure is its own.** A duplicate marker, a handler's
//!   rejection, failure or panic rolls back to the unit's savepoint; the
//!   others commit.
//! - **A batch that breaks falls back, message by message.** A unit that
//!   meets a transient, resource or connection error (but see below), a savepoint that
//!   cannot be rolled back to (MySQL rolls a deadlocked transaction back
//!   whole), a member cancelled mid-unit, and a failed or lost `COMMIT` end
//!   the batch without its work: every unit that had succeeded runs again
//!   alone, through the executor's retries. The inbox marker makes that safe
//!   when the lost `COMMIT` did commit (the re-run is a duplicate). The
//!   message that broke the batch is retried alone too, so it cannot hold
//!   the others back.
//! - **Nothing is acknowledged before its commit.** A unit's result is
//!   returned only once its batch committed (or once it ran alone), and the
//!   consumer acks after [`crate::Inbox::process`] returns.
//! - **A unit's transaction is as its own would be.** A batch's units see
//!   each other's writes, as later transactions would. A batch runs at READ
//!   COMMITTED on every backend, whatever the server's default (REPEATABLE
//!   READ would fix one snapshot for every unit that joins later and hide
//!   what other transactions committed meanwhile); an executor set to
//!   REPEATABLE READ or SERIALIZABLE does not batch. On PostgreSQL, what a
//!   unit set for the rest of the transaction (`SET LOCAL`,
//!   `set_config(.., true)`, `SET LOCAL ROLE`) is reset before the next unit
//!   and before the `COMMIT`, which therefore always runs with the
//!   session's `synchronous_commit`. What cannot be reset (a temporary
//!   table `ON COMMIT DROP`, an advisory lock held to the transaction's end)
//!   lasts to the batch's end: a consumer whose handler relies on those
//!   registers without batching.
//! - **A deadlock is the unit's own (PostgreSQL).** A unit that meets a
//!   deadlock, lock timeout or statement timeout rolls back to its
//!   savepoint, which PostgreSQL confines the error to; the batch goes on
//!   and that unit alone runs again, through the executor, after it.
//! - **One outbox insert per batch.** In table mode the events a batch's
//!   units record on its transaction are written in one multi-row insert
//!   (per 4 MiB of payloads) just before its `COMMIT`, with one table-mode
//!   guard, instead of one round trip or two per unit (`deferred`). A unit
//!   rolled back to its savepoint takes its events back out; an insert
//!   that fails fails the batch, and its units run alone. A handler does
//!   not find its own events in `outbox_message` before the commit.
//! - **A transaction that vanished is noticed.** Before `COMMIT` the batch
//!   releases its first unit's savepoint, which fails once the transaction
//!   was rolled back whole behind a handler that swallowed the error (an
//!   InnoDB deadlock, a full SQLite disk, a PostgreSQL error): every unit
//!   then runs again alone.
//!
//! ## States
//!
//! ```text
//!  a batch:
//!                       a unit breaks the transaction, or a member whose
//!                       unit ran in it is cancelled
//!  BEGIN ──► Open ─────────────────────────────────────────► Doomed ──► ROLLBACK
//!             │                                                        (its units
//!             │ closed by the unit that fills it, finds it open           run alone)
//!             │ for PATIENCE, or finds nobody waiting behind it
//!             ▼
//!        Committing ──► committed: each unit's result stands
//!                   └─► failed, or unknown (its closer cancelled): units run alone
//!
//!  a member (its `Seat`):
//!  Waiting ──► Seated ──► In(batch) ──► Done
//!  (queued     (holds the  (its unit runs,   (knows the end; dropped
//!   for a       lane's      then it waits     before this, the seat
//!   lane)       lock)       for the end)      dooms its batch first)
//! ```

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::FutureExt;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr};

mod deferred;
mod seat;

use deferred::Deferred;
pub(crate) use deferred::deferring;

use seat::{Fate, Seat, ended};
use tokio::sync::{Mutex, watch};

use crate::classify::{Failure, classify};
use crate::error::HandlerError;
use crate::executor::{Executor, Savepoint, Unit, panic_message};
use crate::rollup::{self, Tally};

/// How long a unit waits to join a lane's batch before it tries the next
/// lane, by default. Units of a lane run one after another, so a slow handler (one that
/// calls out, or sleeps) would hold every unit queued behind it; after this
/// they go where they can run, and slow work spreads over the lanes as it
/// did without batching. Fast units (a millisecond or less) rarely wait
/// this long, and so stay together in large batches.
const PATIENCE: Duration = Duration::from_millis(20);

/// Most units one batch may hold. On PostgreSQL each unit's savepoint is a
/// subtransaction, and a transaction with more than 64 of them overflows
/// the per-backend cache every other session's snapshot consults: from then
/// on their visibility checks look subtransactions up in `pg_subtrans`, a
/// slowdown for the whole server. Savepoints a unit's handler makes count
/// too, so the cap leaves room for some.
pub const MAX_BATCH: usize = 32;

/// On PostgreSQL, with a batch's first unit: the batch's isolation level
/// (see [`Executor::batch_options`]), whatever the server's or the role's
/// default. A later unit would otherwise read, under REPEATABLE READ, the
/// snapshot the first one took, and miss what was committed meanwhile.
const PG_READ_COMMITTED: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// On PostgreSQL, before every unit after the first and before the
/// batch's `COMMIT`: undoes what the unit before set for the rest of the
/// transaction (`SET LOCAL`, `set_config(.., true)`, `SET LOCAL ROLE`),
/// which releasing its savepoint would keep. Without it the next message's
/// handler would run as the tenant the last one chose, and a unit's
/// `SET LOCAL synchronous_commit = off` would make the whole batch's
/// commit non-durable. Settings return to the session's values (the
/// server's, database's, role's or connection's defaults).
const PG_RESET: &str = "RESET ALL; RESET ROLE";

/// How a unit that joined a batch ended.
pub enum Joined<T> {
    /// Its batch committed: this is its result (a failure rolled back to
    /// its savepoint).
    Settled(Result<T, HandlerError>),
    /// Its batch did not commit, or may not have, or its failure may be
    /// the batch's: run it alone.
    Alone,
}

/// Batches of units on a few lanes, each with at most one open batch.
/// [`crate::Inbox::with_batching`] runs its units in one; a unit of other
/// work may join one too, if it is safe to run again after a lost
/// `COMMIT` (see [`Joined::Alone`]).
#[derive(Debug)]
pub struct Group {
    /// Units go to the first lane whose queue moves within [`PATIENCE`].
    lanes: Vec<Arc<Lane>>,
    /// Lanes units start on, the first with room first: as many as
    /// batches of `limit` the lanes' units fill, so that several run at
    /// once under load (a lane runs its units one after another, on one
    /// connection).
    starting: usize,
    next: AtomicUsize,
    /// Most units in one batch.
    limit: usize,
    /// How long a unit waits for a lane, and a batch stays open for more
    /// units ([`PATIENCE`] unless set).
    patience: Duration,
    /// Successful units are inbox markers, counted in the minute's
    /// throughput at commit.
    markers: bool,
}

/// One lane: its open batch and who waits to join it.
#[derive(Debug, Default)]
struct Lane {
    open: Arc<Mutex<Option<Batch>>>,
    /// Units waiting for `open`'s lock: while any waits, the batch stays
    /// open for it.
    waiting: AtomicUsize,
}

/// An open transaction and what its units did.
#[derive(Debug)]
struct Batch {
    txn: DatabaseTransaction,
    units: usize,
    /// When it began: a batch open for [`PATIENCE`] is committed by its next
    /// unit, so a steady stream of units does not keep the first waiting.
    opened: Instant,
    /// Whether `processed` counts inbox markers.
    markers: bool,
    /// Units that succeeded: with `markers`, counted in the minute's
    /// throughput at commit, in one statement.
    processed: u64,
    fate: Arc<Fate>,
    /// Tells the members how it ended: `Some(committed)`; dropped unsent
    /// (its closer cancelled during the `COMMIT`), the outcome is unknown.
    end: watch::Sender<Option<bool>>,
    backend: sea_orm::DbBackend,
    /// Whether the first unit sets the isolation level ([`PG_READ_COMMITTED`]).
    sets_level: bool,
    /// The outbox rows its units recorded, written before its `COMMIT`.
    deferred: Arc<Deferred>,
}

impl Group {
    /// Batches of at most `limit` units (no more than [`MAX_BATCH`]) on up
    /// to `lanes` lanes (as many as units may run at once: then a unit
    /// never waits behind slow ones).
    pub fn new(limit: usize, lanes: usize) -> Self {
        let limit = limit.clamp(1, MAX_BATCH);
        Self {
            lanes: (0..lanes.max(1)).map(|_| Arc::default()).collect(),
            starting: lanes.max(1).div_ceil(limit),
            next: AtomicUsize::new(0),
            limit,
            patience: PATIENCE,
            markers: false,
        }
    }

    /// Sets how long a unit waits for a lane before it tries the next, and
    /// how long a batch stays open for more units.
    pub fn with_patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// Counts each successful unit as a processed inbox marker, in one
    /// statement per batch (the inbox's units then skip their own count).
    pub(crate) fn counting_markers(mut self) -> Self {
        self.markers = true;
        self
    }

    /// Runs `unit` in the open batch of a lane (opening one when there is
    /// none) and waits until that batch ends. On [`Joined::Alone`] the
    /// caller runs the unit again on its own (the inbox through
    /// [`Executor::run`]): its work did not commit, or may have (a lost
    /// `COMMIT`), which only a unit guarded by a marker can tell.
    pub async fn run<T, U>(&self, executor: &Executor, unit: &U) -> Joined<T>
    where
        T: Send,
        U: Unit<T> + ?Sized,
    {
        let Some(options) = executor.batch_options() else {
            return Joined::Alone;
        };
        let mut seat = self.take_seat(executor).await;
        if !seat.join_or_open(options, self.markers).await {
            seat.done();
            return Joined::Alone;
        }
        let (result, recovered, end) = seat.run_unit(unit, self.limit, self.patience).await;
        let committed = ended(end).await;
        seat.done();
        match result {
            // The error may not be this unit's (the savepoint could not be
            // made or rolled back to): it runs again alone.
            _ if !recovered => Joined::Alone,
            Err(HandlerError::Database(err)) if breaks_batch(&err) => Joined::Alone,
            // An outcome, good or bad, stands only if the batch committed:
            // the unit saw what the units before it wrote, uncommitted (a
            // copy of its own marker, a row its handler checked), and a
            // batch that did not commit took that with it. A copy reported
            // `Duplicate` of a twin that then failed alone would settle its
            // message with nothing applied.
            result if committed => Joined::Settled(result),
            _ => Joined::Alone,
        }
    }

    /// Chooses a lane and waits for its lock: the first lane where this
    /// unit still makes the next batch (fewer than `limit - 1` queued
    /// behind the running one), so load gathers on the first lanes and
    /// batches grow with it, and another lane runs at once only when those
    /// are full (all full: in turn). A lane whose lock does not come within
    /// the patience (a slow unit holds it, or a long queue) is left for the
    /// next; the last lane is waited for.
    async fn take_seat(&self, executor: &Executor) -> Seat {
        // SQLite has one writer: a second lane would only wait for the
        // first one's write lock.
        let starting = if executor.backend() == sea_orm::DbBackend::Sqlite {
            1
        } else {
            self.starting
        };
        let mut index = (0..starting)
            .find(|&i| self.lanes[i].waiting.load(Ordering::SeqCst) + 1 < self.limit)
            .unwrap_or_else(|| self.next.fetch_add(1, Ordering::Relaxed) % starting);
        loop {
            let mut seat = Seat::arrive(self.lanes[index].clone(), executor.clone());
            let lock = seat.lane.open.clone().lock_owned();
            if index + 1 == self.lanes.len() {
                seat.seated(lock.await);
                return seat;
            }
            match tokio::time::timeout(self.patience, lock).await {
                Ok(held) => {
                    seat.seated(held);
                    return seat;
                }
                // Leaving, the seat makes sure the batch it may have kept
                // open still ends.
                Err(_) => index += 1,
            }
        }
    }
}

impl Batch {
    /// The savepoint of its `n`-th unit (from 1), made with what must run
    /// before that unit (see [`PG_READ_COMMITTED`], [`PG_RESET`]).
    fn savepoint(&self, n: usize) -> Savepoint {
        let prelude = match (self.backend, n) {
            (sea_orm::DbBackend::Postgres, 1) => self.sets_level.then(|| PG_READ_COMMITTED.into()),
            (sea_orm::DbBackend::Postgres, _) => Some(PG_RESET.into()),
            // InnoDB: releasing the unit before's savepoint fails once the
            // transaction is gone (see `commit`); a `SAVEPOINT` alone would
            // not, and this unit's statements would commit one by one.
            (sea_orm::DbBackend::MySql, n) if n > 1 => {
                Some(format!("RELEASE SAVEPOINT {}", unit_savepoint(n - 1)))
            }
            _ => None,
        };
        Savepoint::new(unit_savepoint(n), prelude)
    }

    /// Commits the batch, or rolls it back when it is doomed, and tells its
    /// members which.
    async fn close(self, executor: &Executor) {
        let units = self.units;
        let committed = if self.fate.begin_commit() {
            let markers = if self.markers { self.processed } else { 0 };
            match commit(
                self.txn,
                self.backend,
                (self.units, markers),
                &self.deferred,
            )
            .await
            {
                Ok(()) => true,
                Err(err) => {
                    tracing::warn!(units, error = %err, "an inbox batch did not commit; its messages run again one by one");
                    false
                }
            }
        } else {
            rollback(self.txn).await;
            false
        };
        if committed {
            executor.notify_committed();
            metrics::histogram!("seawall_inbox_batch_size").record(units as f64);
        } else {
            metrics::counter!("seawall_inbox_batch_fallbacks_total").increment(1);
        }
        let _ = self.end.send(Some(committed));
    }
}

/// Proves the transaction is still the one the batch's units ran in,
/// writes the outbox rows its units deferred, adds the batch's `markers`
/// to the minute's count and commits.
///
/// The proof is a `RELEASE` of the first unit's savepoint (which a
/// `ROLLBACK TO` keeps): it fails once the transaction is gone or
/// aborted, and the units then run again alone. A handler that swallowed a
/// database error can leave it so: PostgreSQL aborts the transaction (its
/// `COMMIT` would answer `ROLLBACK` without an error); InnoDB rolls a
/// deadlocked one back whole and SQLite one that met a full disk, and the
/// statements after that commit one by one, so the `COMMIT` would succeed
/// with the units before it lost. On PostgreSQL [`PG_RESET`] goes first,
/// so the commit runs with the session's `synchronous_commit`.
///
/// On MySQL each unit after the first released the savepoint before its
/// own (the same proof, unit by unit: a `SAVEPOINT` after the loss would
/// succeed and leave that unit's statements committing one by one, its
/// marker among them), so the last unit's savepoint is the one left to
/// release. SQLite's `SAVEPOINT` after the loss opens a new transaction,
/// which the failed proof rolls back; PostgreSQL refuses a `SAVEPOINT`
/// outside a transaction.
async fn commit(
    txn: DatabaseTransaction,
    backend: sea_orm::DbBackend,
    (units, markers): (usize, u64),
    deferred: &Deferred,
) -> Result<(), DbErr> {
    let proof = match backend {
        sea_orm::DbBackend::Postgres => {
            format!("{PG_RESET}; RELEASE SAVEPOINT {}", unit_savepoint(1))
        }
        sea_orm::DbBackend::MySql => format!("RELEASE SAVEPOINT {}", unit_savepoint(units)),
        _ => format!("RELEASE SAVEPOINT {}", unit_savepoint(1)),
    };
    txn.execute_unprepared(&proof).await?;
    deferred.write(&txn).await?;
    rollup::add(&txn, Tally::Processed, Utc::now(), markers).await?;
    txn.commit().await
}

/// The name of the savepoint of a batch's `n`-th unit (from 1).
fn unit_savepoint(n: usize) -> String {
    format!("seawall_unit_{n}")
}

async fn rollback(txn: DatabaseTransaction) {
    if let Err(err) = txn.rollback().await {
        tracing::debug!(error = %err, "rollback of an inbox batch failed");
    }
}

/// Runs `unit` under `savepoint` of `txn`, rolled back to on failure or
/// panic. The second value is `false` when the savepoint could not be
/// rolled back to: the transaction is unusable.
///
/// A savepoint that succeeded is not released: the batch's commit ends it
/// with the rest, and a `RELEASE` would cost each unit a round trip. Each
/// unit's savepoint has a name of its own, so a `ROLLBACK TO` can only
/// reach the savepoint its unit made: were that `SAVEPOINT` to fail, the
/// rollback fails too and the batch breaks, where a shared name would roll
/// back the previous unit's committed-to-be work.
async fn in_savepoint<T, U>(
    txn: &DatabaseTransaction,
    unit: &U,
    savepoint: &Savepoint,
) -> (Result<T, HandlerError>, bool)
where
    U: Unit<T> + ?Sized,
{
    let result = match AssertUnwindSafe(unit.run_after_savepoint(txn, savepoint))
        .catch_unwind()
        .await
    {
        Ok(result) => result,
        Err(panic) => Err(HandlerError::Panicked(panic_message(panic.as_ref()))),
    };
    match result {
        Ok(value) => (Ok(value), true),
        Err(err) => {
            let recovered = txn
                .execute_unprepared(&format!("ROLLBACK TO SAVEPOINT {}", savepoint.name()))
                .await
                .is_ok();
            (Err(err), recovered)
        }
    }
}

/// Errors after which the batch's transaction is not to be trusted (a
/// deadlock may have rolled it back whole, a connection may be gone), and
/// which a unit run alone retries.
fn breaks_batch(err: &DbErr) -> bool {
    matches!(
        classify(err),
        Failure::Transient { .. } | Failure::Resource { .. }
    ) || crate::classify::is_outage(err)
}
