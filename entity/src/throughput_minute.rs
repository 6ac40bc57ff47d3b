//! Per-minute counts of published events and processed messages, kept by
//! the relay and the consumers so the dashboard never counts rows.

use sea_orm::entity::prelude::*;

/// One writer's count for one minute: the writers add to it in the
/// transactions that publish or process, each into its own row (its
/// `shard`, the database session), so no row is fought over.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "throughput_minute")]
pub struct Model {
    /// Start of the minute (UTC).
    #[sea_orm(primary_key, auto_increment = false)]
    pub minute: DateTimeUtc,
    /// `published` or `processed`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub tally: String,
    /// The session that counted (PostgreSQL backend pid, MySQL connection
    /// id; 0 on SQLite, which has one writer at a time).
    #[sea_orm(primary_key, auto_increment = false)]
    pub shard: i64,
    /// How many in that minute, by that session.
    pub n: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
