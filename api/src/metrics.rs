//! `/metrics` in Prometheus text format.
//!
//! Counters and histograms are recorded where things happen (relay,
//! consumer, executor, sweeper, pruner) through the `metrics` facade; the
//! gauges that describe table state are refreshed from the same
//! [`service::stats`] the dashboard shows, at scrape time, so every number on
//! the dashboard is also a metric.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::AppState;
use crate::error::error_response;

/// How often buffered histogram samples are folded into their buckets.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

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
            ],
        )?
        .set_buckets_for_metric(
            Matcher::Full("seawall_relay_batch_size".into()),
            &[1.0, 5.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0],
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
        "seawall_wal_slot_active",
        "1 while a relay reads the WAL outbox slot (outbox_mode = wal), 0 while none does"
    );
    metrics::describe_gauge!(
        "seawall_wal_retained_bytes",
        "WAL PostgreSQL keeps for the WAL outbox slot, in bytes"
    );
    metrics::describe_gauge!(
        "seawall_wal_behind_bytes",
        "WAL written since the WAL relay's last confirmed position, in bytes"
    );
    metrics::describe_gauge!(
        "seawall_wal_relay_lag_seconds",
        "Age of the transaction the WAL relay published last when it published it"
    );
    metrics::describe_gauge!(
        "seawall_admin_replica_lag_seconds",
        "Age of the last transaction the admin API's read replica replayed (0 when caught up)"
    );
    metrics::counter!("seawall_dead_letters_total").increment(0);
    metrics::counter!("seawall_executor_exhausted_total").increment(0);
    metrics::counter!("seawall_claims_quarantined_total").increment(0);
}

/// Prometheus text: refreshed table gauges plus everything recorded.
#[utoipa::path(get, path = "/metrics", tag = "health", responses((status = 200, description = "Prometheus text format", content_type = "text/plain"), (status = 404, body = crate::ErrorBody, description = "Metrics are not enabled in this process")))]
pub async fn render(State(state): State<AppState>) -> Response {
    let Some(handle) = &state.metrics else {
        return error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            "metrics are not enabled in this process",
        );
    };
    match crate::stats::current(&state).await {
        Ok((stats, replica)) => {
            if let Some(replica) = replica {
                metrics::gauge!("seawall_admin_replica_lag_seconds")
                    .set(replica.lag_seconds.unwrap_or(0.0));
            }
            let g = |status: &'static str, v: u64| {
                metrics::gauge!("seawall_outbox_rows", "status" => status).set(v as f64)
            };
            g("pending", stats.outbox.pending);
            g("published", stats.outbox.published);
            g("dead", stats.outbox.dead);
            let i = |s: &'static str, v: u64| {
                metrics::gauge!("seawall_inbox_rows", "state" => s).set(v as f64)
            };
            i("processed", stats.inbox.processed);
            i("claimed", stats.inbox.claimed);
            i("expired_claim", stats.inbox.expired_claims);
            i("quarantined", stats.inbox.quarantined);
            metrics::gauge!("seawall_dead_letters_open").set(stats.dead_letters as f64);
            for c in &stats.dead_letters_by_consumer {
                metrics::gauge!("seawall_dead_letters_open_by_consumer", "consumer" => c.consumer.clone()).set(c.count as f64);
            }
            metrics::gauge!("seawall_outbox_oldest_pending_age_seconds")
                .set(stats.oldest_pending_age_seconds.unwrap_or(0.0));
            metrics::gauge!("seawall_relay_lag_ms").set(stats.relay_lag_ms.unwrap_or(0.0));
            if let Some(wal) = &stats.wal {
                metrics::gauge!("seawall_wal_slot_active").set(if wal.active { 1.0 } else { 0.0 });
                metrics::gauge!("seawall_wal_retained_bytes").set(wal.retained_bytes as f64);
                metrics::gauge!("seawall_wal_behind_bytes").set(wal.behind_bytes as f64);
            }
            if let Some(last) = stats.throughput.last() {
                metrics::gauge!("seawall_published_current_minute").set(last.published as f64);
                metrics::gauge!("seawall_processed_current_minute").set(last.processed as f64);
            }
        }
        Err(err) => tracing::warn!(error = %err, "metrics: could not refresh table gauges"),
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response()
}
