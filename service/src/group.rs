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
//! - **A transaction that vanished is noticed.** Before `COMMIT` the batch
//!   releases its first unit's savepoint, which fails once the transaction
//!   was rolled back whole behind a handler that swallowed the error (an
//!   InnoDB deadlock, a full SQLite disk, a PostgreSQL error): every unit
//!   then runs again alone.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::FutureExt;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, TransactionTrait};
use tokio::sync::{Mutex, watch};

use crate::classify::{Failure, classify, is_confined_to_statement};
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
    open: Mutex<Option<Batch>>,
    /// Units waiting for `open`'s lock: while any waits, the batch stays
    /// open for it.
    waiting: AtomicUsize,
    /// A member was cancelled while it ran: its savepoint's rollback is
    /// only queued, so the open batch must not commit.
    tainted: AtomicBool,
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
    /// Something happened that this batch must not commit after.
    broken: bool,
    /// Set by a member that ran and was then cancelled while it waited for
    /// the batch to end (see [`Abandon`]).
    abandoned: Arc<AtomicBool>,
    end: watch::Sender<Option<bool>>,
    backend: sea_orm::DbBackend,
    /// Whether the first unit sets the isolation level ([`PG_READ_COMMITTED`]).
    sets_level: bool,
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
        // SQLite has one writer: a second lane would only wait for the
        // first one's write lock.
        let starting = if executor.backend() == sea_orm::DbBackend::Sqlite {
            1
        } else {
            self.starting
        };
        // The first lane where this unit still makes the next batch (fewer
        // than `limit - 1` queued behind the running one): load gathers on
        // the first lanes, so batches grow with it, and another lane runs
        // at once only when those are full. All full: in turn.
        let mut index = (0..starting)
            .find(|&i| self.lanes[i].waiting.load(Ordering::SeqCst) + 1 < self.limit)
            .unwrap_or_else(|| self.next.fetch_add(1, Ordering::Relaxed) % starting);
        let (lane, mut member, mut open) = loop {
            let lane = &self.lanes[index];
            let member = Member::arrive(lane.clone(), executor.clone());
            if index + 1 == self.lanes.len() {
                let open = lane.open.lock().await;
                break (lane, member, open);
            }
            match tokio::time::timeout(self.patience, lane.open.lock()).await {
                Ok(open) => break (lane, member, open),
                // Held by a slow unit (or a long queue): the next lane.
                // Leaving, the member makes sure the batch it may have
                // kept open still ends.
                Err(_) => index += 1,
            }
        };
        member.joined();
        // Dropped first if this call is cancelled (a handling deadline),
        // while the lane is still locked: the batch is not to commit.
        let taint = Taint(&lane.tainted);
        if lane.tainted.swap(false, Ordering::SeqCst)
            && let Some(mut batch) = open.take()
        {
            // A member was cancelled in this batch: its statement may still
            // run on the connection, and its outcome (an error) would reach
            // whoever runs next. The batch ends here, rolled back.
            batch.broken = true;
            batch.close(lane, executor).await;
        }
        if open.is_none() {
            match executor.db().begin_with_options(options).await {
                Ok(txn) => {
                    let backend = executor.backend();
                    *open = Some(Batch {
                        txn,
                        units: 0,
                        opened: Instant::now(),
                        markers: self.markers,
                        processed: 0,
                        broken: false,
                        abandoned: Arc::default(),
                        end: watch::channel(None).0,
                        backend,
                        sets_level: backend == sea_orm::DbBackend::Postgres
                            && options.isolation_level.is_none(),
                    });
                }
                Err(_) => {
                    std::mem::forget(taint);
                    drop(open);
                    member.left();
                    return Joined::Alone;
                }
            }
        }
        let batch = open.as_mut().expect("opened above");
        batch.units += 1;
        let mut end = batch.end.subscribe();
        let mut abandon = Abandon(Some(batch.abandoned.clone()));
        let savepoint = batch.savepoint(batch.units);
        let (result, recovered) = in_savepoint(&batch.txn, unit, &savepoint).await;
        std::mem::forget(taint);
        match &result {
            Ok(_) => batch.processed += 1,
            // A deadlock or a timeout on PostgreSQL ends at the savepoint:
            // the batch goes on, and this unit alone runs again after it.
            Err(HandlerError::Database(err)) if recovered && is_confined_to_statement(err) => {}
            Err(HandlerError::Database(err)) if breaks_batch(err) => batch.broken = true,
            Err(_) => {}
        }
        batch.broken |= !recovered;
        let close = batch.broken
            || batch.units >= self.limit
            || batch.opened.elapsed() >= self.patience
            || lane.waiting.load(Ordering::SeqCst) == 0;
        let closing = if close { open.take() } else { None };
        drop(open);
        member.left();
        if let Some(batch) = closing {
            batch.close(lane, executor).await;
        }
        let committed = loop {
            if let Some(committed) = *end.borrow_and_update() {
                break committed;
            }
            // The closer was cancelled during its commit: the outcome is
            // unknown, and the marker settles a re-run.
            if end.changed().await.is_err() {
                break false;
            }
        };
        abandon.0 = None;
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
}

impl Batch {
    /// The savepoint of its `n`-th unit (from 1), made with what must run
    /// before that unit (see [`PG_READ_COMMITTED`], [`PG_RESET`]).
    fn savepoint(&self, n: usize) -> Savepoint {
        let prelude = match (self.backend, n) {
            (sea_orm::DbBackend::Postgres, 1) => self.sets_level.then_some(PG_READ_COMMITTED),
            (sea_orm::DbBackend::Postgres, _) => Some(PG_RESET),
            _ => None,
        };
        Savepoint::new(unit_savepoint(n), prelude)
    }

    /// Commits the batch, or rolls it back when it broke, and tells its
    /// members which.
    async fn close(self, lane: &Lane, executor: &Executor) {
        let units = self.units;
        let committed = if self.broken
            || self.abandoned.load(Ordering::SeqCst)
            || lane.tainted.swap(false, Ordering::SeqCst)
        {
            rollback(self.txn).await;
            false
        } else {
            let markers = if self.markers { self.processed } else { 0 };
            match commit(self.txn, self.backend, markers).await {
                Ok(()) => true,
                Err(err) => {
                    tracing::warn!(units, error = %err, "an inbox batch did not commit; its messages run again one by one");
                    false
                }
            }
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

/// Proves the transaction is still the one the batch's units ran in, adds
/// the batch's `markers` to the minute's count and commits.
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
async fn commit(
    txn: DatabaseTransaction,
    backend: sea_orm::DbBackend,
    markers: u64,
) -> Result<(), DbErr> {
    let release = format!("RELEASE SAVEPOINT {}", unit_savepoint(1));
    let proof = match backend {
        sea_orm::DbBackend::Postgres => format!("{PG_RESET}; {release}"),
        _ => release,
    };
    txn.execute_unprepared(&proof).await?;
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

/// Marks the lane's batch as not to commit when dropped: armed while a
/// member runs, forgotten once its unit returned.
struct Taint<'a>(&'a AtomicBool);

impl Drop for Taint<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Marks its batch as not to commit when dropped before it is disarmed: a
/// member cancelled (a handling deadline) while it waits for its batch to
/// end reports a failure, so the work it did in the batch must not commit
/// behind its back (the others then run again alone). A batch whose commit
/// is already under way is past stopping; the marker settles the
/// redelivery of a member cancelled then.
struct Abandon(Option<Arc<AtomicBool>>);

impl Drop for Abandon {
    fn drop(&mut self) {
        if let Some(abandoned) = &self.0 {
            abandoned.store(true, Ordering::SeqCst);
        }
    }
}

/// A unit's place in a lane. Dropped before it left (its caller was
/// cancelled: a handling deadline), it makes sure the batch it held open
/// still ends.
struct Member {
    lane: Arc<Lane>,
    executor: Executor,
    state: State,
}

enum State {
    Waiting,
    Running,
    Left,
}

impl Member {
    fn arrive(lane: Arc<Lane>, executor: Executor) -> Self {
        lane.waiting.fetch_add(1, Ordering::SeqCst);
        Self {
            lane,
            executor,
            state: State::Waiting,
        }
    }

    fn joined(&mut self) {
        self.lane.waiting.fetch_sub(1, Ordering::SeqCst);
        self.state = State::Running;
    }

    /// Called once the member ran (or could not open a batch): nothing of
    /// its lane is left to settle when it is dropped.
    fn left(&mut self) {
        self.state = State::Left;
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        match self.state {
            State::Left => return,
            State::Waiting => {
                self.lane.waiting.fetch_sub(1, Ordering::SeqCst);
            }
            // The batch was tainted (see `Taint`) before the lane unlocked.
            State::Running => {}
        }
        // Whoever runs next closes the batch if nobody waits; with nobody
        // coming, this does.
        let lane = self.lane.clone();
        let executor = self.executor.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let mut open = lane.open.lock().await;
                if lane.waiting.load(Ordering::SeqCst) == 0
                    && let Some(batch) = open.take()
                {
                    drop(open);
                    batch.close(&lane, &executor).await;
                }
            });
        }
    }
}
