//! Recording messages a consumer gave up on. Nothing is terminated at the
//! broker without one of these rows saying why.

use std::collections::BTreeMap;

use chrono::Utc;
use sea_orm::{
    ActiveValue::{NotSet, Set},
    ConnectionTrait, DbErr, EntityTrait,
};

use entity::dead_letter;

/// Header of a replayed message that names its original subject. Replays go
/// to the consumer's own replay subject; the consumer hands its handler the
/// original subject from this header.
pub const REPLAY_OF_HEADER: &str = "Seawall-Replay-Of";

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

impl DeadLetter<'_> {
    /// Inserts the row.
    ///
    /// # Errors
    /// The insert's database error; the caller must then not terminate the
    /// message (redelivery will try again).
    pub async fn record<C: ConnectionTrait>(&self, conn: &C) -> Result<(), DbErr> {
        let headers = serde_json::to_value(self.headers).map_err(|e| DbErr::Json(e.to_string()))?;
        dead_letter::Entity::insert(dead_letter::ActiveModel {
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
        .exec_without_returning(conn)
        .await?;
        Ok(())
    }
}
