//! Holding a delivery: in-progress acks while work runs or while the
//! infrastructure (the database, an effect's target) cannot do the work, so
//! JetStream neither redelivers it nor counts a delivery.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};

use service::classify::Blame;

use super::settle::Handled;
use super::{Consumer, MAX_HOLDS};

/// How often a delivery held for the infrastructure (a resource failure, an
/// outage) tries again: from 0.1 s, doubling, to at most 5 s.
const INFRA_BACKOFF: service::Backoff = service::Backoff {
    base: Duration::from_millis(100),
    max: Duration::from_secs(5),
    jitter: true,
};

/// How long one delivery has met resource failures, or waited for a claim
/// another instance holds.
#[derive(Debug, Default)]
struct Patience {
    /// When it first met one.
    since: Option<tokio::time::Instant>,
    /// Pauses so far.
    holds: u32,
}

impl Patience {
    /// What is left of `patience` from the first time, counting this one.
    fn next(&mut self, patience: Duration) -> Duration {
        let since = *self.since.get_or_insert_with(tokio::time::Instant::now);
        self.holds += 1;
        patience.saturating_sub(since.elapsed())
    }
}

/// What one delivery has waited for so far, without spending a delivery.
#[derive(Debug, Default)]
pub(super) struct Waits {
    /// Outages met while the database answered its probe.
    outages: u32,
    resource: Patience,
    claim: Patience,
}

/// What to do with a delivery after one try.
pub(super) enum Next {
    /// Try it again (it was held meanwhile).
    Again,
    /// The consumer is stopping: leave it to be redelivered.
    Stop,
    /// Tell JetStream what it came to.
    Settle(Handled),
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
        self.hold_quietly(msg, pause).await
    }

    /// The pause before the `waits`-th try of a delivery held for a resource
    /// failure: growing from 0.1 s to at most 5 s, short enough that a lock
    /// released or a disk freed is noticed within seconds. It does not
    /// follow the nak schedule, which spaces a failing message's deliveries
    /// over minutes.
    pub(super) fn resource_pause(&self, waits: u32) -> Duration {
        INFRA_BACKOFF.delay(waits)
    }

    /// Holds a delivery whose try met the infrastructure or another
    /// instance rather than a fault of its own, so that no delivery is
    /// spent on it, or says to settle it:
    /// - an outage that recurs while the database answers its probe (more
    ///   than [`MAX_HOLDS`] times: a read-only database that is no standby,
    ///   or something of the message's own) is held like a resource failure;
    /// - a resource failure is held with growing pauses (at least as long as
    ///   the target asked) up to the infra patience, then counts as failed;
    /// - a claim another instance holds is waited for in pauses of at most
    ///   a few seconds (noticing that instance finish, or its lease end),
    ///   up to the infra patience, then nak'ed as before. A nak spent a
    ///   delivery on another instance's work, and a message whose last
    ///   deliveries went that way could be dead-lettered by one failure.
    pub(super) async fn hold_or_settle(
        &self,
        msg: &jetstream::Message,
        mut handled: Handled,
        waits: &mut Waits,
    ) -> Next {
        if let Handled::Outage(reason) = &handled {
            waits.outages += 1;
            if waits.outages > MAX_HOLDS {
                handled = Handled::Resource(
                    format!(
                        "{reason} (recurring {} times while the database answered)",
                        waits.outages
                    ),
                    None,
                );
            }
        }
        match handled {
            Handled::Resource(reason, retry_after) => {
                self.hold_for_resource(msg, reason, retry_after, &mut waits.resource)
                    .await
            }
            Handled::Held(wait) => {
                let left = waits.claim.next(self.config.infra_patience);
                if left.is_zero() {
                    return Next::Settle(Handled::Held(wait));
                }
                let pause = wait.min(self.resource_pause(waits.claim.holds)).min(left);
                if self.hold_quietly(msg, pause).await {
                    Next::Again
                } else {
                    tracing::info!(
                        "stopping while another instance holds the claim; the delivery will be redelivered"
                    );
                    Next::Stop
                }
            }
            handled => Next::Settle(handled),
        }
    }

    /// The resource part of [`Consumer::hold_or_settle`].
    async fn hold_for_resource(
        &self,
        msg: &jetstream::Message,
        reason: String,
        retry_after: Option<Duration>,
        resource: &mut Patience,
    ) -> Next {
        let left = resource.next(self.config.infra_patience);
        if left.is_zero() {
            return Next::Settle(Handled::failed(format!(
                "{reason} (failing for longer than the infra patience, {:?})",
                self.config.infra_patience
            )));
        }
        if resource.holds == 1 {
            tracing::warn!(
                error = reason,
                "the database or the effect's target cannot do the work now; holding the delivery and trying again"
            );
        }
        let waited = match retry_after {
            // At least as long as the target asked, within what is left of
            // the patience (the message must still be in the stream when it
            // gives up).
            Some(after) => {
                let pause = self.resource_pause(resource.holds).max(after).min(left);
                self.hold_for(msg, pause).await
            }
            None => self.hold(msg, Blame::Resource, resource.holds).await,
        };
        if waited {
            Next::Again
        } else {
            tracing::info!(
                "stopping while the database cannot do the work; the delivery will be redelivered"
            );
            Next::Stop
        }
    }

    /// Holds the delivery for `pause` (in-progress acks), as
    /// [`Consumer::hold_for`] without counting a resource hold; `false`
    /// when the consumer is stopping.
    ///
    /// The first in-progress ack goes out at once: holds start short (0.1 s)
    /// and [`Consumer::keep_alive`] sends its first one only after half an
    /// ack wait, so a run of short holds, each with a try between them,
    /// would otherwise send none and let the ack wait run out (the
    /// delivery then races its own redelivery).
    async fn hold_quietly(&self, msg: &jetstream::Message, pause: Duration) -> bool {
        let hold = async {
            progress(msg).await;
            self.keep_alive(msg, tokio::time::sleep(pause), None).await
        };
        tokio::select! {
            () = self.stopping.cancelled() => false,
            _ = hold => true,
        }
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
