//! Outbox rows a batch's units record, written in one insert just before
//! the batch commits: one round trip per batch instead of one per unit
//! (and on PostgreSQL one table-mode guard instead of one per unit). A unit
//! rolled back to its savepoint takes its rows back out; an insert that
//! fails fails the batch's commit, and its units run again alone, each
//! writing its rows as it goes.
//!
//! The units find the batch's rows through a task-local set around each
//! unit, and only for the batch's own transaction: events a handler
//! records on another transaction go there at once, as they always did.
//! A unit does not see its own events in `outbox_message` before the
//! batch commits (nothing else would: they were uncommitted).

use std::sync::{Arc, Mutex, MutexGuard};

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, EntityTrait};

use entity::outbox_message;

tokio::task_local! {
    /// The running unit's batch: its transaction's address and its rows.
    static DEFERRED: (usize, Arc<Deferred>);
}

/// A batch's deferred outbox rows, in the order its units recorded them.
#[derive(Debug, Default)]
pub(crate) struct Deferred {
    rows: Mutex<Vec<outbox_message::ActiveModel>>,
}

/// Where `txn` is: a unit's events are deferred only when recorded on its
/// batch's own transaction.
fn address(txn: &DatabaseTransaction) -> usize {
    std::ptr::from_ref(txn).addr()
}

/// The batch that defers the events recorded on `txn` by the running
/// unit, if any.
pub(crate) fn deferring(txn: &DatabaseTransaction) -> Option<Arc<Deferred>> {
    DEFERRED
        .try_with(|(at, deferred)| (*at == address(txn)).then(|| deferred.clone()))
        .ok()
        .flatten()
}

impl Deferred {
    fn rows(&self) -> MutexGuard<'_, Vec<outbox_message::ActiveModel>> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `unit` with the events it records on `txn` deferred here.
    pub(crate) async fn scope<F: std::future::Future>(
        self: &Arc<Self>,
        txn: &DatabaseTransaction,
        unit: F,
    ) -> F::Output {
        DEFERRED.scope((address(txn), self.clone()), unit).await
    }

    /// Adds a unit's rows.
    pub(crate) fn defer(&self, rows: Vec<outbox_message::ActiveModel>) {
        self.rows().extend(rows);
    }

    /// How many rows are deferred: where a unit's own begin.
    pub(crate) fn len(&self) -> usize {
        self.rows().len()
    }

    /// Takes back the rows from `len` on: a unit rolled back to its
    /// savepoint recorded them.
    pub(crate) fn truncate(&self, len: usize) {
        self.rows().truncate(len);
    }

    /// Writes the rows on the batch's transaction, in multi-row inserts of
    /// at most [`crate::outbox::BYTES_PER_INSERT`] each; on PostgreSQL
    /// after the table-mode guard each unit would have called.
    ///
    /// # Errors
    /// The database's, or a database switched to WAL mode since the units
    /// ran (their events would go to the table behind the slot's): the
    /// batch then does not commit, and its units run again alone.
    pub(crate) async fn write(&self, txn: &DatabaseTransaction) -> Result<(), DbErr> {
        let rows = std::mem::take(&mut *self.rows());
        if rows.is_empty() {
            return Ok(());
        }
        if txn.get_database_backend() == DbBackend::Postgres
            && let Some(slot) = crate::wal::mode::table_mode_guard(txn).await?
        {
            return Err(DbErr::Custom(format!(
                "the database switched to WAL mode (slot {slot}) while the batch ran"
            )));
        }
        for batch in crate::outbox::insert_batches(rows) {
            outbox_message::Entity::insert_many(batch)
                .exec_without_returning(txn)
                .await?;
        }
        Ok(())
    }
}
