//! Recording messages a consumer gave up on. Nothing is terminated at the
//! broker without one of these rows saying why.

use std::collections::BTreeMap;

use chrono::Utc;
use sea_orm::{
    ActiveValue::{NotSet, Set},
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter,
    sea_query::{Expr, OnConflict},
};

use entity::dead_letter;

/// Header of a replayed message that names its original subject. Replays go
/// to the consumer's own replay subject; the consumer hands its handler the
/// original subject from this header.
pub const REPLAY_OF_HEADER: &str = "Seawall-Replay-Of";

/// Header of a replayed message that names the dead letter it was replayed
/// from (its id). The row is marked replayed only once the broker has the
/// message; a replayed copy that fails before that finds the row still
/// open, and this header tells its consumer that the open row is the one
/// being replayed: it closes it and records the new failure.
pub const REPLAY_LETTER_HEADER: &str = "Seawall-Replay-Letter";

const REPLAY_PREFIX: &str = "seawall-replay";

/// The subject that only `consumer`'s durable consumer on `stream` reads,
/// where replays of its dead letters go. A replay on the original subject
/// would reach every consumer of that subject, and one whose marker has been
/// pruned would apply the message a second time.
pub fn replay_subject(stream: &str, consumer: &str) -> String {
    format!("{REPLAY_PREFIX}.{stream}.{consumer}")
}

/// The wildcard a stream captures so that its consumers' replay subjects
/// land in it.
pub fn replay_subjects(stream: &str) -> String {
    format!("{REPLAY_PREFIX}.{stream}.>")
}

/// A message being dead-lettered, as it arrived.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// The consumer that gave up.
    pub consumer: &'a str,
    /// The id, when the message had a usable one.
    pub message_id: Option<&'a str>,
    /// Original subject (replays go back there).
    pub subject: &'a str,
    /// Original payload.
    pub payload: &'a [u8],
    /// Original headers.
    pub headers: &'a BTreeMap<String, String>,
    /// Why: readable, for the person who will look at it.
    pub error: &'a str,
    /// How many deliveries were attempted.
    pub deliveries: i32,
}

/// Whether [`DeadLetter::record`] wrote a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The row is new.
    Written,
    /// The message already has an open dead letter for this consumer (a
    /// copy of it was given up on first, by this process or another): no
    /// second row.
    AlreadyOpen,
}

/// Inserts `row` unless its consumer already has an open dead letter of
/// its message id (the unique index `ux_dead_letter_open`: one open row
/// per (consumer, message id); rows without an id are never held back).
///
/// # Errors
/// The insert's database error.
pub async fn insert_open<C: ConnectionTrait>(
    conn: &C,
    row: dead_letter::ActiveModel,
) -> Result<Recorded, DbErr> {
    let inserted = dead_letter::Entity::insert(row)
        .on_conflict(
            // No target: PostgreSQL and SQLite then skip a row that meets
            // any unique index (a partial one cannot be named as a target
            // without its predicate); MySQL's stand-in is an update of
            // nothing on the duplicate key.
            OnConflict::new()
                .do_nothing_on([dead_letter::Column::Id])
                .to_owned(),
        )
        .exec(conn)
        .await;
    match inserted {
        Ok(_) => Ok(Recorded::Written),
        Err(DbErr::RecordNotInserted) => Ok(Recorded::AlreadyOpen),
        Err(err) => Err(err),
    }
}

impl DeadLetter<'_> {
    /// Inserts the row, unless the message already has an open one for
    /// this consumer (see [`insert_open`]).
    ///
    /// # Errors
    /// The insert's database error; the caller must then not terminate the
    /// message (redelivery will try again).
    pub async fn record<C: ConnectionTrait>(&self, conn: &C) -> Result<Recorded, DbErr> {
        let recorded = insert_open(conn, self.row()?).await?;
        if recorded == Recorded::AlreadyOpen && self.close_replayed_letter(conn).await? {
            return insert_open(conn, self.row()?).await;
        }
        Ok(recorded)
    }

    /// Marks replayed the open dead letter this message was replayed from
    /// ([`REPLAY_LETTER_HEADER`]), if that is the open row of its consumer
    /// and message id: its replay failed before the operator's replay
    /// marked it. `true` when it did. A crash after this leaves the row
    /// marked (it was replayed) and the message unsettled: its redelivery
    /// records the failure.
    async fn close_replayed_letter<C: ConnectionTrait>(&self, conn: &C) -> Result<bool, DbErr> {
        let (Some(letter), Some(message_id)) = (
            self.headers
                .get(REPLAY_LETTER_HEADER)
                .and_then(|id| id.parse::<i64>().ok()),
            self.message_id,
        ) else {
            return Ok(false);
        };
        let closed = dead_letter::Entity::update_many()
            .col_expr(dead_letter::Column::ReplayedAt, Expr::value(Utc::now()))
            .filter(dead_letter::Column::Id.eq(letter))
            .filter(dead_letter::Column::Consumer.eq(self.consumer))
            .filter(dead_letter::Column::MessageId.eq(message_id))
            .filter(dead_letter::Column::ReplayedAt.is_null())
            .exec(conn)
            .await?;
        Ok(closed.rows_affected == 1)
    }

    fn row(&self) -> Result<dead_letter::ActiveModel, DbErr> {
        let headers = serde_json::to_value(self.headers).map_err(|e| DbErr::Json(e.to_string()))?;
        Ok(dead_letter::ActiveModel {
            id: NotSet,
            consumer: Set(self.consumer.to_owned()),
            message_id: Set(self.message_id.map(str::to_owned)),
            subject: Set(self.subject.to_owned()),
            payload: Set(self.payload.to_vec()),
            headers: Set(headers),
            error: Set(self.error.to_owned()),
            deliveries: Set(self.deliveries),
            created_at: Set(Utc::now()),
            replayed_at: Set(None),
        })
    }
}
