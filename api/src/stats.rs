//! `/api/v1/stats` and `/api/v1/prune`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use sea_orm::DbErr;
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
    /// Mean delay of the last 100 published rows from becoming publishable
    /// (written, backoff over, or retried) to publish, in milliseconds.
    pub relay_lag_ms: Option<f64>,
    /// Published events and processed messages per minute, oldest first.
    pub throughput: Vec<MinuteCount>,
    /// The WAL relay's slot (`outbox_mode = "wal"`); absent in table mode,
    /// and while the primary cannot be read (the rest comes from the replica).
    pub wal: Option<WalBacklog>,
    /// The read replica these numbers come from (`admin_database_url`);
    /// absent when they come from the primary.
    pub replica: Option<ReplicaStatus>,
    /// Each consumer's JetStream backlog (absent for a consumer NATS could
    /// not describe).
    pub consumers: Vec<ConsumerBacklog>,
    /// Which numbers are estimates (large tables on PostgreSQL), e.g. `outbox.published`.
    pub estimated: Vec<String>,
    /// When this was computed (the figures are shared by every caller for
    /// `stats_max_age_ms`, so they may be a few seconds old).
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
    /// When the slot was last found gone (dropped, or invalidated) and made
    /// again, in seconds since the epoch: events committed while it was
    /// gone were not relayed (`wal_slot_loss` says which range).
    pub recreated_at_seconds: Option<f64>,
    /// PostgreSQL's `wal_status` of the slot (`reserved`, `extended`,
    /// `unreserved`: the next checkpoint may remove WAL the relay has not
    /// read, `lost`: it did).
    pub wal_status: Option<String>,
    /// `wal_status` is `unreserved` or `lost`: events written since the
    /// relay's last confirmation may never be relayed.
    pub at_risk: bool,
}

/// A consumer's backlog in JetStream.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ConsumerBacklog {
    /// The consumer (its durable name).
    pub consumer: String,
    /// Messages in the stream it has not been delivered yet.
    pub pending: u64,
    /// Deliveries it has not acknowledged yet (being handled, or lost with
    /// a process that died, until the ack wait redelivers them).
    pub ack_pending: u64,
    /// Deliveries that were redelivered at least once and are not
    /// acknowledged yet.
    pub redelivered: u64,
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
                at_risk: w.at_risk(),
                slot: w.slot,
                active: w.active,
                retained_bytes: w.retained_bytes,
                behind_bytes: w.behind_bytes,
                flush_lag_seconds: w.flush_lag_seconds,
                recreated_at_seconds: w.recreated_at_seconds,
                wal_status: w.wal_status,
            }),
            replica: None,
            consumers: Vec::new(),
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
    let snapshot = current(&state).await?;
    let mut body: Stats = snapshot.stats.clone().into();
    body.replica = snapshot.replica.clone().map(Into::into);
    body.consumers.clone_from(&snapshot.consumers);
    Ok(Json(body))
}

/// How long the questions to NATS about the consumers' backlogs may take
/// together: the stats answer without them rather than wait for a slow
/// broker.
const BACKLOG_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one reading may take in all. A database that hangs (a lock, a
/// black-holed failover) must not hold every scrape until the request
/// timeout: the scrape would fail as a whole, counters included, and
/// `seawall_stats_up 0` would never be seen. A reading cut off here counts
/// as failed and is shared like one.
const READING_TIMEOUT: Duration = Duration::from_secs(5);

/// One reading of everything the stats page and the table gauges show.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// Counts, lag, throughput and the WAL slot.
    pub stats: stats::Stats,
    /// The read replica's state, when the reads come from one.
    pub replica: Option<replica::ReplicaStatus>,
    /// Each consumer's JetStream backlog (absent for a consumer NATS could
    /// not describe: not created yet, or the broker unreachable).
    pub consumers: Vec<ConsumerBacklog>,
}

/// The last reading of the stats, shared by every caller until it is
/// [`ApiConfig::stats_max_age`](crate::ApiConfig::stats_max_age) old.
///
/// The counts behind `/metrics` and `GET /api/v1/stats` cost a handful of
/// queries on tables of millions of rows; with two Prometheus servers, a
/// dashboard per operator and a load balancer's probes, reading them per
/// request multiplies that cost by the number of watchers. One refresh runs
/// at a time; callers arriving meanwhile wait for it and share its result.
/// A failed refresh is shared too, so a database outage is not asked again
/// by every waiting caller.
#[derive(Debug, Default)]
pub struct Cache {
    last: tokio::sync::Mutex<Option<Reading>>,
}

#[derive(Debug)]
struct Reading {
    taken: Instant,
    result: Result<Arc<Snapshot>, DbErr>,
    /// When a refresh last succeeded (this one or an earlier one).
    last_success: Option<DateTime<Utc>>,
}

/// What `/metrics` renders: the latest reading and whether it is fresh.
pub(crate) struct Observed {
    /// The latest reading, when its refresh succeeded.
    pub snapshot: Option<Arc<Snapshot>>,
    /// When a refresh last succeeded, if ever.
    pub last_success: Option<DateTime<Utc>>,
}

impl Cache {
    /// The reading of at most `max_age`, refreshed through `state` when
    /// older.
    async fn read(
        &self,
        state: &AppState,
    ) -> (Result<Arc<Snapshot>, DbErr>, Option<DateTime<Utc>>) {
        let max_age = state.config.stats_max_age;
        let mut last = self.last.lock().await;
        if let Some(reading) = last.as_ref().filter(|r| r.taken.elapsed() < max_age) {
            return (reading.result.clone(), reading.last_success);
        }
        let result = match tokio::time::timeout(READING_TIMEOUT, refresh(state)).await {
            Ok(result) => result.map(Arc::new),
            Err(_) => Err(DbErr::Custom(format!(
                "the stats reading took longer than {READING_TIMEOUT:?}"
            ))),
        };
        let last_success = match &result {
            Ok(snapshot) => Some(snapshot.stats.generated_at),
            Err(err) => {
                tracing::warn!(error = %err, "stats: could not refresh; /metrics reports seawall_stats_up 0");
                last.as_ref().and_then(|r| r.last_success)
            }
        };
        *last = Some(Reading {
            taken: Instant::now(),
            result: result.clone(),
            last_success,
        });
        (result, last_success)
    }
}

/// The stats as the API shows them (see [`Cache`]).
///
/// # Errors
/// The replica's (or, without one, the primary's) database error.
pub(crate) async fn current(state: &AppState) -> Result<Arc<Snapshot>, DbErr> {
    state.stats.read(state).await.0
}

/// The stats as `/metrics` shows them: a failed refresh is no error but
/// an absent snapshot, so the gauges disappear instead of freezing.
pub(crate) async fn observe(state: &AppState) -> Observed {
    let (result, last_success) = state.stats.read(state).await;
    Observed {
        snapshot: result.ok(),
        last_success,
    }
}

/// Reads the stats from the replica when one is configured, except the
/// WAL slot, which only the primary has; and each consumer's backlog from
/// JetStream.
async fn refresh(state: &AppState) -> Result<Snapshot, DbErr> {
    let wal_slot = state.config.wal_slot.as_deref();
    let now = Utc::now();
    let (stats, replica) = match &state.reads {
        None => (stats::stats(&state.db, now, wal_slot).await?, None),
        Some(reads) => {
            let mut stats = stats::stats(reads, now, None).await?;
            if let Some(slot) = wal_slot {
                stats.wal = replica::ask_primary(
                    "stats (WAL slot)",
                    service::wal::backlog(&state.db, slot),
                )
                .await
                .flatten();
            }
            (stats, replica::status(reads, &state.db).await?)
        }
    };
    Ok(Snapshot {
        stats,
        replica,
        consumers: consumer_backlogs(state).await,
    })
}

/// Each registered consumer's backlog as JetStream counts it: messages not
/// yet delivered and deliveries not yet acknowledged. It is read here, in
/// the API process, rather than by the consumers themselves, so a backlog
/// that grows because every consumer process hangs or is gone still shows.
async fn consumer_backlogs(state: &AppState) -> Vec<ConsumerBacklog> {
    let (Some(js), Some(stream)) = (&state.jetstream, &state.config.stream) else {
        return Vec::new();
    };
    let stream = js.get_stream_no_info(stream).await;
    let Ok(stream) = stream else {
        return Vec::new();
    };
    let mut names: Vec<&String> = state.config.replay_subjects.keys().collect();
    names.sort_unstable();
    let asked = futures::future::join_all(names.iter().map(|name| {
        let stream = &stream;
        async move {
            match tokio::time::timeout(BACKLOG_TIMEOUT, stream.consumer_info(name.as_str())).await {
                Ok(Ok(info)) => Some(ConsumerBacklog {
                    consumer: (*name).clone(),
                    pending: info.num_pending,
                    ack_pending: info.num_ack_pending as u64,
                    redelivered: info.num_redelivered as u64,
                }),
                Ok(Err(err)) => {
                    tracing::debug!(consumer = %name, error = %err, "stats: no JetStream backlog for this consumer");
                    None
                }
                Err(_) => {
                    tracing::warn!(consumer = %name, "stats: NATS did not describe the consumer in time");
                    None
                }
            }
        }
    }))
    .await;
    let backlogs: Vec<ConsumerBacklog> = asked.into_iter().flatten().collect();
    backlogs
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
