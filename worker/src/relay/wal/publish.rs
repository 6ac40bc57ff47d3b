//! Publishing a window: its events go out in chains (one per ordering key,
//! one per key-less event); what the broker refuses, what must queue behind
//! a row of the table, and what a stopping relay did not get to are handed
//! to the table, in the same transaction that records the window.

use std::collections::{BTreeMap, HashSet, VecDeque};

use chrono::Utc;
use futures::future::join_all;
use sea_orm::ActiveValue::Set;
use tokio_util::sync::CancellationToken;

use entity::outbox_message;
use service::wal::WalEvent;

use super::reader::Window;
use super::record::{FENCE_CHECK, Fence};
use super::{WalError, WalRelay};

/// A key's (or a key-less event's) publishing outcome in a window.
#[derive(Debug, Default)]
struct Chain {
    /// Message ids of its events JetStream acknowledged, in order.
    acked: Vec<String>,
    /// The first event that failed, its error, and the events after it.
    failed: Option<(WalEvent, String, Vec<WalEvent>)>,
    /// Events not sent because the relay is stopping.
    unsent: Vec<WalEvent>,
}

/// Most events one round sends before awaiting their PubAcks: async-nats
/// lets 5,000 PubAcks be outstanding on a context, and a publish past that
/// waits for a permit only an awaited PubAck gives back, so a larger round
/// would wait for ever. A window of the default 5,000 key-less events is
/// one round (a round of 4,096 made it two, and cost throughput).
const ROUND_LIMIT: usize = 5_000;

/// Rows a window hands to the table, each with the event it came from.
type Rows = Vec<(outbox_message::ActiveModel, WalEvent)>;

impl WalRelay {
    /// Publishes a window's events, hands to the table what the broker
    /// refused (and what must queue behind it), and records the window;
    /// returns once all of that is durable.
    ///
    /// Acknowledged progress is never thrown away. While the broker is
    /// unreachable only the unacknowledged events go again. When the relay
    /// stops in the middle, what it did not get to is handed to the table
    /// and the window recorded as done. When recording fails, the ids
    /// acknowledged stay in memory and the window's next reading skips
    /// them. Either way an acknowledged event is not published again, even
    /// after JetStream's duplicate window has forgotten it.
    pub(super) async fn relay_window(
        &self,
        window: &Window,
        fence: &Fence,
        cancel: &CancellationToken,
    ) -> Result<(), WalError> {
        let mut published = 0usize;
        let events: Vec<WalEvent> = {
            let known = self.unrecorded.lock().unwrap_or_else(|e| e.into_inner());
            window
                .events
                .iter()
                .filter(|e| {
                    let acked = known.contains(&e.message_id);
                    published += usize::from(acked);
                    !acked
                })
                .cloned()
                .collect()
        };
        let mut acked = Vec::new();
        let outcome = self
            .publish_window(events, fence, cancel, &mut published, &mut acked)
            .await;
        let recorded = match outcome {
            Ok(rows) => {
                let reached = (window.end, window.partial);
                self.record(fence, published, rows, &window.undecodable, reached)
                    .await
            }
            Err(err) => Err(err),
        };
        let mut known = self.unrecorded.lock().unwrap_or_else(|e| e.into_inner());
        match recorded {
            Ok(()) => {
                for event in &window.events {
                    known.remove(&event.message_id);
                }
                Ok(())
            }
            // The session that took the slot over publishes the window
            // again itself: what this one remembered is of no use now.
            Err(err @ WalError::Fenced(_)) => {
                known.clear();
                Err(err)
            }
            Err(err) => {
                known.extend(acked);
                Err(err)
            }
        }
    }

    /// Publishes `events` until each is acknowledged, refused, or left for
    /// the table by a stopping relay; returns the rows to hand over.
    /// `published` and `acked` grow as PubAcks come, whatever the outcome.
    async fn publish_window(
        &self,
        mut events: Vec<WalEvent>,
        fence: &Fence,
        cancel: &CancellationToken,
        published: &mut usize,
        acked: &mut Vec<String>,
    ) -> Result<Rows, WalError> {
        let mut attempt = 0u32;
        loop {
            if self.outage.handing_off(&self.js) {
                // NATS has been unreachable past `handoff_after`: the window
                // goes to the table as it is, without trying (see
                // `Outage`), so the slot moves on.
                return self.rows(events, Vec::new());
            }
            let held = service::wal::relay::held_keys(&self.db, &events).await?;
            if !crate::relay::connected(&self.js)
                && !cancel.is_cancelled()
                && events.iter().any(|e| !queues(e, &held))
            {
                // Not sent into the client's buffer (see
                // `crate::relay::connected`): waited out, or handed over.
                // A session fenced off meanwhile learns it here.
                fence.check(self).await?;
                if self.outage.lasted_past(self.config.handoff_after) {
                    return self.rows(events, Vec::new());
                }
                self.wait_for_nats(&mut attempt, cancel).await;
                continue;
            }
            let (mut left, chains) = split(events, &held);
            let mut refused = Vec::new();
            let (chains, fenced) = self.publish_chains(chains, fence, cancel).await;
            let before = acked.len();
            for chain in chains {
                acked.extend(chain.acked);
                left.extend(chain.unsent);
                refused.extend(chain.failed);
            }
            let newly = acked.len() - before;
            if newly > 0 {
                self.outage.over();
            }
            *published += newly;
            metrics::counter!("seawall_relay_published_total").increment(newly as u64);
            if let Some(err) = fenced {
                return Err(err);
            }
            if cancel.is_cancelled() && *published == 0 {
                // Nothing of it is out: the next session reads it again.
                return Err(WalError::Stopped);
            }
            if !refused.is_empty() && !crate::relay::connected(&self.js) && !cancel.is_cancelled() {
                if self.outage.lasted_past(self.config.handoff_after) {
                    return self.rows(left, refused);
                }
                // Stopping during the wait: what is left goes to the table
                // below.
                if self.wait_for_nats(&mut attempt, cancel).await {
                    events = left;
                    for (event, _, rest) in refused {
                        events.push(event);
                        events.extend(rest);
                    }
                    continue;
                }
            }
            if cancel.is_cancelled() && !(left.is_empty() && refused.is_empty()) {
                tracing::info!(
                    events = left.len() + refused.len(),
                    "the WAL relay is stopping: the window's unpublished events go to the outbox table"
                );
            }
            return self.rows(left, refused);
        }
    }

    /// Backs off before the window's next try while NATS is unreachable;
    /// `false` when the relay began stopping instead.
    async fn wait_for_nats(&self, attempt: &mut u32, cancel: &CancellationToken) -> bool {
        *attempt = attempt.saturating_add(1);
        let wait =
            service::Backoff::new(self.config.retry_base, self.config.retry_max).delay(*attempt);
        tracing::warn!(
            ?wait,
            "NATS is unreachable; the WAL window's unacknowledged events go again"
        );
        tokio::select! {
            () = cancel.cancelled() => false,
            () = tokio::time::sleep(wait) => true,
        }
    }

    /// The rows for events handed to the table: those left as they are,
    /// and refused ones with their error, attempt and backoff.
    fn rows(
        &self,
        left: Vec<WalEvent>,
        refused: Vec<(WalEvent, String, Vec<WalEvent>)>,
    ) -> Result<Rows, WalError> {
        let mut rows = Vec::new();
        for event in left {
            rows.push((service::outbox::row_of(event.clone())?, event));
        }
        for (event, error, rest) in refused {
            metrics::counter!("seawall_relay_failed_total").increment(1);
            let error =
                crate::relay::explain(self.config.server_errors.as_ref(), &event.subject, error);
            tracing::warn!(message_id = %event.message_id, subject = %event.subject, %error, "publish refused; the event goes to the outbox table to be retried");
            let mut row = service::outbox::row_of(event.clone())?;
            row.attempts = Set(1);
            row.last_error = Set(Some(error));
            row.next_attempt_at =
                Set(Utc::now() + service::relay::store::span(self.config.retry_base));
            rows.push((row, event));
            for event in rest {
                rows.push((service::outbox::row_of(event.clone())?, event));
            }
        }
        Ok(rows)
    }

    /// Publishes the chains (one key's events, or one key-less event) in
    /// rounds: each round sends the next event of every chain still going,
    /// one after another as a plain publisher does, then awaits their
    /// PubAcks together. A chain stops at its first failure, so a key's
    /// events go out in order and none after a refused one. A round sends
    /// at most [`ROUND_LIMIT`] events; a stopping relay starts no further
    /// round, and a session that cannot tell it still holds the slot
    /// (another took it over: [`WalError::Fenced`], or the database did not
    /// answer) starts none either: that error comes back beside what the
    /// rounds before acknowledged, which is not thrown away.
    async fn publish_chains(
        &self,
        chains: Vec<Vec<WalEvent>>,
        fence: &Fence,
        cancel: &CancellationToken,
    ) -> (Vec<Chain>, Option<WalError>) {
        let mut results: Vec<Chain> = chains.iter().map(|_| Chain::default()).collect();
        let mut queues: Vec<VecDeque<WalEvent>> = chains.into_iter().map(Into::into).collect();
        loop {
            if cancel.is_cancelled() {
                for (result, queue) in results.iter_mut().zip(&mut queues) {
                    result.unsent.extend(queue.drain(..));
                }
                return (results, None);
            }
            if let Err(err) = fence.check(self).await {
                return (results, Some(err));
            }
            let mut round = Vec::new();
            // Twice the check's interval: a round of thousands of events
            // may take longer than one, and a freeze takes far longer.
            let fresh = || fence.fresh(FENCE_CHECK * 2);
            for (i, queue) in queues.iter_mut().enumerate() {
                if round.len() == ROUND_LIMIT || !fresh() {
                    break;
                }
                if results[i].failed.is_none()
                    && let Some(event) = queue.pop_front()
                {
                    let sent = self.dispatch(&event).await;
                    round.push((i, event, sent));
                }
            }
            if round.is_empty() {
                if !fresh() {
                    // Asked again at the top of the loop.
                    continue;
                }
                return (results, None);
            }
            let acks = join_all(round.into_iter().map(|(i, event, sent)| async move {
                let outcome = match sent {
                    Ok(in_flight) => in_flight.acknowledged().await,
                    Err(error) => Err(error),
                };
                (i, event, outcome)
            }))
            .await;
            for (i, event, outcome) in acks {
                match outcome {
                    Ok(()) => results[i].acked.push(event.message_id),
                    Err(error) => {
                        let rest = std::mem::take(&mut queues[i]).into();
                        results[i].failed = Some((event, error, rest));
                    }
                }
            }
        }
    }

    async fn dispatch(&self, event: &WalEvent) -> Result<crate::relay::InFlight, String> {
        let headers = event
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()));
        let message = crate::relay::message(
            &event.message_id,
            headers,
            event.created_at,
            event.payload.clone(),
        )?;
        let stored = || event.headers.clone();
        crate::relay::dispatch(
            &self.js,
            &event.subject,
            &event.message_id,
            &stored,
            message,
        )
        .await
    }
}

/// Whether `event` must queue in the table behind a row of its key.
fn queues(event: &WalEvent, held: &HashSet<String>) -> bool {
    event
        .ordering_key
        .as_ref()
        .is_some_and(|k| held.contains(k))
}

/// Splits `events` into those that must queue in the table behind a held
/// key, and chains to publish: one per ordering key (in order), one per
/// key-less event.
fn split(events: Vec<WalEvent>, held: &HashSet<String>) -> (Vec<WalEvent>, Vec<Vec<WalEvent>>) {
    let mut queued = Vec::new();
    let mut keyed: BTreeMap<String, Vec<WalEvent>> = BTreeMap::new();
    let mut chains = Vec::new();
    for event in events {
        if queues(&event, held) {
            queued.push(event);
            continue;
        }
        match event.ordering_key.clone() {
            Some(key) => keyed.entry(key).or_default().push(event),
            None => chains.push(vec![event]),
        }
    }
    chains.extend(keyed.into_values());
    (queued, chains)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use chrono::Utc;

    use super::*;

    #[test]
    fn held_keys_queue_and_other_keys_chain_in_order() {
        let event = |id: &str, key: Option<&str>| WalEvent {
            message_id: id.into(),
            subject: "s".into(),
            ordering_key: key.map(Into::into),
            headers: BTreeMap::new(),
            payload: bytes::Bytes::new(),
            causation_id: None,
            causation_consumer: None,
            correlation_id: None,
            created_at: Utc::now(),
        };
        let held = HashSet::from(["k1".to_owned()]);
        let (queued, chains) = split(
            vec![
                event("a", Some("k1")),
                event("b", Some("k2")),
                event("c", None),
                event("d", Some("k2")),
            ],
            &held,
        );
        assert_eq!(queued.len(), 1);
        let ids: Vec<Vec<&str>> = chains
            .iter()
            .map(|c| c.iter().map(|e| e.message_id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["c"], vec!["b", "d"]]);
    }
}
