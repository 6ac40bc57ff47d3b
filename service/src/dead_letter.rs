//! Recording messages a consumer gave up on. Nothing is terminated at the
//! broker without one of these rows saying why.

use std::collections::BTreeMap;

use chrono::Utc;
use sea_orm::{
    ActiveValue::{NotSet, Set},
    ConnectionTrait, DbErr, EntityTrait,
};

use entity::dead_letter;

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
