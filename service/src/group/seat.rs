//! A batch's fate and a member's seat: the two halves of the state machine
//! drawn in the module above.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sea_orm::TransactionTrait;
use tokio::sync::{OwnedMutexGuard, watch};

use super::{Batch, Lane, breaks_batch, in_savepoint};
use crate::classify::is_confined_to_statement;
use crate::error::HandlerError;
use crate::executor::{Executor, Unit};

/// Where a batch is headed (see the module's drawing). Only an open batch
/// changes course: a doomed one rolls back, and one whose `COMMIT` is under
/// way is past stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Taking units; its closer will commit it.
    Open,
    /// Must roll back: a unit broke the transaction, or a member whose unit
    /// ran in it was cancelled (its statement may still be running, or its
    /// caller reports a failure, and its work must not commit behind its
    /// back).
    Doomed,
    /// Its closer began the `COMMIT`.
    Committing,
}

/// A batch's [`Phase`], shared with the members that ran in it so that a
/// cancelled one can doom it without the lane's lock.
#[derive(Debug)]
pub(super) struct Fate(std::sync::Mutex<Phase>);

impl Fate {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self(std::sync::Mutex::new(Phase::Open)))
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Open -> Doomed; a batch already committing is past stopping.
    fn doom(&self) {
        let mut phase = self.phase();
        if *phase == Phase::Open {
            *phase = Phase::Doomed;
        }
    }

    fn is_doomed(&self) -> bool {
        *self.phase() == Phase::Doomed
    }

    /// Open -> Committing; `false` when the batch is doomed.
    pub(super) fn begin_commit(&self) -> bool {
        let mut phase = self.phase();
        if *phase == Phase::Open {
            *phase = Phase::Committing;
        }
        *phase == Phase::Committing
    }
}

/// Waits for the batch's end: whether it committed (`false` when its closer
/// was cancelled during the `COMMIT`: the outcome is unknown, and the
/// marker settles a re-run).
pub(super) async fn ended(mut end: watch::Receiver<Option<bool>>) -> bool {
    loop {
        if let Some(committed) = *end.borrow_and_update() {
            return committed;
        }
        if end.changed().await.is_err() {
            return false;
        }
    }
}

/// A unit's place in a lane, from its arrival to the end of its batch: the
/// member's one guard. [`Seat::done`] disarms it; dropped before that (its
/// caller was cancelled: a handling deadline), it first dooms the batch
/// its unit ran in (before the lane's lock, which it may hold, is
/// released, so no other unit runs in that batch believing it sound), and
/// then makes sure the lane's batch still ends.
pub(super) struct Seat {
    pub(super) lane: Arc<Lane>,
    executor: Executor,
    place: Place,
    /// The lane's lock, while this unit joins or runs.
    held: Option<OwnedMutexGuard<Option<Batch>>>,
}

enum Place {
    /// Counted in the lane's `waiting`.
    Waiting,
    /// Holding the lane, not yet in a batch.
    Seated,
    /// Its unit runs, or ran, in the batch of this fate.
    In(Arc<Fate>),
    /// Knows its batch's end (or never joined one): nothing to settle.
    Done,
}

impl Seat {
    pub(super) fn arrive(lane: Arc<Lane>, executor: Executor) -> Self {
        lane.waiting.fetch_add(1, Ordering::SeqCst);
        Self {
            lane,
            executor,
            place: Place::Waiting,
            held: None,
        }
    }

    pub(super) fn seated(&mut self, held: OwnedMutexGuard<Option<Batch>>) {
        self.lane.waiting.fetch_sub(1, Ordering::SeqCst);
        self.place = Place::Seated;
        self.held = Some(held);
    }

    /// Joins the lane's open batch, or opens one; a doomed batch left open
    /// (a member cancelled mid-unit: its statement may still run on the
    /// connection, and its error would reach whoever runs next) is rolled
    /// back first. `false` when no transaction could begin.
    pub(super) async fn join_or_open(
        &mut self,
        options: sea_orm::TransactionOptions,
        markers: bool,
    ) -> bool {
        let open = self.held.as_mut().expect("seated");
        if let Some(batch) = open.take_if(|batch| batch.fate.is_doomed()) {
            batch.close(&self.executor).await;
        }
        if open.is_none() {
            let Ok(txn) = self.executor.db().begin_with_options(options).await else {
                return false;
            };
            let backend = self.executor.backend();
            **open = Some(Batch {
                txn,
                units: 0,
                opened: Instant::now(),
                markers,
                processed: 0,
                fate: Fate::new(),
                end: watch::channel(None).0,
                backend,
                sets_level: backend == sea_orm::DbBackend::Postgres
                    && options.isolation_level.is_none(),
                deferred: Arc::default(),
            });
        }
        let fate = open.as_ref().expect("opened above").fate.clone();
        self.place = Place::In(fate);
        true
    }

    /// Runs `unit` under a savepoint of the batch, then leaves the lane:
    /// closing the batch when it broke, is full, has been open for
    /// `patience`, or nobody waits to join it. The second value is whether
    /// the savepoint held (see [`in_savepoint`]); the third tells the
    /// batch's end.
    pub(super) async fn run_unit<T, U>(
        &mut self,
        unit: &U,
        limit: usize,
        patience: Duration,
    ) -> (Result<T, HandlerError>, bool, watch::Receiver<Option<bool>>)
    where
        U: Unit<T> + ?Sized,
    {
        // Cancelled in here, the seat dooms the batch before its lock goes.
        let batch = self.held.as_mut().and_then(|h| h.as_mut()).expect("joined");
        batch.units += 1;
        let end = batch.end.subscribe();
        let savepoint = batch.savepoint(batch.units);
        let mark = batch.deferred.len();
        let (result, recovered) = batch
            .deferred
            .scope(&batch.txn, in_savepoint(&batch.txn, unit, &savepoint))
            .await;
        if result.is_err() {
            // Rolled back to its savepoint: its events with it.
            batch.deferred.truncate(mark);
        }
        match &result {
            Ok(_) => batch.processed += 1,
            // A deadlock or a timeout on PostgreSQL ends at the savepoint:
            // the batch goes on, and this unit alone runs again after it.
            Err(HandlerError::Database(err)) if recovered && is_confined_to_statement(err) => {}
            Err(HandlerError::Database(err)) if breaks_batch(err) => batch.fate.doom(),
            Err(_) => {}
        }
        if !recovered {
            batch.fate.doom();
        }
        let close = batch.fate.is_doomed()
            || batch.units >= limit
            || batch.opened.elapsed() >= patience
            || self.lane.waiting.load(Ordering::SeqCst) == 0;
        let mut held = self.held.take().expect("seated");
        let closing = if close { held.take() } else { None };
        drop(held);
        if let Some(batch) = closing {
            batch.close(&self.executor).await;
        }
        (result, recovered, end)
    }

    /// The member knows its batch's end: nothing of its lane is left to
    /// settle.
    pub(super) fn done(mut self) {
        self.place = Place::Done;
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.place, Place::Done) {
            Place::Done => return,
            Place::Waiting => {
                self.lane.waiting.fetch_sub(1, Ordering::SeqCst);
            }
            Place::Seated => {}
            Place::In(fate) => fate.doom(),
        }
        // Only now may the next unit have the lane.
        drop(self.held.take());
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
                    batch.close(&executor).await;
                }
            });
        }
    }
}
