//! Holding a delivery: in-progress acks while work runs or while the
//! infrastructure (the database, an effect's target) cannot do the work, so
//! JetStream neither redelivers it nor counts a delivery.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};

use service::classify::Blame;

use super::Consumer;

/// How often a delivery held for the infrastructure (a resource failure, an
/// outage) tries again: from 0.1 s, doubling, to at most 5 s.
const INFRA_BACKOFF: service::Backoff = service::Backoff {
    base: Duration::from_millis(100),
    max: Duration::from_secs(5),
    jitter: true,
};

/// How long one delivery has met resource failures.
#[derive(Debug, Default)]
pub(super) struct Resource {
    /// When it first met one.
    pub(super) since: Option<tokio::time::Instant>,
    /// Pauses so far.
    pub(super) holds: u32,
}

impl Consumer {
    /// Drives `work` to its end while telling JetStream every half ack wait
    /// that the delivery is still being worked on, so a long handler is not
    /// redelivered to race itself. `None` once `limit` (if any) has passed;
    /// `work` is then dropped (its transaction rolls back).
    pub(super) async fn keep_alive<F: Future>(
        &self,
        msg: &jetstream::Message,
        work: F,
        limit: Option<Duration>,
    ) -> Option<F::Output> {
        let period = self.progress_period();
        let deadline = async {
            match limit {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tokio::pin!(work, deadline);
        loop {
            tokio::select! {
                out = &mut work => return Some(out),
                () = &mut deadline => return None,
                _ = ticks.tick() => progress(msg).await,
            }
        }
    }

    pub(super) fn progress_period(&self) -> Duration {
        (self.config.ack_wait / 2).max(Duration::from_millis(10))
    }

    /// Returns once the database is up (at once, normally), holding `msg`
    /// meanwhile; `false` if the consumer is stopping while it is down.
    pub(super) async fn wait_for_database(&self, msg: &jetstream::Message) -> bool {
        self.outage
            .wait(Some(msg), self.progress_period(), &self.stopping)
            .await
    }

    /// Holds `msg` through a failure of the infrastructure's, the `waits`-th
    /// in a row: until the database answers again for an outage (pausing the
    /// whole consumer), for a growing pause for a resource failure. `false`
    /// when the consumer is stopping.
    pub(super) async fn hold(&self, msg: &jetstream::Message, blame: Blame, waits: u32) -> bool {
        if blame == Blame::Outage {
            self.pause();
            return self.wait_for_database(msg).await;
        }
        let pause = self.resource_pause(waits);
        tracing::debug!(
            ?pause,
            waits,
            "the database cannot do the work now; holding the delivery"
        );
        self.hold_for(msg, pause).await
    }

    /// Holds `msg` for `pause` with in-progress acks, counted in
    /// `seawall_consumer_resource_holds_total`; `false` when the consumer is
    /// stopping.
    pub(super) async fn hold_for(&self, msg: &jetstream::Message, pause: Duration) -> bool {
        metrics::counter!("seawall_consumer_resource_holds_total", "consumer" => self.registration.consumer.to_string()).increment(1);
        tokio::select! {
            () = self.stopping.cancelled() => false,
            _ = self.keep_alive(msg, tokio::time::sleep(pause), None) => true,
        }
    }

    /// The pause before the `waits`-th try of a delivery held for a resource
    /// failure: growing from 0.1 s to at most 5 s, short enough that a lock
    /// released or a disk freed is noticed within seconds. It does not
    /// follow the nak schedule, which spaces a failing message's deliveries
    /// over minutes.
    pub(super) fn resource_pause(&self, waits: u32) -> Duration {
        INFRA_BACKOFF.delay(waits)
    }

    /// Pauses the consumer until the database answers (see `outage`).
    pub(super) fn pause(&self) {
        self.outage.begin(
            self.inbox.executor().db().clone(),
            INFRA_BACKOFF,
            self.registration.consumer.to_string(),
        );
    }
}

/// Resets the delivery's ack wait.
pub(super) async fn progress(msg: &jetstream::Message) {
    if let Err(err) = msg.ack_with(AckKind::Progress).await {
        tracing::debug!(error = %err, "in-progress ack failed");
    }
}
