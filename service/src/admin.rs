//! What operators list and change: the query and mutation core behind the
//! admin API (and whatever a fork puts in front of it). Handlers translate
//! HTTP into these filters and calls; they build no column conditions of
//! their own, so a state means the same thing on every screen and in every
//! count (see [`crate::state`]).
//!
//! Lists are newest first with keyset paging: a [`Cursor`] asks for the rows
//! below an id, and each list returns up to `limit + 1` rows, the extra one
//! only telling the caller that another page exists.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, Condition, DatabaseConnection, DbErr, EntityTrait, PartialModelTrait, QueryFilter,
    QueryOrder, QuerySelect,
};

use entity::{dead_letter, inbox_message, outbox_message};

use crate::dead_letter::{DeadLetter, REPLAY_LETTER_HEADER, REPLAY_OF_HEADER};
use crate::outbox::{Outbox, check_header, check_message_id};
use crate::state::{ClaimState, OutboxState};

/// Which page of a list: rows with an id below `after` (all when `None`),
/// at most `limit` of them (plus one that only tells whether more exist).
#[derive(Debug, Clone, Copy)]
pub struct Cursor {
    /// The last id of the previous page.
    pub after: Option<i64>,
    /// Page size.
    pub limit: u64,
}

/// A half-open range of creation times, `from <= t < to`; either end may
/// be open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimeRange {
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
}

/// A [`TimeRange`] whose start lies after its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("from must not be after to")]
pub struct InvalidRange;

impl TimeRange {
    /// The range `from..to`.
    ///
    /// # Errors
    /// [`InvalidRange`] when `from` is after `to`: such a filter would match
    /// nothing, which is never what the person asking meant.
    pub fn new(
        from: Option<DateTime<Utc>>,
        to: Option<DateTime<Utc>>,
    ) -> Result<Self, InvalidRange> {
        match (from, to) {
            (Some(f), Some(t)) if f > t => Err(InvalidRange),
            _ => Ok(Self { from, to }),
        }
    }

    fn condition(self, column: impl ColumnTrait) -> Condition {
        let mut cond = Condition::all();
        if let Some(from) = self.from {
            cond = cond.add(column.gte(from));
        }
        if let Some(to) = self.to {
            cond = cond.add(column.lt(to));
        }
        cond
    }
}

/// `cond`, narrowed to `column = value` when a value is given.
fn and_eq(cond: Condition, column: impl ColumnTrait, value: Option<&str>) -> Condition {
    match value {
        Some(value) => cond.add(column.eq(value)),
        None => cond,
    }
}

/// Up to `cursor.limit + 1` rows of `E` matching `cond`, newest first, read
/// as the partial model `P` (a list never reads the messages rows carry).
async fn newest_first<E: EntityTrait, P: PartialModelTrait + Send + Sync>(
    db: &DatabaseConnection,
    cond: Condition,
    id: E::Column,
    cursor: Cursor,
) -> Result<Vec<P>, DbErr> {
    let cond = match cursor.after {
        Some(after) => cond.add(id.lt(after)),
        None => cond,
    };
    E::find()
        .filter(cond)
        .order_by_desc(id)
        .limit(cursor.limit.saturating_add(1))
        .into_partial_model::<P>()
        .all(db)
        .await
}

/// Which outbox rows; every field narrows.
#[derive(Debug, Clone, Default)]
pub struct OutboxFilter {
    /// One row.
    pub id: Option<i64>,
    /// Rows in this state.
    pub state: Option<OutboxState>,
    /// Rows on this subject.
    pub subject: Option<String>,
    /// The row with this message id.
    pub message_id: Option<String>,
    /// Rows created in this range.
    pub created: TimeRange,
}

impl OutboxFilter {
    fn condition(&self) -> Condition {
        use outbox_message::Column;
        let mut cond = self.created.condition(Column::CreatedAt);
        if let Some(id) = self.id {
            cond = cond.add(Column::Id.eq(id));
        }
        if let Some(state) = self.state {
            cond = cond.add(state.condition());
        }
        cond = and_eq(cond, Column::Subject, self.subject.as_deref());
        and_eq(cond, Column::MessageId, self.message_id.as_deref())
    }
}

/// A page of outbox rows matching `filter`, newest first, without their
/// payloads and headers (see [`outbox_row`] for a whole row).
///
/// # Errors
/// Database errors.
pub async fn outbox_rows(
    db: &DatabaseConnection,
    filter: &OutboxFilter,
    cursor: Cursor,
) -> Result<Vec<outbox_message::Summary>, DbErr> {
    newest_first::<outbox_message::Entity, _>(
        db,
        filter.condition(),
        outbox_message::Column::Id,
        cursor,
    )
    .await
}

/// One outbox row.
///
/// # Errors
/// Database errors.
pub async fn outbox_row(
    db: &DatabaseConnection,
    id: i64,
) -> Result<Option<outbox_message::Model>, DbErr> {
    outbox_message::Entity::find_by_id(id).one(db).await
}

impl Outbox {
    /// Makes the unpublished rows matching `filter` publishable now, with a
    /// fresh attempt count and no lease (an operator's action: a dead row, or
    /// one backing off, goes again). Published rows are never touched, so a
    /// retry cannot publish an event twice under a new attempt.
    ///
    /// Returns how many rows changed.
    ///
    /// # Errors
    /// Database errors.
    pub async fn retry(db: &DatabaseConnection, filter: &OutboxFilter) -> Result<u64, DbErr> {
        use outbox_message::Column;
        let res = outbox_message::Entity::update_many()
            .col_expr(Column::DeadAt, Expr::value(Option::<DateTime<Utc>>::None))
            .col_expr(Column::Attempts, Expr::value(0))
            .col_expr(Column::NextAttemptAt, Expr::value(Utc::now()))
            .col_expr(Column::LockedBy, Expr::value(Option::<String>::None))
            .col_expr(
                Column::LockedUntil,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .filter(filter.condition().add(OutboxState::unpublished()))
            .exec(db)
            .await?;
        if res.rows_affected > 0 {
            tracing::info!(
                rows = res.rows_affected,
                "outbox rows reset for retry by an operator"
            );
        }
        Ok(res.rows_affected)
    }
}

/// Which inbox markers; every field narrows.
#[derive(Debug, Clone, Default)]
pub struct MarkerFilter {
    /// Markers in this state (at the time the list is taken).
    pub state: Option<ClaimState>,
    /// Markers of this consumer.
    pub consumer: Option<String>,
    /// Markers of this message id.
    pub message_id: Option<String>,
}

/// A page of inbox markers matching `filter` at `now`, newest first,
/// without the messages claims keep.
///
/// # Errors
/// Database errors.
pub async fn markers(
    db: &DatabaseConnection,
    filter: &MarkerFilter,
    cursor: Cursor,
    now: DateTime<Utc>,
) -> Result<Vec<inbox_message::Summary>, DbErr> {
    use inbox_message::Column;
    let mut cond = Condition::all();
    if let Some(state) = filter.state {
        cond = cond.add(state.condition(now));
    }
    let cond = and_eq(cond, Column::Consumer, filter.consumer.as_deref());
    let cond = and_eq(cond, Column::MessageId, filter.message_id.as_deref());
    newest_first::<inbox_message::Entity, _>(db, cond, Column::Id, cursor).await
}

/// Which dead letters; every field narrows.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterFilter {
    /// Dead letters of this consumer.
    pub consumer: Option<String>,
    /// `true`: only replayed ones; `false`: only those not replayed yet.
    pub replayed: Option<bool>,
}

/// A page of dead letters matching `filter`, newest first, without their
/// messages' payloads and headers (see [`dead_letter`]).
///
/// # Errors
/// Database errors.
pub async fn dead_letters(
    db: &DatabaseConnection,
    filter: &DeadLetterFilter,
    cursor: Cursor,
) -> Result<Vec<dead_letter::Summary>, DbErr> {
    use dead_letter::Column;
    let mut cond = and_eq(
        Condition::all(),
        Column::Consumer,
        filter.consumer.as_deref(),
    );
    match filter.replayed {
        Some(true) => cond = cond.add(Column::ReplayedAt.is_not_null()),
        Some(false) => cond = cond.add(Column::ReplayedAt.is_null()),
        None => {}
    }
    newest_first::<dead_letter::Entity, _>(db, cond, Column::Id, cursor).await
}

/// One dead letter.
///
/// # Errors
/// Database errors.
pub async fn dead_letter(
    db: &DatabaseConnection,
    id: i64,
) -> Result<Option<dead_letter::Model>, DbErr> {
    dead_letter::Entity::find_by_id(id).one(db).await
}

/// A dead letter's message as it goes out again: checked to be something
/// NATS can carry, with its original headers (minus an earlier replay's
/// [`REPLAY_OF_HEADER`], which the publisher sets to `subject`).
#[derive(Debug, Clone)]
pub struct Replay {
    /// The consumer that gave up on it; the replay goes to its replay subject.
    pub consumer: String,
    /// The original message id, so the inbox still dedupes it.
    pub message_id: String,
    /// The original subject.
    pub subject: String,
    /// The original payload.
    pub payload: Vec<u8>,
    /// The original headers.
    pub headers: BTreeMap<String, String>,
}

/// Why a dead letter was not replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError<E> {
    /// No dead letter with that id.
    #[error("no dead letter with id {0}")]
    NotFound(i64),
    /// The message had no usable id: a replay would only be dead-lettered again.
    #[error("dead letter {0} has no message id; replaying it would only dead-letter it again")]
    NoMessageId(i64),
    /// The consumer quarantined its claim on the message: a replay would be
    /// terminated again until a person releases the claim.
    #[error(
        "consumer {consumer:?} has quarantined its claim on message {message_id}; a replay would be terminated again. Release it first (POST /api/v1/inbox/{claim}/release) if the effect did not happen"
    )]
    Quarantined {
        /// The consumer.
        consumer: String,
        /// The message.
        message_id: String,
        /// The quarantined marker's id.
        claim: i64,
    },
    /// Replayed before: should its consumer's marker have been pruned since,
    /// a second replay would apply the message again.
    #[error(
        "dead letter {id} was replayed at {at}; replaying it again would apply it twice if its marker was pruned since. Replay with force=true if it must go again"
    )]
    AlreadyReplayed {
        /// The dead letter.
        id: i64,
        /// When it was replayed.
        at: DateTime<Utc>,
    },
    /// The row (perhaps edited by hand) holds an id, subject or header NATS
    /// cannot carry.
    #[error("dead letter {id} has {what} NATS cannot carry; fix or delete it")]
    Uncarriable {
        /// The dead letter.
        id: i64,
        /// What is wrong with it.
        what: String,
    },
    /// The publisher failed; the dead letter stays unreplayed.
    #[error(transparent)]
    Publish(E),
    /// Reading or marking the row failed.
    #[error(transparent)]
    Database(#[from] DbErr),
}

impl DeadLetter<'_> {
    /// Replays dead letter `id`: checks that it can go again, hands the
    /// message to `publish` (which sends it to the consumer's replay subject
    /// and waits for the broker), and only then marks the row replayed. A
    /// crash between the two leaves the row unreplayed; replaying it again is
    /// harmless, as the inbox dedupes on the original message id.
    ///
    /// A dead letter replayed before is refused unless `force` is set.
    ///
    /// # Errors
    /// [`ReplayError`]; nothing is marked then.
    pub async fn replay<E, F, Fut>(
        db: &DatabaseConnection,
        id: i64,
        force: bool,
        publish: F,
    ) -> Result<dead_letter::Model, ReplayError<E>>
    where
        F: FnOnce(Replay) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let row = dead_letter(db, id)
            .await?
            .ok_or(ReplayError::NotFound(id))?;
        if let Some(at) = row.replayed_at
            && !force
        {
            return Err(ReplayError::AlreadyReplayed { id, at });
        }
        let replay = replayable(row)?;
        if let Some(claim) =
            crate::claim::quarantined(db, &replay.message_id, &replay.consumer).await?
        {
            return Err(ReplayError::Quarantined {
                consumer: replay.consumer,
                message_id: replay.message_id,
                claim,
            });
        }
        let message_id = replay.message_id.clone();
        publish(replay).await.map_err(ReplayError::Publish)?;
        dead_letter::Entity::update_many()
            .col_expr(dead_letter::Column::ReplayedAt, Expr::value(Utc::now()))
            .filter(dead_letter::Column::Id.eq(id))
            .exec(db)
            .await?;
        tracing::info!(id, %message_id, force, "dead letter replayed by an operator");
        dead_letter(db, id).await?.ok_or(ReplayError::NotFound(id))
    }

    /// Deletes dead letter `id` (a person decided it needs nothing more).
    /// Returns whether it existed.
    ///
    /// # Errors
    /// Database errors.
    pub async fn delete(db: &DatabaseConnection, id: i64) -> Result<bool, DbErr> {
        let res = dead_letter::Entity::delete_by_id(id).exec(db).await?;
        if res.rows_affected > 0 {
            tracing::info!(id, "dead letter deleted by an operator");
        }
        Ok(res.rows_affected > 0)
    }
}

/// The message of dead letter `row`, if NATS can carry it again.
fn replayable<E>(row: dead_letter::Model) -> Result<Replay, ReplayError<E>> {
    let id = row.id;
    let uncarriable = |what: String| ReplayError::Uncarriable { id, what };
    let message_id = row.message_id.ok_or(ReplayError::NoMessageId(id))?;
    if check_message_id(&message_id).is_err() {
        return Err(uncarriable("a message id".into()));
    }
    if row.subject.is_empty() || row.subject.contains(char::is_whitespace) {
        return Err(uncarriable("a subject".into()));
    }
    let mut headers = BTreeMap::new();
    for (name, value) in row.headers.as_object().into_iter().flatten() {
        let Some(value) = value.as_str() else {
            continue;
        };
        if name == REPLAY_OF_HEADER || name == REPLAY_LETTER_HEADER {
            continue;
        }
        if check_header(name, value).is_err() {
            return Err(uncarriable(format!("a header ({name:?})")));
        }
        headers.insert(name.clone(), value.to_owned());
    }
    headers.insert(REPLAY_LETTER_HEADER.to_owned(), id.to_string());
    Ok(Replay {
        consumer: row.consumer,
        message_id,
        subject: row.subject,
        payload: row.payload,
        headers,
    })
}
