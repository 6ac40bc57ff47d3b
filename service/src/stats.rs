//! What an operator needs at a glance: counts by table and state, how far
//! behind the relay is, who dead-letters, and recent throughput. Shared by
//! `seawall stats`, the admin API and the Prometheus gauges, so the dashboard
//! and the metrics always agree.

use chrono::{DateTime, Duration, Utc};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, FromQueryResult,
    PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, Statement,
};
use serde::{Deserialize, Serialize};

use entity::{dead_letter, inbox_message, outbox_message};

use crate::rollup::{self, Tally};
use crate::state::{ClaimState, OutboxState};

/// Minutes of throughput history reported.
pub const THROUGHPUT_MINUTES: i64 = 15;

/// The whole picture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Outbox rows by state.
    pub outbox: OutboxCounts,
    /// Inbox markers by state.
    pub inbox: InboxCounts,
    /// Dead letters not yet replayed, in all.
    pub dead_letters: u64,
    /// Dead letters not yet replayed, per consumer.
    pub dead_letters_by_consumer: Vec<ConsumerCount>,
    /// Age of the oldest pending outbox row, in seconds (absent when none is pending).
    pub oldest_pending_age_seconds: Option<f64>,
    /// Mean delay of the last 100 published rows from becoming publishable
    /// (written, backoff over, or retried) to publish, in milliseconds.
    pub relay_lag_ms: Option<f64>,
    /// Published events and processed messages per minute, oldest first.
    pub throughput: Vec<MinuteCount>,
    /// The WAL relay's slot (`outbox_mode = "wal"`): absent in table mode.
    pub wal: Option<crate::wal::Backlog>,
    /// Which numbers are estimates (large tables on PostgreSQL), e.g. `outbox.published`.
    pub estimated: Vec<String>,
    /// When this was computed.
    pub generated_at: DateTime<Utc>,
}

/// Outbox rows by state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxCounts {
    pub pending: u64,
    pub published: u64,
    pub dead: u64,
}

/// Inbox markers by state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxCounts {
    pub processed: u64,
    /// Open claims with a live lease.
    pub claimed: u64,
    /// Open claims whose lease ran out or was released.
    pub expired_claims: u64,
    pub quarantined: u64,
}

/// A count for one consumer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, FromQueryResult)]
pub struct ConsumerCount {
    pub consumer: String,
    pub count: i64,
}

/// One minute of throughput.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MinuteCount {
    /// Start of the minute (UTC).
    pub minute: DateTime<Utc>,
    /// Outbox rows published in it.
    pub published: u64,
    /// Inbox markers processed in it.
    pub processed: u64,
}

/// Computes the stats at `now`, with the backlog of `wal_slot` when the
/// outbox is in WAL mode.
///
/// # Errors
/// The first failing query's error.
pub async fn stats(
    db: &DatabaseConnection,
    now: DateTime<Utc>,
    wal_slot: Option<&str>,
) -> Result<Stats, DbErr> {
    let mut estimated = Vec::new();
    let (outbox, inbox) = counts(db, now, &mut estimated).await?;
    let dead_letters_by_consumer: Vec<ConsumerCount> = dead_letter::Entity::find()
        .select_only()
        .column(dead_letter::Column::Consumer)
        .column_as(dead_letter::Column::Id.count(), "count")
        .filter(dead_letter::Column::ReplayedAt.is_null())
        .group_by(dead_letter::Column::Consumer)
        .order_by_asc(dead_letter::Column::Consumer)
        .into_model()
        .all(db)
        .await?;
    let dead_letters = dead_letters_by_consumer
        .iter()
        .map(|c| u64::try_from(c.count).unwrap_or(0))
        .sum();
    let (oldest_pending_age_seconds, relay_lag_ms) = relay_delays(db, now).await?;
    Ok(Stats {
        outbox,
        inbox,
        dead_letters,
        dead_letters_by_consumer,
        oldest_pending_age_seconds,
        relay_lag_ms,
        throughput: throughput(db, now).await?,
        wal: match wal_slot {
            Some(slot) => crate::wal::backlog(db, slot).await?,
            None => None,
        },
        estimated,
        generated_at: now,
    })
}

/// Rows by state. The two big numbers are exact on small tables and taken
/// from PostgreSQL's row estimate on big ones (an exact count of a million
/// rows costs more than the rest of the page together), named in
/// `estimated`; everything that signals trouble (pending, dead, claims) is
/// always exact.
async fn counts(
    db: &DatabaseConnection,
    now: DateTime<Utc>,
    estimated: &mut Vec<String>,
) -> Result<(OutboxCounts, InboxCounts), DbErr> {
    let outbox_in = |state: OutboxState| {
        outbox_message::Entity::find()
            .filter(state.condition())
            .count(db)
    };
    let markers_in = |state: ClaimState| {
        inbox_message::Entity::find()
            .filter(state.condition(now))
            .count(db)
    };
    let (pending, dead, claimed, expired_claims, quarantined) = futures::try_join!(
        outbox_in(OutboxState::Pending),
        outbox_in(OutboxState::Dead),
        markers_in(ClaimState::Claimed),
        markers_in(ClaimState::Expired),
        markers_in(ClaimState::Quarantined),
    )?;
    let published = match estimated_rows(db, "outbox_message").await? {
        Some(total) => {
            estimated.push("outbox.published".to_owned());
            total.saturating_sub(pending + dead)
        }
        None => outbox_in(OutboxState::Published).await?,
    };
    let processed = match estimated_rows(db, "inbox_message").await? {
        Some(total) => {
            estimated.push("inbox.processed".to_owned());
            total.saturating_sub(claimed + expired_claims + quarantined)
        }
        None => markers_in(ClaimState::Processed).await?,
    };
    let outbox = OutboxCounts {
        pending,
        published,
        dead,
    };
    let inbox = InboxCounts {
        processed,
        claimed,
        expired_claims,
        quarantined,
    };
    Ok((outbox, inbox))
}

/// The age of the oldest pending row in seconds, and the mean delay of the
/// last 100 published rows from becoming publishable (written, backoff
/// over, or retried by an operator) to publish, in milliseconds.
async fn relay_delays(
    db: &DatabaseConnection,
    now: DateTime<Utc>,
) -> Result<(Option<f64>, Option<f64>), DbErr> {
    use outbox_message::Column as O;
    let oldest: Option<DateTime<Utc>> = outbox_message::Entity::find()
        .select_only()
        .column(O::CreatedAt)
        .filter(OutboxState::Pending.condition())
        .order_by_asc(O::Id)
        .into_tuple()
        .one(db)
        .await?;
    // Written, publishable from, published.
    type Times = (DateTime<Utc>, DateTime<Utc>, Option<DateTime<Utc>>);
    let recent: Vec<Times> = outbox_message::Entity::find()
        .select_only()
        .column(O::CreatedAt)
        .column(O::NextAttemptAt)
        .column(O::PublishedAt)
        .filter(OutboxState::Published.condition())
        .order_by_desc(O::PublishedAt)
        .limit(100)
        .into_tuple()
        .all(db)
        .await?;
    let lags: Vec<f64> = recent
        .iter()
        .filter_map(|(created, next_attempt, published)| {
            // From when the row became publishable: a row an operator
            // retried days after it died is not days of relay lag.
            let since = (*created).max(*next_attempt);
            published.map(|p| (p - since).num_microseconds().unwrap_or(0).max(0) as f64 / 1000.0)
        })
        .collect();
    Ok((
        oldest.map(|t| (now - t).num_milliseconds().max(0) as f64 / 1000.0),
        (!lags.is_empty()).then(|| lags.iter().sum::<f64>() / lags.len() as f64),
    ))
}

/// Tables above this many rows get estimated totals on PostgreSQL.
pub const ESTIMATE_ABOVE_ROWS: f64 = 100_000.0;

#[derive(Debug, FromQueryResult)]
struct Estimate {
    rows: f32,
}

/// PostgreSQL's row estimate for `table` when it is large and known.
async fn estimated_rows(db: &DatabaseConnection, table: &str) -> Result<Option<u64>, DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(None);
    }
    let estimate = Estimate::find_by_statement(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT reltuples AS rows FROM pg_class WHERE oid = to_regclass($1)",
        [table.into()],
    ))
    .one(db)
    .await?;
    Ok(estimate
        .map(|e| f64::from(e.rows))
        .filter(|rows| *rows >= ESTIMATE_ABOVE_ROWS)
        .map(|rows| rows as u64))
}

/// The last [`THROUGHPUT_MINUTES`] minutes up to `now`'s, oldest first,
/// from the counts the writers keep (see [`crate::rollup`]).
async fn throughput(
    db: &DatabaseConnection,
    now: DateTime<Utc>,
) -> Result<Vec<MinuteCount>, DbErr> {
    let since = rollup::minute_of(now) - Duration::minutes(THROUGHPUT_MINUTES - 1);
    let counts = rollup::since(db, since).await?;
    let count = |minute: DateTime<Utc>, tally: Tally| {
        counts
            .iter()
            .find(|(m, t, _)| *m == minute && t == tally.as_str())
            .map_or(0, |(_, _, n)| u64::try_from(*n).unwrap_or(0))
    };
    Ok((0..THROUGHPUT_MINUTES)
        .map(|i| {
            let minute = since + Duration::minutes(i);
            MinuteCount {
                minute,
                published: count(minute, Tally::Published),
                processed: count(minute, Tally::Processed),
            }
        })
        .collect())
}
