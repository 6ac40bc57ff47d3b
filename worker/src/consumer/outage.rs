//! A database outage pauses the whole consumer instead of failing messages.
//!
//! When the database is unreachable every message fails, through no fault of
//! its own. Nak'ing them would spend their deliveries (and, on the last one,
//! dead-letter valid messages into a table that cannot be written either).
//! Instead the first task that meets the outage marks it here; the consumer
//! stops pulling, the tasks holding messages keep them with in-progress acks,
//! one probe pings the database with backoff, and everyone resumes when it
//! answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use sea_orm::DatabaseConnection;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Shared by the tasks of one consumer.
#[derive(Debug, Default)]
pub(super) struct Outage {
    down: AtomicBool,
    recovered: Notify,
}

impl Outage {
    /// Marks the database down and, if it was up, starts the probe that
    /// marks it up again once `db.ping()` succeeds.
    pub(super) fn begin(
        self: &Arc<Self>,
        db: DatabaseConnection,
        backoff: service::Backoff,
        consumer: String,
    ) {
        if self.down.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::warn!("database unreachable; pausing the consumer until it answers");
        let paused = metrics::gauge!("seawall_consumer_paused", "consumer" => consumer);
        paused.set(1.0);
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut probes = 0;
            loop {
                probes += 1;
                let delay = backoff.delay(probes);
                tokio::time::sleep(delay).await;
                match service::db::accepts_writes(&db).await {
                    Ok(true) => break,
                    Ok(false) => tracing::debug!(
                        ?delay,
                        "database answers read-only (a standby); still waiting"
                    ),
                    Err(err) => tracing::debug!(error = %err, ?delay, "database still unreachable"),
                }
            }
            this.down.store(false, Ordering::SeqCst);
            paused.set(0.0);
            tracing::info!("database answers again; resuming the consumer");
            this.recovered.notify_waiters();
        });
    }

    /// Whether the consumer is paused for an outage.
    pub(super) fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    /// Returns `true` at once while the database is up; otherwise waits for
    /// it, sending an in-progress ack on `msg` every `period` so JetStream
    /// neither redelivers it nor counts a delivery. Returns `false` if `stop`
    /// fires first.
    pub(super) async fn wait(
        &self,
        msg: Option<&jetstream::Message>,
        period: Duration,
        stop: &CancellationToken,
    ) -> bool {
        loop {
            // Created before the check, so a recovery in between still wakes it.
            let recovered = self.recovered.notified();
            if !self.down.load(Ordering::SeqCst) {
                return true;
            }
            tokio::select! {
                () = recovered => return true,
                () = stop.cancelled() => return false,
                () = tokio::time::sleep(period) => {
                    if let Some(msg) = msg {
                        super::hold::progress(msg).await;
                    }
                }
            }
        }
    }
}
