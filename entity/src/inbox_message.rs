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

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
