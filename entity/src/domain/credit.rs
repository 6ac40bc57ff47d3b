//! Demo domain: one applied credit.

use sea_orm::entity::prelude::*;

/// `reference` is a business key with its own unique index
/// (`ix_credit_reference`), so tests can tell a genuine constraint error apart
/// from an inbox duplicate. `message_id` is deliberately *not* unique: the
/// naive check-then-insert demo relies on that to show double application.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "credit")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub message_id: String,
    pub account_id: String,
    pub amount: i64,
    pub reference: Option<String>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
