//! A relay round's batch and how the round holds it while publishing: the
//! round takes a batch, publishes it, records each row's outcome on it, and
//! finishes it. Only the hold differs between backends.

use std::time::Duration;

use sea_orm::{DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, TransactionTrait};

use entity::outbox_message;

use super::store;

/// How a round holds its rows while it publishes them.
enum Hold {
    /// PostgreSQL and MySQL: the rows are locked (`FOR UPDATE SKIP LOCKED`)
    /// in a transaction kept open while they are published; the outcomes are
    /// written in it, one write per row, and its commit frees the rest. A
    /// crashed relay's rows are free the moment its connection drops.
    RowLocks(DatabaseTransaction),
    /// SQLite, which has no row locks: a lease (`locked_by` = `owner`,
    /// `locked_until`) written up front in its own transaction; rows left
    /// unpublished are released explicitly, and a crashed relay's rows wait
    /// for the lease to run out.
    Lease {
        db: DatabaseConnection,
        owner: String,
    },
}

/// The rows a round publishes, and its hold on them.
pub struct Batch {
    hold: Hold,
    /// The rows, in id order.
    pub rows: Vec<outbox_message::Model>,
    /// Whether publishable rows were left out for their bytes
    /// ([`store::BATCH_BYTES`]): the next round is due at once.
    pub cut: bool,
}

impl Batch {
    /// Takes up to `limit` publishable rows, at most
    /// [`store::BATCH_BYTES`] of payloads of them. `owner` names the lease where
    /// the backend needs one (unique per round, so rounds side by side never
    /// touch each other's rows).
    pub async fn take(
        db: &DatabaseConnection,
        owner: String,
        lease: Duration,
        limit: u64,
    ) -> Result<Self, DbErr> {
        if db.get_database_backend() == DbBackend::Sqlite {
            let taken = store::claim(db, &owner, lease, limit).await?;
            return Ok(Self {
                hold: Hold::Lease {
                    db: db.clone(),
                    owner,
                },
                rows: taken.rows,
                cut: taken.cut,
            });
        }
        let txn = db.begin().await?;
        let taken = store::lock(&txn, limit).await?;
        Ok(Self {
            hold: Hold::RowLocks(txn),
            rows: taken.rows,
            cut: taken.cut,
        })
    }

    /// Records rows JetStream acknowledged; returns how many were recorded.
    pub async fn mark_published(&self, ids: Vec<i64>) -> Result<u64, DbErr> {
        match &self.hold {
            Hold::RowLocks(txn) => store::mark_published(txn, None, ids).await,
            Hold::Lease { db, owner } => {
                let txn = db.begin_with_options(crate::db::BEGIN_IMMEDIATE).await?;
                let marked = store::mark_published(&txn, Some(owner), ids).await?;
                txn.commit().await?;
                Ok(marked)
            }
        }
    }

    /// Records a failed publish of `row` (an attempt when `counted`, see
    /// [`store::mark_failed`]); returns whether it is now dead.
    pub async fn mark_failed(
        &self,
        row: &outbox_message::Model,
        error: &str,
        retry_after: Duration,
        max_attempts: i32,
        counted: bool,
    ) -> Result<bool, DbErr> {
        match &self.hold {
            Hold::RowLocks(txn) => {
                store::mark_failed(txn, None, row, error, retry_after, max_attempts, counted).await
            }
            Hold::Lease { db, owner } => {
                let owner = Some(owner.as_str());
                store::mark_failed(db, owner, row, error, retry_after, max_attempts, counted).await
            }
        }
    }

    /// Ends the round: commits what was recorded and gives `unpublished`
    /// rows back for the next round.
    pub async fn finish(self, unpublished: Vec<i64>) -> Result<(), DbErr> {
        match self.hold {
            // The commit records the outcomes and frees every lock.
            Hold::RowLocks(txn) => txn.commit().await,
            Hold::Lease { db, owner } => store::release(&db, &owner, unpublished).await,
        }
    }
}
