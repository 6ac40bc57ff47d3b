//! An event written in a business transaction, waiting to reach the broker.

use sea_orm::entity::prelude::*;

/// Rows are inserted in the handler's transaction and later published by the
/// relay. `message_id` travels as `Nats-Msg-Id`, so a republished row is
/// dropped by JetStream's duplicate window instead of reaching consumers twice.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "outbox_message")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub message_id: String,
    pub subject: String,
    pub payload: Vec<u8>,
    /// Extra NATS headers as a JSON object of string to string.
    pub headers: Json,
    /// Rows sharing a key are published in commit order.
    pub ordering_key: Option<String>,
    pub created_at: DateTimeUtc,
    /// Null until JetStream acknowledged the publish.
    pub published_at: Option<DateTimeUtc>,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// Earliest time the relay may try again (backoff after a failure).
    pub next_attempt_at: DateTimeUtc,
    /// Lease held by a relay instance while it publishes the row.
    pub locked_by: Option<String>,
    pub locked_until: Option<DateTimeUtc>,
    /// Set when the attempt limit was reached; the row waits for a person.
    pub dead_at: Option<DateTimeUtc>,
    /// The message whose handling wrote this row (absent outside a handler).
    pub causation_id: Option<String>,
    /// The consumer that handled it.
    pub causation_consumer: Option<String>,
    /// The conversation this row belongs to: carried from the causing
    /// message, or this row's own message id when it starts one.
    pub correlation_id: Option<String>,
}

/// A row without its payload and headers: what lists, journeys and the
/// stuck-row explanations read. A page of 500 rows of a few megabytes each
/// would otherwise read gigabytes to show ids and states; only the detail
/// view reads the whole [`Model`].
#[derive(Clone, Debug, PartialEq, Eq, DerivePartialModel)]
#[sea_orm(entity = "Entity")]
pub struct Summary {
    pub id: i64,
    pub message_id: String,
    pub subject: String,
    pub ordering_key: Option<String>,
    pub created_at: DateTimeUtc,
    pub published_at: Option<DateTimeUtc>,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub next_attempt_at: DateTimeUtc,
    pub locked_by: Option<String>,
    pub locked_until: Option<DateTimeUtc>,
    pub dead_at: Option<DateTimeUtc>,
    pub causation_id: Option<String>,
    pub causation_consumer: Option<String>,
    pub correlation_id: Option<String>,
}

impl From<Model> for Summary {
    fn from(m: Model) -> Self {
        Self {
            id: m.id,
            message_id: m.message_id,
            subject: m.subject,
            ordering_key: m.ordering_key,
            created_at: m.created_at,
            published_at: m.published_at,
            attempts: m.attempts,
            last_error: m.last_error,
            next_attempt_at: m.next_attempt_at,
            locked_by: m.locked_by,
            locked_until: m.locked_until,
            dead_at: m.dead_at,
            causation_id: m.causation_id,
            causation_consumer: m.causation_consumer,
            correlation_id: m.correlation_id,
        }
    }
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
