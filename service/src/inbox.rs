//! The transactional inbox: a message's effects commit exactly once per consumer.
//!
//! The marker row is inserted in the same transaction as the handler's
//! business writes and outbox rows (docs/architecture.md, rule 3). When two instances race on
//! one message, the unique index `ix_inbox_message_id_consumer` lets exactly one
//! commit; the other gets a unique violation on that index and reports
//! [`Outcome::Duplicate`] (rule 4). An existence check runs first as a cheap fast
//! path for the common redelivery, but it never decides a race (rule 1).

use std::sync::Arc;

use chrono::Utc;
use futures::future::BoxFuture;
use sea_orm::sea_query::PostgresQueryBuilder;
use sea_orm::{
    ActiveValue::{NotSet, Set},
    ColumnTrait, ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, EntityTrait, QueryFilter,
    QuerySelect, QueryTrait, TransactionTrait,
};

use entity::inbox_message;

use crate::classify::{Failure, classify};
use crate::envelope::{ConsumerName, Envelope};
use crate::error::{HandlerError, InboxError, InboxErrorKind};
use crate::executor::{Executor, Savepoint, Unit};
use crate::group::{Group, Joined};
use crate::handler::{Ctx, Handle};
use crate::outbox::Outbox;
use crate::rollup::{self, Tally};

/// What happened to a message that did not fail. Both are terminal: ack it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// This call applied the message; the handler's value is returned.
    Processed(T),
    /// The message had already been applied for this consumer; nothing changed.
    Duplicate,
}

/// When [`Inbox::process`] looks for an existing marker before opening the
/// unit's transaction. The look-up only saves work for duplicates and costs a
/// round trip for everything else (`seawall-bench inbox`: at 16 workers on
/// PostgreSQL it takes 15-20% of the throughput, and still loses with 30%
/// duplicates), so by default it runs only where duplicates are likely.
/// Correctness never depends on it: the unique index decides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FastPath {
    /// Before every message.
    Always,
    /// Before messages the broker delivered again ([`Envelope::redelivered`]),
    /// most of which were processed and lost their ack.
    #[default]
    Redeliveries,
    /// Never: every duplicate is caught by the unique index alone (proves
    /// that the index suffices, and measures what the look-up saves).
    Never,
}

impl FastPath {
    fn applies_to(self, envelope: &Envelope) -> bool {
        match self {
            Self::Always => true,
            Self::Redeliveries => envelope.redelivered,
            Self::Never => false,
        }
    }
}

/// The inbox: runs handlers behind the marker, through the retry executor.
#[derive(Debug, Clone)]
pub struct Inbox {
    executor: Executor,
    fast_path: FastPath,
    outbox: Outbox,
    /// Group commit, shared by the clones of this inbox; `None` commits
    /// each message on its own.
    group: Option<Arc<Group>>,
}

impl Inbox {
    /// An inbox running its units on `executor`, with the fast path on
    /// redeliveries, its handlers emitting events as table rows.
    pub fn new(executor: Executor) -> Self {
        Self {
            executor,
            fast_path: FastPath::default(),
            outbox: Outbox::default(),
            group: None,
        }
    }

    /// Commits up to `batch` concurrent messages in one transaction, each
    /// under its own savepoint, on up to `lanes` transactions open at once
    /// (as many as messages may be handled at once; see [`crate::group`]);
    /// a `batch` of 1 commits each message on its own. On a durable
    /// database a commit is a WAL flush, and this shares it.
    pub fn with_batching(mut self, batch: usize, lanes: usize) -> Self {
        self.group = (batch > 1).then(|| Arc::new(Group::new(batch, lanes).counting_markers()));
        self
    }

    /// Commits concurrent messages together in `group`'s batches (see
    /// [`Inbox::with_batching`]), for a group with settings of its own.
    pub fn with_group(mut self, group: Group) -> Self {
        self.group = Some(Arc::new(group.counting_markers()));
        self
    }

    /// This inbox without group commit: each message commits on its own
    /// (a consumer registered with [`crate::Registry::unbatched`]).
    pub fn without_batching(mut self) -> Self {
        self.group = None;
        self
    }

    /// Sets where handlers' events go (the process's `outbox_mode`).
    pub fn with_outbox(mut self, outbox: Outbox) -> Self {
        self.outbox = outbox;
        self
    }

    /// Sets when the existence pre-check runs.
    pub fn with_fast_path(mut self, fast_path: FastPath) -> Self {
        self.fast_path = fast_path;
        self
    }

    /// The executor units run on.
    pub fn executor(&self) -> &Executor {
        &self.executor
    }

    /// Applies `envelope` for `consumer` at most once: inserts the marker and
    /// runs `handler` in one transaction, retried as a whole on transient errors.
    ///
    /// # Errors
    /// [`InboxError`] when the unit did not commit: a business constraint
    /// violation, a handler rejection or failure, a panic, or a database error
    /// the retries did not overcome. Nothing of the unit is left behind.
    #[tracing::instrument(name = "inbox.process", skip_all, fields(message_id = %envelope.message_id, consumer = %consumer))]
    pub async fn process<T, H>(
        &self,
        envelope: &Envelope,
        consumer: &ConsumerName,
        handler: &H,
    ) -> Result<Outcome<T>, InboxError>
    where
        T: Send,
        H: Handle<T> + ?Sized,
    {
        if self.fast_path.applies_to(envelope) {
            match self.is_recorded(envelope, consumer).await {
                Ok(true) => return Ok(Outcome::Duplicate),
                Ok(false) => {}
                Err(source) => {
                    return Err(InboxError::new(
                        envelope.message_id.clone(),
                        consumer.clone(),
                        InboxErrorKind::Database(source),
                    ));
                }
            }
        }
        let unit = MarkedUnit {
            envelope,
            consumer,
            handler,
            outbox: self.outbox,
            counted: true,
        };
        let result = match &self.group {
            Some(group) => {
                // The batch counts its markers in one statement.
                let batched = MarkedUnit {
                    counted: false,
                    ..unit
                };
                match group.run(&self.executor, &batched).await {
                    Joined::Settled(result) => result,
                    Joined::Alone => self.executor.run(&unit).await,
                }
            }
            None => self.executor.run(&unit).await,
        };
        match result {
            Ok(value) => Ok(Outcome::Processed(value)),
            Err(err) => classify_unit_error(envelope, consumer, err),
        }
    }

    /// Whether the marker of (`envelope`, `consumer`) is committed, asked once
    /// any transaction holding it uncommitted has ended: the marker is
    /// inserted in a transaction of its own, then rolled back, and the unique
    /// index makes that insert wait for a concurrent one's outcome (SQLite's
    /// writer lock does the same). A plain read would not see a `COMMIT` still
    /// under way, and a consumer whose deadline passed during its batch's
    /// `COMMIT` would report as failed a message whose work committed.
    ///
    /// # Errors
    /// The probe's database error (other than finding the marker).
    pub async fn is_recorded_once_settled(
        &self,
        envelope: &Envelope,
        consumer: &ConsumerName,
    ) -> Result<bool, DbErr> {
        let txn = self.executor.db().begin().await?;
        let probe = insert_marker(&txn, envelope, consumer).await;
        if let Err(err) = txn.rollback().await {
            tracing::debug!(error = %err, "rollback of a marker probe failed");
        }
        match probe {
            Ok(()) => Ok(false),
            Err(err) if classify(&err) == Failure::InboxDuplicate => Ok(true),
            Err(err) => Err(err),
        }
    }

    /// Whether a marker exists for the pair (the fast path's read).
    ///
    /// # Errors
    /// The database error of the read.
    pub async fn is_recorded(
        &self,
        envelope: &Envelope,
        consumer: &ConsumerName,
    ) -> Result<bool, DbErr> {
        let found = inbox_message::Entity::find()
            .select_only()
            .column(inbox_message::Column::Id)
            .filter(inbox_message::Column::MessageId.eq(envelope.message_id.as_str()))
            .filter(inbox_message::Column::Consumer.eq(consumer.as_str()))
            .into_tuple::<i64>()
            .one(self.executor.db())
            .await?;
        Ok(found.is_some())
    }
}

/// The marker insert followed by the handler: the unit the executor re-runs.
struct MarkedUnit<'h, H: ?Sized> {
    envelope: &'h Envelope,
    consumer: &'h ConsumerName,
    handler: &'h H,
    outbox: Outbox,
    /// Counts its marker in the minute's throughput (a batch counts its
    /// units' at once instead).
    counted: bool,
}

impl<T, H> Unit<T> for MarkedUnit<'_, H>
where
    T: Send,
    H: Handle<T> + ?Sized,
{
    /// The marker makes a re-run after a lost `COMMIT` safe: if the first
    /// run committed, the re-run meets the marker and is a `Duplicate`.
    fn guarded_by_marker(&self) -> bool {
        true
    }

    fn run<'a>(&'a self, txn: &'a DatabaseTransaction) -> BoxFuture<'a, Result<T, HandlerError>> {
        Box::pin(async move {
            // The marker goes first: on PostgreSQL a concurrent instance then
            // blocks on the index right away instead of doing the work twice.
            insert_marker(txn, self.envelope, self.consumer).await?;
            self.handle(txn).await
        })
    }

    /// On PostgreSQL the savepoint and the marker go in one round trip (a
    /// simple query of two statements, the marker's values written into
    /// its text): a batch's unit then costs one round trip more than the
    /// handler's statements, not three.
    fn run_after_savepoint<'a>(
        &'a self,
        txn: &'a DatabaseTransaction,
        savepoint: &'a Savepoint,
    ) -> BoxFuture<'a, Result<T, HandlerError>> {
        Box::pin(async move {
            if txn.get_database_backend() != DbBackend::Postgres {
                txn.execute_unprepared(&savepoint.statement()).await?;
                return self.run(txn).await;
            }
            let marker = QueryTrait::as_query(&marker_insert(self.envelope, self.consumer))
                .to_string(PostgresQueryBuilder);
            txn.execute_unprepared(&format!("{}; {marker}", savepoint.statement()))
                .await?;
            self.handle(txn).await
        })
    }
}

impl<H: ?Sized> MarkedUnit<'_, H> {
    /// The handler, on `txn` after the marker, then the marker's count.
    ///
    /// The count comes after the handler because on PostgreSQL it is then
    /// also the statement that finds a transaction the handler left aborted
    /// (it met a database error and returned `Ok` without passing it on):
    /// the `COMMIT` of such a transaction answers `ROLLBACK` without an
    /// error, and the message would be acknowledged with its marker and its
    /// work gone. A batch counts its units at its commit, which finds it the
    /// same way, and runs them again alone.
    async fn handle<T>(&self, txn: &DatabaseTransaction) -> Result<T, HandlerError>
    where
        H: Handle<T>,
    {
        let ctx = Ctx::new(txn, self.envelope, self.consumer, self.outbox);
        let value = self.handler.handle(&ctx).await?;
        if self.counted {
            rollup::add(txn, Tally::Processed, Utc::now(), 1)
                .await
                .map_err(|err| {
                    if crate::classify::is_aborted_transaction(&err) {
                        HandlerError::Failed(
                            "the handler returned Ok after a database error it swallowed: \
                             PostgreSQL aborted the transaction, and none of its work was committed"
                                .into(),
                        )
                    } else {
                        err.into()
                    }
                })?;
        }
        Ok(value)
    }
}

/// Inserts the processed marker for (`envelope`, `consumer`) on `txn`, and
/// counts it in the minute's throughput ([`crate::rollup`]).
///
/// [`Inbox::process`] calls this before the handler. It is public for units
/// that must order their statements differently; whatever runs before it on
/// the same transaction rolls back when the index rejects the marker.
///
/// # Errors
/// The insert's error; a duplicate is a unique violation of
/// `ix_inbox_message_id_consumer` (see [`crate::classify`]).
pub async fn record_marker(
    txn: &DatabaseTransaction,
    envelope: &Envelope,
    consumer: &ConsumerName,
) -> Result<(), DbErr> {
    insert_marker(txn, envelope, consumer).await?;
    rollup::add(txn, Tally::Processed, Utc::now(), 1).await
}

/// The marker insert of [`record_marker`], without its count.
async fn insert_marker(
    txn: &DatabaseTransaction,
    envelope: &Envelope,
    consumer: &ConsumerName,
) -> Result<(), DbErr> {
    marker_insert(envelope, consumer)
        .exec_without_returning(txn)
        .await?;
    Ok(())
}

/// The insert of a processed marker for (`envelope`, `consumer`), now.
fn marker_insert(
    envelope: &Envelope,
    consumer: &ConsumerName,
) -> sea_orm::Insert<inbox_message::ActiveModel> {
    let now = Utc::now();
    let marker = inbox_message::ActiveModel {
        id: NotSet,
        message_id: Set(envelope.message_id.as_str().to_owned()),
        consumer: Set(consumer.as_str().to_owned()),
        received_at: Set(now),
        processed_at: Set(Some(now)),
        claimed_by: Set(None),
        claimed_at: Set(None),
        lease_until: Set(None),
        attempts: Set(1),
        result: Set(None),
        quarantined_at: Set(None),
        subject: Set(None),
        payload: Set(None),
    };
    inbox_message::Entity::insert(marker)
}

fn classify_unit_error<T>(
    envelope: &Envelope,
    consumer: &ConsumerName,
    err: HandlerError,
) -> Result<Outcome<T>, InboxError> {
    let kind = match err {
        HandlerError::Database(source) => match classify(&source) {
            Failure::InboxDuplicate => return Ok(Outcome::Duplicate),
            Failure::UniqueViolation { constraint } => {
                InboxErrorKind::Constraint { constraint, source }
            }
            _ => InboxErrorKind::Database(source),
        },
        // Not produced for inbox units (they are guarded by their marker),
        // but reported as the database failure it is should that change.
        HandlerError::CommitUnknown(source) => InboxErrorKind::Database(source),
        HandlerError::Rejected(reason) => InboxErrorKind::Rejected(reason),
        HandlerError::Failed(source) => InboxErrorKind::Handler(source),
        HandlerError::Unavailable { reason, .. } => InboxErrorKind::Unavailable(reason),
        HandlerError::Panicked(panic) => InboxErrorKind::Panicked(panic),
    };
    Err(InboxError::new(
        envelope.message_id.clone(),
        consumer.clone(),
        kind,
    ))
}
