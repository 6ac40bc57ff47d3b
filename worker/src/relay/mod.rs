//! The outbox relay: publishes committed outbox rows to JetStream.
//!
//! Each row is published with `Nats-Msg-Id` = its message id and marked
//! published only after the PubAck. A crash between the two republishes the
//! row after its lease; JetStream's duplicate window drops the copy, which is
//! why the window must be longer than the lease (checked at start-up by
//! [`crate::streams::check_duplicate_window`]).

pub mod wal;

use service::relay::Batch;

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use chrono::{DateTime, Utc};
use futures::future::join_all;
use sea_orm::{DatabaseConnection, DbBackend, DbErr, JsonValue};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use entity::outbox_message;
use service::outbox::{check_header, check_message_id};

pub use service::relay::store::pending_count;

/// Relay settings.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Name of this relay instance, recorded in `locked_by`.
    pub instance: String,
    /// Rows claimed per round.
    pub batch_size: u64,
    /// Rounds in flight at once, so that one batch's database work overlaps
    /// another's publishing instead of the two taking turns.
    pub concurrency: usize,
    /// How long a claim is exclusive; a crashed relay's rows wait this long.
    /// It also bounds a round: no publish starts after the lease has run
    /// out since the round began (a slow key's later rows go back unpublished
    /// and the rows already acknowledged are recorded), so a row is not left
    /// published but unmarked for longer than the lease plus one PubAck.
    pub lease: Duration,
    /// Failed publishes before a row is marked dead.
    pub max_attempts: i32,
    /// Poll interval when nothing wakes the relay.
    pub poll_interval: Duration,
    /// First backoff after a failed publish; doubles per attempt.
    pub retry_base: Duration,
    /// Longest backoff.
    pub retry_max: Duration,
    /// On PostgreSQL, also wake on `LISTEN/NOTIFY` from other processes' commits.
    pub listen: bool,
    /// A point to abort at (crash tests); `None` in production.
    pub fault: Option<crate::FaultPoint>,
    /// The connection's server errors, so a publish refused for lack of
    /// permission records the server's reason (see [`crate::ServerErrors`]).
    pub server_errors: Option<crate::ServerErrors>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            instance: format!("relay-{}", uuid_like()),
            batch_size: 500,
            concurrency: 2,
            lease: Duration::from_secs(30),
            max_attempts: 10,
            poll_interval: Duration::from_secs(1),
            retry_base: Duration::from_millis(200),
            retry_max: Duration::from_secs(60),
            listen: true,
            fault: None,
            server_errors: None,
        }
    }
}

fn uuid_like() -> String {
    format!("{}-{:x}", std::process::id(), rand_suffix())
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows acknowledged by JetStream and marked published.
    pub published: usize,
    /// Rows whose publish failed (attempt recorded).
    pub failed: usize,
    /// Rows that reached the attempt limit in this round.
    pub dead: usize,
    /// Whether the round left publishable rows out for their bytes
    /// (`service::relay::store::BATCH_BYTES`): the next one is due at once.
    pub cut: bool,
}

impl RelayReport {
    /// Whether the next round is due at once rather than after the poll
    /// interval: the batch was full, or cut short by its bytes, so more
    /// rows are likely waiting.
    #[must_use]
    pub fn more_waiting(&self, batch_size: u64) -> bool {
        self.cut || self.claimed as u64 >= batch_size
    }
}

/// Errors that stop a relay round (publish failures are per row, not errors).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The database failed.
    #[error("outbox relay database error: {0}")]
    Database(#[from] DbErr),
}

/// Whether the NATS client is connected now. What is published while it
/// is not stays in the client's buffer, unbounded by anything seawall
/// counts (megabyte events by the hundred during an outage), and goes out
/// on reconnect: the relays publish nothing meanwhile.
pub(crate) fn connected(js: &jetstream::Context) -> bool {
    js.client().connection_state() == async_nats::connection::State::Connected
}

/// Publishes outbox rows to JetStream.
#[derive(Clone)]
pub struct Relay {
    db: DatabaseConnection,
    js: jetstream::Context,
    config: RelayConfig,
    wake: Arc<Notify>,
    /// Numbers the rounds, so each holds its lease under its own owner name.
    rounds: Arc<std::sync::atomic::AtomicU64>,
}

impl Relay {
    /// A relay woken by `wake` (give the same `Notify` to the executor with
    /// [`service::Executor::with_commit_signal`] for in-process wake-ups).
    pub fn new(
        db: DatabaseConnection,
        js: jetstream::Context,
        config: RelayConfig,
        wake: Arc<Notify>,
    ) -> Self {
        Self {
            db,
            js,
            config,
            wake,
            rounds: Arc::default(),
        }
    }

    /// One round: take a batch, publish it (PubAcks pipelined), record each
    /// row's outcome, finish the batch.
    ///
    /// How the batch is held differs by backend (see `Batch`); the round does
    /// not.
    ///
    /// # Errors
    /// A database error; publish failures are recorded on the rows instead.
    // At debug: a round runs every poll interval while the relay is idle,
    // and at info every one would be a trace of its own (an idle relay
    // would export a span a second). Each published row has its own
    // `outbox.publish` span, in the trace of the handler that wrote it.
    #[tracing::instrument(level = "debug", name = "relay.round", skip_all, fields(instance = %self.config.instance))]
    pub async fn relay_once(&self) -> Result<RelayReport, RelayError> {
        let started = std::time::Instant::now();
        let round = self
            .rounds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !connected(&self.js) {
            // Waits for NATS: see `connected`. No row is taken, so none
            // spends an attempt on the outage.
            tracing::debug!("NATS is unreachable: the relay round takes no rows");
            // Still a round that reached the database, as the heartbeat it
            // counts for says.
            self.db.ping().await?;
            return Ok(RelayReport::default());
        }
        let owner = format!("{}#{round}", self.config.instance);
        let mut batch =
            Batch::take(&self.db, owner, self.config.lease, self.config.batch_size).await?;
        let rows = std::mem::take(&mut batch.rows);
        let claimed_in = started.elapsed();
        let mut report = RelayReport {
            claimed: rows.len(),
            cut: batch.cut,
            ..RelayReport::default()
        };
        let published = self.publish(rows, started + self.config.lease).await;
        let published_in = started.elapsed() - claimed_in;
        if report.claimed > 0 {
            crate::FaultPoint::RelayAfterPuback.hit(self.config.fault);
        }
        let unpublished = self.record(&batch, published, &mut report).await?;
        batch.finish(unpublished).await?;
        tracing::debug!(
            rows = report.claimed,
            claim_ms = claimed_in.as_secs_f64() * 1e3,
            publish_ms = published_in.as_secs_f64() * 1e3,
            record_ms = (started.elapsed() - claimed_in - published_in).as_secs_f64() * 1e3,
            "relay batch"
        );
        // Counted once the outcome is durable.
        if report.claimed > 0 {
            metrics::histogram!("seawall_relay_batch_size").record(report.claimed as f64);
        }
        metrics::counter!("seawall_relay_published_total").increment(report.published as u64);
        metrics::counter!("seawall_relay_failed_total").increment(report.failed as u64);
        metrics::counter!("seawall_relay_dead_total").increment(report.dead as u64);
        Ok(report)
    }

    /// Publishes `rows`: rows sharing an ordering key one after another (each
    /// waits for the previous PubAck), everything else in flight at once; no
    /// publish starts after `deadline`.
    async fn publish(
        &self,
        rows: Vec<outbox_message::Model>,
        deadline: std::time::Instant,
    ) -> Vec<ChainResult> {
        let mut chains: BTreeMap<String, Vec<outbox_message::Model>> = BTreeMap::new();
        let mut singles = Vec::new();
        for row in rows {
            match row.ordering_key.clone() {
                Some(key) => chains.entry(key).or_default().push(row),
                None => singles.push(vec![row]),
            }
        }
        join_all(
            chains
                .into_values()
                .chain(singles)
                .map(|chain| self.publish_chain(chain, deadline)),
        )
        .await
    }

    /// Records each chain's outcome on the batch; returns the rows to give
    /// back unpublished.
    async fn record(
        &self,
        batch: &Batch,
        chains: Vec<ChainResult>,
        report: &mut RelayReport,
    ) -> Result<Vec<i64>, RelayError> {
        let mut published = Vec::new();
        let mut unpublished = Vec::new();
        // A failure while NATS is unreachable (it went during the round)
        // spends no attempt.
        let counted = connected(&self.js);
        for chain in chains {
            published.extend(chain.published);
            unpublished.extend(chain.skipped);
            if let Some((row, error)) = chain.failed {
                report.failed += 1;
                let error = explain(self.config.server_errors.as_ref(), &row.subject, error);
                let retry_after = self.backoff(row.attempts);
                if batch
                    .mark_failed(&row, &error, retry_after, self.config.max_attempts, counted)
                    .await?
                {
                    report.dead += 1;
                    tracing::error!(message_id = %row.message_id, subject = %row.subject, %error, "outbox row is dead after its attempt limit");
                } else {
                    tracing::warn!(message_id = %row.message_id, subject = %row.subject, %error, ?retry_after, "publish failed; will retry");
                }
            }
        }
        report.published =
            usize::try_from(batch.mark_published(published).await?).unwrap_or(usize::MAX);
        Ok(unpublished)
    }

    /// Publishes a key's rows one after another, stopping at the first
    /// failure or once `deadline` has passed; the rest are skipped.
    async fn publish_chain(
        &self,
        chain: Vec<outbox_message::Model>,
        deadline: std::time::Instant,
    ) -> ChainResult {
        let mut result = ChainResult::default();
        let mut rows = chain.into_iter().peekable();
        while let Some(mut row) = rows.next_if(|_| std::time::Instant::now() < deadline) {
            // The payload is not needed after publishing: move it, don't copy it.
            let payload = std::mem::take(&mut row.payload);
            match self.publish_row(&row, payload).await {
                Ok(()) => result.published.push(row.id),
                Err(error) => {
                    result.failed = Some((row, error));
                    break;
                }
            }
        }
        result.skipped = rows.map(|r| r.id).collect();
        result
    }

    async fn publish_row(
        &self,
        row: &outbox_message::Model,
        payload: Vec<u8>,
    ) -> Result<(), String> {
        let message = publish_message(row, payload)?;
        let stored = || {
            row.headers
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        };
        send(&self.js, &row.subject, &row.message_id, &stored, message).await?;
        record_lag(row);
        Ok(())
    }

    fn backoff(&self, attempts_so_far: i32) -> Duration {
        let failures = u32::try_from(attempts_so_far.saturating_add(1)).unwrap_or(1);
        service::Backoff::new(self.config.retry_base, self.config.retry_max).delay(failures)
    }

    /// Runs rounds until `cancel` fires, `concurrency` at a time. Rounds follow
    /// each other at once while batches come back full; otherwise the relay
    /// sleeps until this process commits outbox rows, PostgreSQL notifies a
    /// commit elsewhere, or the poll interval passes. Rounds in flight are
    /// finished before returning.
    /// Database trouble is logged and retried after the poll interval; a
    /// relay never gives up on its own.
    pub async fn run(&self, cancel: CancellationToken) {
        let _listener =
            if self.config.listen && self.db.get_database_backend() == DbBackend::Postgres {
                Some(crate::notify::spawn_pg_listener(
                    &self.db,
                    self.wake.clone(),
                    cancel.clone(),
                ))
            } else {
                None
            };
        tracing::info!(instance = %self.config.instance, concurrency = self.config.concurrency, "outbox relay started");
        register_lag();
        join_all((0..self.config.concurrency.max(1)).map(|_| self.lane(&cancel))).await;
        tracing::info!(instance = %self.config.instance, "outbox relay stopped");
    }

    /// One sequence of rounds; [`Relay::run`] runs several side by side.
    async fn lane(&self, cancel: &CancellationToken) {
        loop {
            if cancel.is_cancelled() {
                break;
            }
            let full = match self.relay_once().await {
                Ok(report) => {
                    // Alive and able to reach the database: what the
                    // "no relay running" alert watches.
                    metrics::gauge!("seawall_relay_heartbeat_timestamp_seconds")
                        .set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
                    if report.claimed > 0 {
                        tracing::debug!(?report, "relay round");
                    }
                    report.more_waiting(self.config.batch_size)
                }
                Err(err) => {
                    tracing::warn!(error = %err, "relay round failed; retrying after the poll interval");
                    false
                }
            };
            if full {
                continue;
            }
            tokio::select! {
                () = cancel.cancelled() => break,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(self.config.poll_interval) => {}
            }
        }
    }
}

#[derive(Default)]
struct ChainResult {
    published: Vec<i64>,
    failed: Option<(outbox_message::Model, String)>,
    skipped: Vec<i64>,
}

/// `error`, with the server's own reason in front when it refused the
/// publish for lack of permission (the client only saw a timeout).
pub(crate) fn explain(
    server_errors: Option<&crate::ServerErrors>,
    subject: &str,
    error: String,
) -> String {
    match server_errors.and_then(|errors| errors.publish_violation(subject)) {
        Some(reason) => format!("{reason} ({error})"),
        None => error,
    }
}

/// Exports `seawall_relay_lag_seconds` from a relay's start, empty: a
/// series that first appears with an observation in it is no increase to
/// `rate()`, so the first events a restarted relay publishes (the ones that
/// waited for it) would never reach the lag alert.
pub(crate) fn register_lag() {
    let _ = metrics::histogram!("seawall_relay_lag_seconds");
}

/// Records `seawall_relay_lag_seconds` for a row just acknowledged: the
/// delay since it became publishable, i.e. since it was written, its
/// backoff ended or an operator retried it (`next_attempt_at`). Measured
/// from the write alone, retrying rows that died days ago would read as
/// days of lag while the relay keeps up.
fn record_lag(row: &outbox_message::Model) {
    let since = row.created_at.max(row.next_attempt_at);
    let lag = (Utc::now() - since).num_microseconds().unwrap_or(0).max(0) as f64 / 1e6;
    metrics::histogram!("seawall_relay_lag_seconds").record(lag);
}

/// Builds the NATS message for a row: its headers plus `Nats-Msg-Id`, around
/// `payload` (the row's, handed over by value so it is not copied).
///
/// Rows can be written by hand or by an older build, so everything is checked
/// here rather than trusted (see [`message`]).
///
/// # Errors
/// Why the row cannot be encoded; the relay records it as a failed attempt.
pub fn publish_message(
    row: &outbox_message::Model,
    payload: Vec<u8>,
) -> Result<PublishMessage, String> {
    let headers: Vec<(&str, &str)> = match &row.headers {
        JsonValue::Null => Vec::new(),
        JsonValue::Object(map) => map
            .iter()
            .map(|(name, value)| {
                value
                    .as_str()
                    .map(|value| (name.as_str(), value))
                    .ok_or_else(|| format!("header {name:?} is not a string"))
            })
            .collect::<Result<_, _>>()?,
        other => return Err(format!("headers must be a JSON object, not {other}")),
    };
    message(&row.message_id, headers, row.created_at, payload)
}

/// The NATS message of an event: `headers` plus `Nats-Msg-Id` = `message_id`
/// and `Seawall-Written-At` = `written_at` around `payload`.
///
/// Outbox rows and WAL messages can both be written by hand, so everything
/// is checked here rather than trusted: async-nats panics on a header name
/// with a space or `:` and on values with CR/LF, and a panic would end the
/// relay and then repeat on the same event after every restart.
///
/// # Errors
/// Why the event cannot be encoded.
pub fn message<'a>(
    message_id: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    written_at: DateTime<Utc>,
    payload: impl Into<bytes::Bytes>,
) -> Result<PublishMessage, String> {
    check_message_id(message_id).map_err(|e| e.to_string())?;
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        check_header(name, value).map_err(|e| e.to_string())?;
        let name: HeaderName = name.parse().map_err(|e| format!("header {name:?}: {e}"))?;
        let value: HeaderValue = value.parse().map_err(|e| format!("header {name}: {e}"))?;
        map.insert(name, value);
    }
    map.insert(
        HeaderName::from_static(service::envelope::HEADER_WRITTEN_AT),
        HeaderValue::from(written_at.timestamp_micros()),
    );
    Ok(PublishMessage::build()
        .headers(map)
        .payload(payload.into())
        .message_id(message_id))
}

/// Publishes `message` on `subject` and waits for its PubAck (see
/// [`dispatch`]).
///
/// # Errors
/// The publish or PubAck failure, as text for `last_error`.
pub(crate) async fn send(
    js: &jetstream::Context,
    subject: &str,
    message_id: &str,
    stored: &(dyn Fn() -> BTreeMap<String, String> + Sync),
    message: PublishMessage,
) -> Result<(), String> {
    dispatch(js, subject, message_id, stored, message)
        .await?
        .acknowledged()
        .await
}

/// A publish sent, its PubAck not yet awaited.
pub(crate) struct InFlight {
    ack: PublishAckFuture,
    subject: String,
    span: tracing::Span,
    started: std::time::Instant,
}

impl InFlight {
    /// Waits for the PubAck.
    ///
    /// # Errors
    /// The PubAck failure, as text for `last_error`.
    pub(crate) async fn acknowledged(self) -> Result<(), String> {
        let subject = self.subject;
        self.ack
            .into_future()
            .instrument(self.span)
            .await
            .map_err(|e| format!("PubAck for {subject}: {e}"))?;
        metrics::histogram!("seawall_relay_publish_seconds")
            .record(self.started.elapsed().as_secs_f64());
        Ok(())
    }
}

/// Sends `message` on `subject` inside an `outbox.publish` span: a child of
/// the handler that wrote the event (from its `stored` trace headers), whose
/// own context goes out with the message so the consumer on the other side
/// becomes its child. Traced only when this process exports traces;
/// otherwise the stored trace headers go out as they are, and `stored` is
/// never called. Many can be sent before their PubAcks are awaited.
///
/// # Errors
/// The publish failure, as text for `last_error`.
pub(crate) async fn dispatch(
    js: &jetstream::Context,
    subject: &str,
    message_id: &str,
    stored: &(dyn Fn() -> BTreeMap<String, String> + Sync),
    mut message: PublishMessage,
) -> Result<InFlight, String> {
    let started = std::time::Instant::now();
    let span = tracing::info_span!("outbox.publish", message_id = %message_id, subject = %subject);
    if !span.is_disabled() {
        service::trace::continue_from(&span, &stored());
        for (name, value) in service::trace::headers_of(&span) {
            message = message.header(name.as_str(), value.as_str());
        }
    }
    let ack = js
        .send_publish(subject.to_owned(), message)
        .instrument(span.clone())
        .await
        .map_err(|e| format!("publish to {subject}: {e}"))?;
    Ok(InFlight {
        ack,
        subject: subject.to_owned(),
        span,
        started,
    })
}

#[cfg(test)]
mod tests {
    use super::RelayReport;

    #[test]
    fn a_full_or_cut_batch_makes_the_next_round_due_at_once() {
        let report = |claimed, cut| RelayReport {
            claimed,
            cut,
            ..RelayReport::default()
        };
        assert!(report(500, false).more_waiting(500));
        assert!(report(18, true).more_waiting(500));
        assert!(!report(18, false).more_waiting(500));
        assert!(!report(0, false).more_waiting(500));
    }
}
