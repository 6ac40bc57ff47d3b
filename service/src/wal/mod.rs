//! The outbox in the write-ahead log (`outbox_mode = "wal"`, PostgreSQL):
//! writing the events a transaction records as one logical message
//! ([`emit`]), and the slot's backlog as operators watch it. The encoding
//! itself is [`wire::wal`], re-exported here; the slot's statements are
//! [`slot`]'s, and the relay's own are [`relay`]'s.

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, FromQueryResult, Statement};

pub mod mode;
pub mod relay;
pub mod slot;

pub use wire::wal::*;

/// Writes `content` to the WAL as a transactional logical message of `txn`:
/// decoded for the slot when `txn` commits, never if it rolls back.
///
/// # Errors
/// The database error (on another backend than PostgreSQL, the function
/// does not exist).
pub async fn emit(txn: &DatabaseTransaction, content: Vec<u8>) -> Result<(), DbErr> {
    txn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT pg_logical_emit_message(true, $1, $2)",
        [PREFIX.into(), content.into()],
    ))
    .await?;
    Ok(())
}

/// The WAL relay's backlog as PostgreSQL sees its slot: the slot is the
/// queue, so what it retains is what an operator must watch (an abandoned
/// slot keeps WAL until the disk is full).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, FromQueryResult)]
pub struct Backlog {
    /// The slot.
    pub slot: String,
    /// Whether a relay is reading it now.
    pub active: bool,
    /// WAL the server keeps for it, in bytes (from its restart position).
    pub retained_bytes: i64,
    /// WAL written since the position the relay last confirmed, in bytes:
    /// what is not yet known to be published.
    pub behind_bytes: i64,
    /// How long the relay's latest confirmation took to come back after the
    /// WAL was flushed, in seconds (absent while no relay reads it).
    pub flush_lag_seconds: Option<f64>,
    /// When the slot was last found gone and made again (`wal_slot_loss`),
    /// in seconds since the epoch; absent when it never was.
    pub recreated_at_seconds: Option<f64>,
    /// PostgreSQL's `wal_status` of the slot: `reserved` or `extended`
    /// while its WAL is kept; `unreserved` once it needs more than
    /// `max_slot_wal_keep_size` allows (the next checkpoint may remove
    /// WAL it has not decoded); `lost` once that happened.
    pub wal_status: Option<String>,
}

impl Backlog {
    /// Whether the slot has lost WAL it needs, or may at the next
    /// checkpoint: events written since its confirmed position would then
    /// never be relayed.
    #[must_use]
    pub fn at_risk(&self) -> bool {
        matches!(self.wal_status.as_deref(), Some("unreserved" | "lost"))
    }
}

/// The backlog of `slot`, or `None` when there is no such slot.
///
/// # Errors
/// The query's database error.
pub async fn backlog<C: ConnectionTrait>(db: &C, slot: &str) -> Result<Option<Backlog>, DbErr> {
    Backlog::find_by_statement(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT s.slot_name::text AS slot, s.active,
                COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint AS retained_bytes,
                COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint AS behind_bytes,
                EXTRACT(EPOCH FROM r.flush_lag)::float8 AS flush_lag_seconds,
                (SELECT EXTRACT(EPOCH FROM max(l.recreated_at))::float8
                   FROM wal_slot_loss l WHERE l.slot = s.slot_name::text) AS recreated_at_seconds,
                s.wal_status::text AS wal_status
           FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
          WHERE s.slot_name = $1",
        [slot.into()],
    ))
    .one(db)
    .await
}
