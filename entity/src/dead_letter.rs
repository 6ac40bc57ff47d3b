//! A message a consumer gave up on, kept whole so it can be replayed.

use sea_orm::entity::prelude::*;

/// Nothing is dropped silently: every message that is terminated without being
/// processed leaves one of these rows with the reason.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "dead_letter")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub consumer: String,
    /// Absent when the message carried no usable id (one reason to be here).
    pub message_id: Option<String>,
    pub subject: String,
    pub payload: Vec<u8>,
    pub headers: Json,
    pub error: String,
    pub deliveries: i32,
    pub created_at: DateTimeUtc,
    pub replayed_at: Option<DateTimeUtc>,
}

/// A dead letter without its message's payload and headers: what lists and
/// journeys read (see [`crate::outbox_message::Summary`]).
#[derive(Clone, Debug, PartialEq, Eq, DerivePartialModel)]
#[sea_orm(entity = "Entity")]
pub struct Summary {
    pub id: i64,
    pub consumer: String,
    pub message_id: Option<String>,
    pub subject: String,
    pub error: String,
    pub deliveries: i32,
    pub created_at: DateTimeUtc,
    pub replayed_at: Option<DateTimeUtc>,
}

impl From<Model> for Summary {
    fn from(m: Model) -> Self {
        Self {
            id: m.id,
            consumer: m.consumer,
            message_id: m.message_id,
            subject: m.subject,
            error: m.error,
            deliveries: m.deliveries,
            created_at: m.created_at,
            replayed_at: m.replayed_at,
        }
    }
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
