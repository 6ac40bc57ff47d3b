//! `/api/v1/stats` and `/api/v1/prune`.

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use service::{replica, retention, stats};

use crate::AppState;
use crate::error::{ApiError, ErrorBody};

/// The whole picture, as `seawall stats` prints it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
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
    /// Mean commit-to-publish delay of the last 100 published rows, in milliseconds.
    pub relay_lag_ms: Option<f64>,
    /// Published events and processed messages per minute, oldest first.
    pub throughput: Vec<MinuteCount>,
    /// The WAL relay's slot (`outbox_mode = "wal"`); absent in table mode,
    /// and while the primary cannot be read (the rest comes from the replica).
    pub wal: Option<WalBacklog>,
    /// The read replica these numbers come from (`admin_database_url`);
    /// absent when they come from the primary.
    pub replica: Option<ReplicaStatus>,
    /// Which numbers are estimates (large tables on PostgreSQL), e.g. `outbox.published`.
    pub estimated: Vec<String>,
    /// When this was computed.
    pub generated_at: DateTime<Utc>,
}

/// Outbox rows by state.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OutboxCounts {
    pub pending: u64,
    pub published: u64,
    pub dead: u64,
}

/// Inbox markers by state.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct InboxCounts {
    pub processed: u64,
    /// Open claims with a live lease.
    pub claimed: u64,
    /// Open claims whose lease ran out or was released.
    pub expired_claims: u64,
    pub quarantined: u64,
}

/// A count for one consumer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ConsumerCount {
    pub consumer: String,
    pub count: i64,
}

/// The WAL relay's backlog: the slot is the queue.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WalBacklog {
    /// The replication slot.
    pub slot: String,
    /// Whether a relay reads it now (none: WAL piles up until one does).
    pub active: bool,
    /// WAL the server keeps for the slot, in bytes.
    pub retained_bytes: i64,
    /// WAL written since the relay's last confirmed position, in bytes.
    pub behind_bytes: i64,
    /// Delay of the relay's confirmations, in seconds.
    pub flush_lag_seconds: Option<f64>,
}

/// The read replica the stats and lists come from.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReplicaStatus {
    /// It still replays a primary's WAL (false once promoted).
    pub in_recovery: bool,
    /// Its WAL receiver streams from a primary: false when none runs (the
    /// primary is down or unreachable); absent once promoted or when the
    /// database role may not see the receiver.
    pub streaming: Option<bool>,
    /// Age of the last transaction it replayed, in seconds; 0 when it has
    /// replayed all it received.
    pub lag_seconds: Option<f64>,
    /// WAL the primary wrote that it has not replayed, in bytes (absent
    /// while the primary is down).
    pub behind_bytes: Option<i64>,
}

impl From<replica::ReplicaStatus> for ReplicaStatus {
    fn from(r: replica::ReplicaStatus) -> Self {
        Self {
            in_recovery: r.in_recovery,
            streaming: r.streaming,
            lag_seconds: r.lag_seconds,
            behind_bytes: r.behind_bytes,
        }
    }
}

/// One minute of throughput.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MinuteCount {
    /// Start of the minute (UTC).
    pub minute: DateTime<Utc>,
    /// Outbox rows published in it.
    pub published: u64,
    /// Inbox markers processed in it.
    pub processed: u64,
}

impl From<stats::Stats> for Stats {
    fn from(s: stats::Stats) -> Self {
        Self {
            outbox: OutboxCounts {
                pending: s.outbox.pending,
                published: s.outbox.published,
                dead: s.outbox.dead,
            },
            inbox: InboxCounts {
                processed: s.inbox.processed,
                claimed: s.inbox.claimed,
                expired_claims: s.inbox.expired_claims,
                quarantined: s.inbox.quarantined,
            },
            dead_letters: s.dead_letters,
            dead_letters_by_consumer: s
                .dead_letters_by_consumer
                .into_iter()
                .map(|c| ConsumerCount {
                    consumer: c.consumer,
                    count: c.count,
                })
                .collect(),
            oldest_pending_age_seconds: s.oldest_pending_age_seconds,
            relay_lag_ms: s.relay_lag_ms,
            throughput: s
                .throughput
                .into_iter()
                .map(|m| MinuteCount {
                    minute: m.minute,
                    published: m.published,
                    processed: m.processed,
                })
                .collect(),
            wal: s.wal.map(|w| WalBacklog {
                slot: w.slot,
                active: w.active,
                retained_bytes: w.retained_bytes,
                behind_bytes: w.behind_bytes,
                flush_lag_seconds: w.flush_lag_seconds,
            }),
            replica: None,
            estimated: s.estimated,
            generated_at: s.generated_at,
        }
    }
}

/// What a prune removed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PruneReport {
    /// Inbox markers.
    pub inbox: u64,
    /// Published outbox rows.
    pub outbox: u64,
}

impl From<retention::PruneReport> for PruneReport {
    fn from(r: retention::PruneReport) -> Self {
        Self {
            inbox: r.inbox,
            outbox: r.outbox,
        }
    }
}

/// Counts by table and state, relay lag, dead letters by consumer, and
/// throughput over the last minutes.
#[utoipa::path(get, path = "/api/v1/stats", tag = "stats",
    responses((status = 200, body = Stats), (status = 401, body = ErrorBody)))]
pub async fn get_stats(State(state): State<AppState>) -> Result<Json<Stats>, ApiError> {
    let (stats, replica) = current(&state).await?;
    let mut body: Stats = stats.into();
    body.replica = replica.map(Into::into);
    Ok(Json(body))
}

/// The stats as the API and `/metrics` show them: read from the replica
/// when one is configured, except the WAL slot, which only the primary has.
///
/// # Errors
/// The replica's (or, without one, the primary's) database error.
pub(crate) async fn current(
    state: &AppState,
) -> Result<(stats::Stats, Option<replica::ReplicaStatus>), sea_orm::DbErr> {
    let wal_slot = state.config.wal_slot.as_deref();
    let now = Utc::now();
    let Some(reads) = &state.reads else {
        return Ok((stats::stats(&state.db, now, wal_slot).await?, None));
    };
    let mut stats = stats::stats(reads, now, None).await?;
    if let Some(slot) = wal_slot {
        stats.wal =
            replica::ask_primary("stats (WAL slot)", service::wal::backlog(&state.db, slot))
                .await
                .flatten();
    }
    let replica = replica::status(reads, &state.db).await?;
    Ok((stats, replica))
}

/// Runs retention pruning now and returns how many rows it removed.
#[utoipa::path(post, path = "/api/v1/prune", tag = "stats",
    responses((status = 200, body = PruneReport), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn run_prune(
    State(state): State<AppState>,
) -> Result<(axum::Extension<crate::audit::Changed>, Json<PruneReport>), ApiError> {
    let config = state.config.prune.ok_or_else(|| {
        ApiError::Unavailable("no retention is configured for this API process".into())
    })?;
    let report = retention::prune(&state.db, &config, Utc::now()).await?;
    report.record_metrics();
    tracing::info!(?report, "pruned on request");
    let changed = crate::audit::Changed(report.inbox + report.outbox);
    Ok((axum::Extension(changed), Json(report.into())))
}
