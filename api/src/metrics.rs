//! `/metrics` in Prometheus text format.
//!
//! Counters and histograms are recorded where things happen (relay,
//! consumer, executor, sweeper, pruner) through the `metrics` facade; the
//! gauges that describe table state come from the same [`service::stats`]
//! reading the dashboard shows (shared for a few seconds, see
//! [`crate::stats::Cache`]), so every number on the dashboard is also a
//! metric.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::AppState;
use crate::error::error_response;

/// How often buffered histogram samples are folded into their buckets.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Buckets of the delays events wait (relay lag, end-to-end latency), in
/// seconds: milliseconds when all is well, minutes during an outage.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
];

/// Buckets of `seawall_inbox_batch_size`: powers of two up to
/// `INBOX_BATCH`'s ceiling.
const INBOX_BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0];

/// Installs the process-wide Prometheus recorder and starts its upkeep task.
/// Call once, early, inside the tokio runtime.
///
/// The recorder buffers every histogram sample (one per published row, per
/// processed message) until upkeep folds them into buckets; without the
/// task a process that nobody scrapes grows by every sample it ever recorded.
///
/// # Errors
/// When a recorder is already installed.
pub fn install() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            &[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0,
            ],
        )?
        // Delays that span a broker outage or a backlog: up to ten minutes.
        .set_buckets_for_metric(
            Matcher::Full("seawall_relay_lag_seconds".into()),
            LATENCY_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("seawall_end_to_end_latency_seconds".into()),
            LATENCY_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("seawall_relay_batch_size".into()),
            &[1.0, 5.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0],
        )?
        // Deliveries per group commit: at most 32 (`INBOX_BATCH`). Without
        // buckets of its own the exporter would render it as a summary,
        // whose quantiles cannot be aggregated across consumers.
        .set_buckets_for_metric(
            Matcher::Full("seawall_inbox_batch_size".into()),
            INBOX_BATCH_BUCKETS,
        )?
        .install_recorder()?;
    describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// The counters the shipped alert rules (`deploy/prometheus/alerts.yml`)
/// watch, described and started at zero: a counter that has never moved is
/// otherwise absent from the scrape, and `increase()` over an absent series
/// says nothing rather than "none yet".
fn describe() {
    metrics::describe_counter!(
        "seawall_dead_letters_total",
        "Messages a consumer gave up on (recorded in dead_letter)."
    );
    metrics::describe_counter!(
        "seawall_executor_exhausted_total",
        "Units of work whose transient errors outlasted the retry policy."
    );
    metrics::describe_counter!(
        "seawall_claims_quarantined_total",
        "Claims the sweeper quarantined after too many abandoned attempts."
    );
    metrics::describe_counter!(
        "seawall_consumer_messages_total",
        "Deliveries handled, by consumer and outcome (processed, duplicate, failed)."
    );
    metrics::describe_gauge!(
        "seawall_consumer_paused",
        "1 while a consumer is paused for a database outage and holds its deliveries, by consumer"
    );
    metrics::describe_gauge!(
        "seawall_relay_heartbeat_timestamp_seconds",
        "Unix time of this process's last relay round that reached the database."
    );
    metrics::describe_gauge!(
        "seawall_wal_relay_lag_seconds",
        "Age of the transaction the WAL relay published last when it published it"
    );
    metrics::describe_histogram!(
        "seawall_relay_lag_seconds",
        metrics::Unit::Seconds,
        "Delay from when an outbox row became publishable (written, its backoff over, or retried by an operator) to its PubAck"
    );
    metrics::describe_histogram!(
        "seawall_handler_duration_seconds",
        metrics::Unit::Seconds,
        "Time one delivery spent in its consumer's handling (the inbox transaction or the claim), by consumer"
    );
    metrics::describe_histogram!(
        "seawall_end_to_end_latency_seconds",
        metrics::Unit::Seconds,
        "Delay from when an event was written (its outbox row or WAL message; the broker's store time for messages from elsewhere) to when a consumer's handling committed, by consumer"
    );
    metrics::describe_counter!(
        "seawall_api_auth_failures_total",
        "Admin API requests refused for a missing or unknown bearer token"
    );
    metrics::describe_gauge!(
        "seawall_schema_unknown_migrations",
        "Migrations the database holds that this release does not know (a newer release's, during a rolling upgrade or after a rollback)"
    );
    metrics::describe_histogram!(
        "seawall_inbox_batch_size",
        "Deliveries committed per inbox transaction (group commit, INBOX_BATCH)"
    );
    metrics::describe_gauge!(
        "seawall_build_info",
        "1, labelled with the running seawall's version"
    );
    metrics::gauge!("seawall_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    metrics::counter!("seawall_dead_letters_total").increment(0);
    metrics::counter!("seawall_executor_exhausted_total").increment(0);
    metrics::counter!("seawall_claims_quarantined_total").increment(0);
    metrics::counter!("seawall_api_auth_failures_total").increment(0);
}

/// Prometheus text: everything this process recorded, plus the table
/// gauges of the latest stats reading (see [`crate::stats::Cache`]).
#[utoipa::path(get, path = "/metrics", tag = "health", responses((status = 200, description = "Prometheus text format", content_type = "text/plain"), (status = 404, body = crate::ErrorBody, description = "Metrics are not enabled in this process")))]
pub async fn render(State(state): State<AppState>) -> Response {
    let Some(handle) = &state.metrics else {
        return error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            "metrics are not enabled in this process",
        );
    };
    let observed = crate::stats::observe(&state).await;
    let mut consumers: Vec<&str> = state
        .config
        .replay_subjects
        .keys()
        .map(String::as_str)
        .collect();
    consumers.sort_unstable();
    let mut text = handle.render();
    text.push_str(&table_gauges(&observed, &consumers));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The table gauges as Prometheus text.
///
/// They are written from the reading itself rather than kept in the
/// recorder, which holds every gauge it was ever given: a failed refresh
/// then leaves them out (`seawall_stats_up 0`) instead of exporting the last
/// values as if they were current, and a consumer whose dead letters were
/// all replayed reads 0 instead of its old count (`consumers`, the
/// registered ones, always have a series).
fn table_gauges(observed: &crate::stats::Observed, consumers: &[&str]) -> String {
    let mut out = Gauges::default();
    reading_gauges(&mut out, observed);
    let Some(snapshot) = &observed.snapshot else {
        return out.text;
    };
    row_count_gauges(&mut out, &snapshot.stats, consumers);
    if let Some(wal) = &snapshot.stats.wal {
        wal_slot_gauges(&mut out, wal);
    }
    if let Some(replica) = &snapshot.replica {
        replica_gauges(&mut out, replica);
    }
    backlog_gauges(&mut out, snapshot, consumers);
    out.text
}

/// Whether the last reading succeeded and when one last did: written even
/// when the reading failed, since they are what tells a dashboard that the
/// other table gauges are missing rather than zero.
fn reading_gauges(out: &mut Gauges, observed: &crate::stats::Observed) {
    out.family(
        "seawall_stats_up",
        "1 when the last reading of the table statistics succeeded; 0 while the database (or replica) cannot be read, and the table gauges are left out",
    );
    out.sample(
        &[],
        if observed.snapshot.is_some() {
            1.0
        } else {
            0.0
        },
    );
    if let Some(at) = observed.last_success {
        out.family(
            "seawall_stats_last_success_timestamp_seconds",
            "Unix time of the last successful reading of the table statistics",
        );
        out.sample(&[], at.timestamp_millis() as f64 / 1000.0);
    }
}

/// The outbox, inbox and dead-letter counts and the oldest pending row's
/// age: the numbers the dashboard's counters show, so that an alert can
/// watch them too.
fn row_count_gauges(out: &mut Gauges, stats: &service::stats::Stats, consumers: &[&str]) {
    out.family(
        "seawall_outbox_rows",
        "Outbox rows by status (published may be an estimate on large PostgreSQL tables)",
    );
    out.sample(&[("status", "pending")], stats.outbox.pending as f64);
    out.sample(&[("status", "published")], stats.outbox.published as f64);
    out.sample(&[("status", "dead")], stats.outbox.dead as f64);
    out.family(
        "seawall_inbox_rows",
        "Inbox markers by state (processed may be an estimate on large PostgreSQL tables)",
    );
    out.sample(&[("state", "processed")], stats.inbox.processed as f64);
    out.sample(&[("state", "claimed")], stats.inbox.claimed as f64);
    out.sample(
        &[("state", "expired_claim")],
        stats.inbox.expired_claims as f64,
    );
    out.sample(&[("state", "quarantined")], stats.inbox.quarantined as f64);
    out.family("seawall_dead_letters_open", "Dead letters not replayed yet");
    out.sample(&[], stats.dead_letters as f64);
    out.family(
        "seawall_dead_letters_open_by_consumer",
        "Dead letters not replayed yet, by consumer",
    );
    let mut by_consumer: Vec<(&str, f64)> = consumers.iter().map(|c| (*c, 0.0)).collect();
    for c in &stats.dead_letters_by_consumer {
        match by_consumer.iter_mut().find(|(name, _)| *name == c.consumer) {
            Some((_, count)) => *count = c.count as f64,
            None => by_consumer.push((&c.consumer, c.count as f64)),
        }
    }
    for (consumer, count) in by_consumer {
        out.sample(&[("consumer", consumer)], count);
    }
    out.family(
        "seawall_outbox_oldest_pending_age_seconds",
        "Age of the oldest pending outbox row (0 when none is pending)",
    );
    out.sample(&[], stats.oldest_pending_age_seconds.unwrap_or(0.0));
}

/// The WAL outbox slot's state, only in `outbox_mode = wal`: its events
/// never pass through the outbox table, so a backlog or a loss shows in the
/// slot and not in the row counts.
fn wal_slot_gauges(out: &mut Gauges, wal: &service::wal::Backlog) {
    out.family(
        "seawall_wal_slot_active",
        "1 while a relay reads the WAL outbox slot (outbox_mode = wal), 0 while none does",
    );
    out.sample(&[], if wal.active { 1.0 } else { 0.0 });
    out.family(
        "seawall_wal_retained_bytes",
        "WAL PostgreSQL keeps for the WAL outbox slot, in bytes",
    );
    out.sample(&[], wal.retained_bytes as f64);
    out.family(
        "seawall_wal_behind_bytes",
        "WAL written since the WAL relay's last confirmed position, in bytes",
    );
    out.sample(&[], wal.behind_bytes as f64);
    out.family(
        "seawall_wal_slot_at_risk",
        "1 while PostgreSQL keeps less WAL than the WAL outbox slot needs (wal_status unreserved: the next checkpoint may remove WAL not yet relayed; lost: it did), 0 otherwise",
    );
    out.sample(&[], if wal.at_risk() { 1.0 } else { 0.0 });
    if let Some(at) = wal.recreated_at_seconds {
        out.family(
            "seawall_wal_slot_recreated_timestamp_seconds",
            "When the WAL outbox slot was last found gone and made again (events committed while it was gone were not relayed; see wal_slot_loss)",
        );
        out.sample(&[], at);
    }
}

/// The admin API's read replica, when it reads from one: its numbers are
/// only as current as the replica, so how far behind it is belongs beside
/// them.
fn replica_gauges(out: &mut Gauges, replica: &service::replica::ReplicaStatus) {
    if let Some(streaming) = replica.streaming {
        out.family("seawall_admin_replica_streaming", "1 while the admin API's read replica streams WAL from a primary, 0 while it is cut off (its lag is then unknown and left out)");
        out.sample(&[], if streaming { 1.0 } else { 0.0 });
    }
    // A replica cut off from its primary has replayed all it received,
    // so its lag would read 0: left out instead.
    if let (Some(lag), false) = (replica.lag_seconds, replica.streaming == Some(false)) {
        out.family(
            "seawall_admin_replica_lag_seconds",
            "Age of the last transaction the admin API's read replica replayed (0 when caught up)",
        );
        out.sample(&[], lag);
    }
}

/// Each registered consumer's JetStream backlog, and whether JetStream
/// could describe it: the backlog is the broker's count, so a consumer it
/// could not describe is marked unknown rather than shown as empty.
fn backlog_gauges(out: &mut Gauges, snapshot: &crate::stats::Snapshot, consumers: &[&str]) {
    out.family(
        "seawall_consumer_backlog_known",
        "1 when JetStream described the consumer at the last reading; 0 when it could not (the broker unreachable, the consumer not created yet): its backlog gauges are then left out",
    );
    for consumer in consumers {
        let known = snapshot.consumers.iter().any(|b| b.consumer == *consumer);
        out.sample(&[("consumer", consumer)], if known { 1.0 } else { 0.0 });
    }
    if !snapshot.consumers.is_empty() {
        for (name, help, value) in [
            (
                "seawall_consumer_pending_messages",
                "Messages in the stream not yet delivered to the consumer, as JetStream counts them",
                (|b: &crate::stats::ConsumerBacklog| b.pending)
                    as fn(&crate::stats::ConsumerBacklog) -> u64,
            ),
            (
                "seawall_consumer_ack_pending_messages",
                "Deliveries to the consumer not yet acknowledged, as JetStream counts them",
                |b| b.ack_pending,
            ),
            (
                "seawall_consumer_redelivered_messages",
                "Unacknowledged deliveries to the consumer that are redeliveries",
                |b| b.redelivered,
            ),
        ] {
            out.family(name, help);
            for backlog in &snapshot.consumers {
                out.sample(&[("consumer", &backlog.consumer)], value(backlog) as f64);
            }
        }
    }
}

/// Prometheus text format, written by hand for the gauges the recorder
/// must not keep.
#[derive(Default)]
struct Gauges {
    text: String,
    family: &'static str,
}

impl Gauges {
    fn family(&mut self, name: &'static str, help: &str) {
        use std::fmt::Write as _;
        self.family = name;
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} gauge");
    }

    fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
        use std::fmt::Write as _;
        self.text.push_str(self.family);
        if !labels.is_empty() {
            let labels: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let _ = write!(self.text, "{{{}}}", labels.join(","));
        }
        let _ = writeln!(self.text, " {value}");
    }
}

/// A label value escaped as the text format wants (backslash, quote, newline).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
