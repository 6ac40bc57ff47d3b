//! The inbox marker: proof that a consumer handled (or holds a claim on) a message.

use sea_orm::entity::prelude::*;

/// One row per (message id, consumer). The unique index
/// `ix_inbox_message_id_consumer` on those two columns is what decides races;
/// the surrogate `id` only gives rows a cheap, stable order for pagination.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "inbox_message")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub message_id: String,
    pub consumer: String,
    pub received_at: DateTimeUtc,
    /// Null while a two-phase claim is open; set when the effect is done.
    pub processed_at: Option<DateTimeUtc>,
    pub claimed_by: Option<String>,
    pub claimed_at: Option<DateTimeUtc>,
    pub lease_until: Option<DateTimeUtc>,
    pub attempts: i32,
    /// What a completed claim recorded about its effect (free text, optional).
    pub result: Option<String>,
    /// Set when a person must decide whether the effect happened.
    pub quarantined_at: Option<DateTimeUtc>,
    /// Subject of a claimed message (claims only), for its dead letter.
    pub subject: Option<String>,
    /// Payload of a claimed message (claims only), for its dead letter.
    pub payload: Option<Vec<u8>>,
}

/// A marker without the payload a claim keeps: what lists, journeys and the
/// stuck-claim explanations read (see [`crate::outbox_message::Summary`]).
#[derive(Clone, Debug, PartialEq, Eq, DerivePartialModel)]
#[sea_orm(entity = "Entity")]
pub struct Summary {
    pub id: i64,
    pub message_id: String,
    pub consumer: String,
    pub received_at: DateTimeUtc,
    pub processed_at: Option<DateTimeUtc>,
    pub claimed_by: Option<String>,
    pub claimed_at: Option<DateTimeUtc>,
    pub lease_until: Option<DateTimeUtc>,
    pub attempts: i32,
    pub result: Option<String>,
    pub quarantined_at: Option<DateTimeUtc>,
    pub subject: Option<String>,
}

impl From<Model> for Summary {
    fn from(m: Model) -> Self {
        Self {
            id: m.id,
            message_id: m.message_id,
            consumer: m.consumer,
            received_at: m.received_at,
            processed_at: m.processed_at,
            claimed_by: m.claimed_by,
            claimed_at: m.claimed_at,
            lease_until: m.lease_until,
            attempts: m.attempts,
            result: m.result,
            quarantined_at: m.quarantined_at,
            subject: m.subject,
        }
    }
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
