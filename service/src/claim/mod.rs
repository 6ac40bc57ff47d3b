//! Two-phase claims for side effects that cannot join a transaction
//! (docs/architecture.md, rule 8): an email, a card charge, a webhook.
//!
//! Phase one commits the marker with `processed_at` null and a lease; the
//! caller then performs the effect with the message id as its idempotency
//! key, and phase two records completion. A crash between the phases leaves an
//! open claim whose lease runs out; a later delivery takes it over with a
//! conditional update that only one contender can win, and the sweeper
//! quarantines claims that failed too often, for a person to judge.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ActiveValue::{NotSet, Set},
    ColumnTrait, Condition, DatabaseConnection, DbErr, EntityTrait, QueryFilter, TransactionTrait,
};

use entity::inbox_message::{self, Column};

use crate::classify::{Failure, classify};
use crate::db::BEGIN_IMMEDIATE;
use crate::envelope::{ConsumerName, Envelope, MessageId};
use crate::rollup::{self, Tally};
use crate::state::ClaimState;

/// The reason written to `dead_letter` when a claim is quarantined.
pub const QUARANTINE_REASON: &str =
    "needs a person: the effect may or may not have happened (claim abandoned too many times)";

/// How a consumer's claims behave.
#[derive(Debug, Clone)]
pub struct ClaimPolicy {
    /// How long a claim is exclusive. Longer than the effect can take.
    pub lease: Duration,
    /// Claims taken this many times without completion are quarantined.
    pub max_attempts: i32,
    /// Who claims (recorded in `claimed_by`). Unique per process: in
    /// containers every process is pid 1, so the pid alone would let two
    /// instances mistake each other's claims for their own.
    pub instance: String,
}

impl Default for ClaimPolicy {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            max_attempts: 5,
            instance: instance_name(),
        }
    }
}

/// This process's claim owner name: the pid for people reading
/// `claimed_by`, and a random suffix drawn once per process for uniqueness.
fn instance_name() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        format!("claim-{}-{}", std::process::id(), &suffix[..12])
    })
    .clone()
}

mod ending;

pub use crate::state::lease_expired;
pub use ending::{Release, give_up, quarantine, quarantined, release};

/// Claiming failed: which claim, and [`ClaimError::kind`] says how. A
/// database failure is the [`std::error::Error::source`].
#[derive(Debug)]
pub struct ClaimError {
    message_id: MessageId,
    consumer: ConsumerName,
    kind: ClaimErrorKind,
}

/// How a [`ClaimError`] came about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimErrorKind {
    /// The database failed.
    #[error("database error: {0}")]
    Database(#[source] DbErr),
    /// The guard's lease ran out and another instance holds the claim now
    /// under a live lease; this instance must not record a result (the
    /// other one will, or its lease runs out and a redelivery takes over).
    #[error("taken over after its lease ran out")]
    LeaseLost,
    /// The claim was quarantined (too many abandoned attempts) while this
    /// instance performed the effect. It is not recorded as done: the
    /// quarantine's dead letter already asks a person to decide.
    #[error("quarantined while its effect ran")]
    Quarantined,
}

impl ClaimError {
    fn new(message_id: &MessageId, consumer: &ConsumerName, kind: ClaimErrorKind) -> Self {
        Self {
            message_id: message_id.clone(),
            consumer: consumer.clone(),
            kind,
        }
    }

    /// The message whose claim failed.
    pub fn message_id(&self) -> &MessageId {
        &self.message_id
    }

    /// The consumer that claimed it.
    pub fn consumer(&self) -> &ConsumerName {
        &self.consumer
    }

    /// How it failed.
    pub fn kind(&self) -> &ClaimErrorKind {
        &self.kind
    }

    /// Whose fault it is (see [`crate::classify::Blame`]): only a database
    /// error can be the infrastructure's.
    pub fn blame(&self) -> crate::classify::Blame {
        match &self.kind {
            ClaimErrorKind::Database(source) => crate::classify::blame(source),
            _ => crate::classify::Blame::Message,
        }
    }

    /// True when the database was unreachable (see [`crate::classify::is_outage`]).
    pub fn is_outage(&self) -> bool {
        self.blame() == crate::classify::Blame::Outage
    }
}

impl std::fmt::Display for ClaimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "claim of message {} (consumer {}): {}",
            self.message_id, self.consumer, self.kind
        )
    }
}

/// The source is the kind's: the database error itself.
impl std::error::Error for ClaimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.kind.source()
    }
}

/// What [`claim`] found.
#[derive(Debug)]
pub enum ClaimOutcome {
    /// This instance owns the claim: perform the effect, then complete or fail.
    Acquired(ClaimGuard),
    /// The effect was recorded as done: ack the message.
    AlreadyProcessed,
    /// Another live claim holds it until `lease_until`: retry later.
    InProgress {
        /// When the other claim's lease runs out.
        lease_until: DateTime<Utc>,
    },
    /// Quarantined: a person decides; do not perform the effect.
    Quarantined,
}

/// Proof of owning a claim. Dropping it without [`ClaimGuard::complete`] or
/// [`ClaimGuard::fail`] leaves the claim to expire, as a crash would.
#[derive(Debug)]
#[must_use = "complete() or fail() the claim"]
pub struct ClaimGuard {
    db: DatabaseConnection,
    id: i64,
    message_id: MessageId,
    consumer: ConsumerName,
    instance: String,
    attempt: i32,
}

impl ClaimGuard {
    /// The claim's inbox marker id, as the admin API and logs name it.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The key the side effect must carry (`Idempotency-Key`): the message id,
    /// the same for every attempt, so a repeat after a crash is recognisable.
    pub fn idempotency_key(&self) -> &str {
        self.message_id.as_str()
    }

    /// Which attempt this is (1 for the first claim).
    pub fn attempt(&self) -> i32 {
        self.attempt
    }

    /// Records the effect as done, with an optional result.
    ///
    /// The effect happened, so it is recorded even when this guard's lease
    /// ran out and the sweeper or an operator released the claim meanwhile:
    /// otherwise nobody would (this delivery is about to be settled), and the
    /// row would stay open for good. Only a live lease of another instance
    /// (which will record it itself) or a quarantine stops it.
    ///
    /// # Errors
    /// [`ClaimErrorKind::LeaseLost`] if another instance holds the claim under a
    /// live lease, [`ClaimErrorKind::Quarantined`] if it was quarantined.
    ///
    /// It takes `&self` so a caller can try again with the same guard after
    /// a database error: the effect is done and only its record is missing.
    pub async fn complete(&self, result: Option<String>) -> Result<(), ClaimError> {
        let now = Utc::now();
        let res = self
            .record(self.owned(), now, result.as_deref())
            .await
            .map_err(|e| self.db_error(e))?;
        if res == 1 {
            return Ok(());
        }
        let unheld = ClaimState::Expired
            .condition(now)
            .add(Column::Id.eq(self.id));
        let res = self
            .record(unheld, now, result.as_deref())
            .await
            .map_err(|e| self.db_error(e))?;
        if res == 1 {
            tracing::info!(
                attempt = self.attempt,
                "effect recorded after the claim's lease ran out"
            );
            return Ok(());
        }
        let row = inbox_message::Entity::find_by_id(self.id)
            .one(&self.db)
            .await
            .map_err(|e| self.db_error(e))?;
        match row {
            // Recorded by another instance, or pruned after it was: done.
            Some(row) if row.processed_at.is_some() => Ok(()),
            None => Ok(()),
            Some(row) if row.quarantined_at.is_some() => {
                self.note_on_quarantined(result.as_deref()).await;
                Err(self.error(ClaimErrorKind::Quarantined))
            }
            Some(_) => self.expect_one(0),
        }
    }

    /// Tells the person deciding about a quarantined claim that this
    /// instance did perform the effect (in `result`; `processed_at` stays
    /// empty, the quarantine stands). Best effort: the dead letter already
    /// says the effect may have happened.
    async fn note_on_quarantined(&self, result: Option<&str>) {
        let note = format!(
            "attempt {} by {} performed the effect after the claim was quarantined ({})",
            self.attempt,
            self.instance,
            result.unwrap_or("no result")
        );
        let res = inbox_message::Entity::update_many()
            .col_expr(Column::Result, Expr::value(note))
            .filter(Column::Id.eq(self.id))
            .filter(Column::ProcessedAt.is_null())
            .exec(&self.db)
            .await;
        if let Err(err) = res {
            tracing::warn!(error = %err, "could not note the late effect on the quarantined claim");
        }
    }

    /// Releases the claim after an attempt that could not reach the effect's
    /// target (it was down or overloaded): like [`ClaimGuard::fail`], but the
    /// attempt is not counted, so a target's outage never quarantines the
    /// claim; the next delivery takes it over as this same attempt.
    ///
    /// # Errors
    /// As [`ClaimGuard::fail`].
    pub async fn release_unattempted(self, reason: &str) -> Result<(), ClaimError> {
        let res = inbox_message::Entity::update_many()
            .col_expr(
                Column::LeaseUntil,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .col_expr(Column::ClaimedBy, Expr::value(Option::<String>::None))
            .col_expr(Column::Attempts, Expr::value(self.attempt - 1))
            .col_expr(
                Column::Result,
                Expr::value(format!(
                    "attempt {} could not reach its target: {reason}",
                    self.attempt
                )),
            )
            .filter(self.owned())
            .exec(&self.db)
            .await
            .map_err(|e| self.db_error(e))?;
        self.expect_one(res.rows_affected)
    }

    /// Releases the claim for a retry (the effect failed, it may be attempted again).
    ///
    /// # Errors
    /// [`ClaimErrorKind::LeaseLost`] if another instance took the claim over.
    pub async fn fail(self, reason: &str) -> Result<(), ClaimError> {
        let res = inbox_message::Entity::update_many()
            .col_expr(
                Column::LeaseUntil,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .col_expr(Column::ClaimedBy, Expr::value(Option::<String>::None))
            .col_expr(
                Column::Result,
                Expr::value(format!("attempt {} failed: {reason}", self.attempt)),
            )
            .filter(self.owned())
            .exec(&self.db)
            .await
            .map_err(|e| self.db_error(e))?;
        self.expect_one(res.rows_affected)
    }

    /// Records the effect as processed at `now` on the claim if it matches
    /// `condition`, and counts it in the minute's throughput, in one
    /// transaction; returns how many rows it recorded (0 or 1).
    async fn record(
        &self,
        condition: Condition,
        now: DateTime<Utc>,
        result: Option<&str>,
    ) -> Result<u64, DbErr> {
        let txn = self.db.begin_with_options(BEGIN_IMMEDIATE).await?;
        let recorded = inbox_message::Entity::update_many()
            .col_expr(Column::ProcessedAt, Expr::value(now))
            .col_expr(Column::Result, Expr::value(result.map(str::to_owned)))
            .col_expr(
                Column::LeaseUntil,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .filter(condition)
            .exec(&txn)
            .await?
            .rows_affected;
        rollup::add(&txn, Tally::Processed, now, recorded).await?;
        txn.commit().await?;
        Ok(recorded)
    }

    fn owned(&self) -> Condition {
        ClaimState::open()
            .add(Column::Id.eq(self.id))
            .add(Column::ClaimedBy.eq(self.instance.as_str()))
            .add(Column::Attempts.eq(self.attempt))
    }

    fn expect_one(&self, rows: u64) -> Result<(), ClaimError> {
        if rows == 1 {
            Ok(())
        } else {
            Err(self.error(ClaimErrorKind::LeaseLost))
        }
    }

    fn error(&self, kind: ClaimErrorKind) -> ClaimError {
        ClaimError::new(&self.message_id, &self.consumer, kind)
    }

    fn db_error(&self, source: DbErr) -> ClaimError {
        self.error(ClaimErrorKind::Database(source))
    }
}

/// Claims `envelope` for `consumer` (phase one). Commits before returning.
///
/// # Errors
/// [`ClaimErrorKind::Database`].
#[tracing::instrument(name = "inbox.claim", skip_all, fields(message_id = %envelope.message_id, consumer = %consumer))]
pub async fn claim(
    db: &DatabaseConnection,
    envelope: &Envelope,
    consumer: &ConsumerName,
    policy: &ClaimPolicy,
) -> Result<ClaimOutcome, ClaimError> {
    let err = |source| {
        ClaimError::new(
            &envelope.message_id,
            consumer,
            ClaimErrorKind::Database(source),
        )
    };
    let now = Utc::now();
    let lease_until =
        now + chrono::Duration::from_std(policy.lease).unwrap_or(chrono::Duration::MAX);
    let marker = inbox_message::ActiveModel {
        id: NotSet,
        message_id: Set(envelope.message_id.to_string()),
        consumer: Set(consumer.to_string()),
        received_at: Set(now),
        processed_at: Set(None),
        claimed_by: Set(Some(policy.instance.clone())),
        claimed_at: Set(Some(now)),
        lease_until: Set(Some(lease_until)),
        attempts: Set(1),
        result: Set(None),
        quarantined_at: Set(None),
        subject: Set(Some(envelope.subject.clone())),
        payload: Set(Some(envelope.payload.clone())),
    };
    match inbox_message::Entity::insert(marker)
        .exec_without_returning(db)
        .await
    {
        Ok(_) => {}
        Err(e) if classify(&e) == Failure::InboxDuplicate => {
            return take_over(db, envelope, consumer, policy).await.map_err(err);
        }
        Err(e) => return Err(err(e)),
    }
    let id = find(db, envelope, consumer)
        .await
        .map_err(err)?
        .map(|row| row.id)
        .ok_or_else(|| {
            err(DbErr::RecordNotFound(format!(
                "claim marker for {}",
                envelope.message_id
            )))
        })?;
    Ok(ClaimOutcome::Acquired(ClaimGuard {
        db: db.clone(),
        id,
        message_id: envelope.message_id.clone(),
        consumer: consumer.clone(),
        instance: policy.instance.clone(),
        attempt: 1,
    }))
}

async fn find(
    db: &DatabaseConnection,
    envelope: &Envelope,
    consumer: &ConsumerName,
) -> Result<Option<inbox_message::Model>, DbErr> {
    inbox_message::Entity::find()
        .filter(Column::MessageId.eq(envelope.message_id.as_str()))
        .filter(Column::Consumer.eq(consumer.as_str()))
        .one(db)
        .await
}

/// The marker exists: report its state, or take an expired claim over. The
/// takeover is conditional on the attempt count read, so of several
/// contenders exactly one matches.
async fn take_over(
    db: &DatabaseConnection,
    envelope: &Envelope,
    consumer: &ConsumerName,
    policy: &ClaimPolicy,
) -> Result<ClaimOutcome, DbErr> {
    let Some(row) = find(db, envelope, consumer).await? else {
        // Pruned between the insert and the read: treat as done.
        return Ok(ClaimOutcome::AlreadyProcessed);
    };
    let now = Utc::now();
    if row.processed_at.is_some() {
        return Ok(ClaimOutcome::AlreadyProcessed);
    }
    if row.quarantined_at.is_some() {
        return Ok(ClaimOutcome::Quarantined);
    }
    if !lease_expired(row.lease_until, now) {
        return Ok(ClaimOutcome::InProgress {
            lease_until: row.lease_until.unwrap_or(now),
        });
    }
    if row.attempts >= policy.max_attempts {
        quarantine(db, &row).await?;
        return Ok(ClaimOutcome::Quarantined);
    }
    let lease_until =
        now + chrono::Duration::from_std(policy.lease).unwrap_or(chrono::Duration::MAX);
    let res = inbox_message::Entity::update_many()
        .col_expr(Column::ClaimedBy, Expr::value(policy.instance.as_str()))
        .col_expr(Column::ClaimedAt, Expr::value(now))
        .col_expr(Column::LeaseUntil, Expr::value(lease_until))
        .col_expr(Column::Attempts, Expr::col(Column::Attempts).add(1))
        .filter(Column::Id.eq(row.id))
        .filter(Column::Attempts.eq(row.attempts))
        .filter(ClaimState::open())
        .exec(db)
        .await?;
    if res.rows_affected == 1 {
        tracing::info!(attempt = row.attempts + 1, "took over an expired claim");
        Ok(ClaimOutcome::Acquired(ClaimGuard {
            db: db.clone(),
            id: row.id,
            message_id: envelope.message_id.clone(),
            consumer: consumer.clone(),
            instance: policy.instance.clone(),
            attempt: row.attempts + 1,
        }))
    } else {
        Ok(ClaimOutcome::InProgress { lease_until })
    }
}
