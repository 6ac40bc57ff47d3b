//! Pulling: never more messages than the consumer has free slots for.
//!
//! A message JetStream has delivered runs its ack wait from then on. A
//! streaming pull asks for a batch ahead of the slots and keeps up to a
//! batch waiting in the process's buffer; with handlers as long as the ack
//! wait, a buffered message's ack wait runs out before it starts, and
//! JetStream hands a copy to another instance: the two race, and the
//! message spends a delivery on nothing it did. So each pull asks for as
//! many messages as there are free slots, each message takes its slot as it
//! arrives, and nothing waits unheld: a message is either at the server
//! (its ack wait not started) or being handled (in-progress acks).
//!
//! A pull stays open until it has its messages or [`PULL_WAIT`] passes;
//! one that is partly filled keeps taking new messages into its remaining
//! slots, and the next pull asks for every slot free by then.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{Consumer as PullConsumer, pull};
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{Consumer, log_task_failure};

/// How long a pull waits for messages before it ends and the next one asks
/// again (for every slot free by then).
const PULL_WAIT: Duration = Duration::from_secs(5);

/// Waits for a free slot, then takes every slot free: what the next pull
/// asks for. `None` when `cancel` fires first.
pub(super) async fn free_slots(
    permits: &Arc<Semaphore>,
    cancel: &CancellationToken,
) -> Option<Vec<OwnedSemaphorePermit>> {
    let first = tokio::select! {
        () = cancel.cancelled() => return None,
        p = permits.clone().acquire_owned() => p.expect("semaphore is never closed"),
    };
    let mut slots = vec![first];
    while let Ok(permit) = permits.clone().try_acquire_owned() {
        slots.push(permit);
    }
    Some(slots)
}

/// One pull of `slots.len()` messages: each is handled on a task of
/// `inflight`, holding one of `slots` until it is settled. Returns when
/// the pull is filled, ends unfilled, fails (after a pause) or `cancel`
/// fires; unused slots are freed then.
pub(super) async fn round(
    handler: &Consumer,
    consumer: &PullConsumer<pull::Config>,
    mut slots: Vec<OwnedSemaphorePermit>,
    inflight: &mut JoinSet<()>,
    cancel: &CancellationToken,
) {
    let mut messages = match consumer
        .batch()
        .max_messages(slots.len())
        .expires(PULL_WAIT)
        .messages()
        .await
    {
        Ok(messages) => messages,
        Err(err) => {
            tracing::warn!(error = %err, "pull request failed; retrying");
            tokio::select! {
                () = cancel.cancelled() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            return;
        }
    };
    loop {
        let next = tokio::select! {
            () = cancel.cancelled() => return,
            next = messages.next() => next,
        };
        match next {
            Some(Ok(msg)) => {
                let Some(slot) = slots.pop() else {
                    // The server sends no more than asked for; a message
                    // beyond that is left to its redelivery.
                    tracing::warn!("a pull brought more messages than it asked for");
                    return;
                };
                let this = handler.clone();
                inflight.spawn(async move {
                    this.handle(msg).await;
                    drop(slot);
                });
            }
            Some(Err(err)) => {
                // A status the server ends a pull with (the consumer
                // deleted, a leader change): pause before asking again.
                tracing::warn!(error = %err, "pull ended with an error; pulling again");
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                return;
            }
            None => return,
        }
        while let Some(done) = inflight.try_join_next() {
            log_task_failure(done);
        }
    }
}
