//! Pulling: never a delivered message that nobody holds.
//!
//! A message JetStream has delivered runs its ack wait from then on. A
//! streaming pull asks for a batch ahead of the consumer's slots and keeps
//! up to a batch in the client's buffer, out of reach; with handlers as
//! long as the ack wait, a buffered message's ack wait runs out before it
//! starts, and JetStream hands a copy to another instance: the two race,
//! and the message spends a delivery on nothing it did.
//!
//! So each pull asks for no more messages than there is room for: free
//! slots plus free places in a queue of its own, as long as the consumer's
//! concurrency. Every message is read from the pull as it arrives and goes
//! to a free slot, or else to the queue, where it waits in the open: one
//! that has waited a quarter of an ack wait is marked in progress (in normal
//! running a queued message starts within milliseconds and never is). The
//! queue keeps the slots busy while the next pull makes its round trip.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::{Consumer as PullConsumer, pull};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Consumer, hold, log_task_failure};

/// How long a pull waits for messages before it ends and the next one asks
/// again (for the room there is by then).
const PULL_WAIT: Duration = Duration::from_secs(5);

/// A delivered message waiting for a slot.
struct Queued {
    msg: jetstream::Message,
    /// When it arrived, or was last marked in progress.
    since: Instant,
}

/// The consumer's pulls, its queue and its slots.
pub(super) struct Puller<'a> {
    handler: &'a Consumer,
    consumer: &'a PullConsumer<pull::Config>,
    permits: Arc<Semaphore>,
    queue: VecDeque<Queued>,
    /// Most messages queued: the consumer's concurrency.
    room: usize,
}

impl<'a> Puller<'a> {
    pub(super) fn new(
        handler: &'a Consumer,
        consumer: &'a PullConsumer<pull::Config>,
        permits: Arc<Semaphore>,
        room: usize,
    ) -> Self {
        Self {
            handler,
            consumer,
            permits,
            queue: VecDeque::new(),
            room,
        }
    }

    /// One pull for the room there is: once at least half the queue is
    /// free (so that a pull brings enough to be worth its round trip),
    /// reads its messages as they arrive, starts each on a free slot or
    /// queues it, and starts queued ones as slots free. Returns when the
    /// pull is filled, ends unfilled, fails (after a pause) or `cancel`
    /// fires; queued messages are left to their redelivery then.
    pub(super) async fn round(&mut self, inflight: &mut JoinSet<()>, cancel: &CancellationToken) {
        let mut ticks = tokio::time::interval(self.handler.progress_period());
        let room = loop {
            self.start_queued(inflight);
            let room =
                self.room.saturating_sub(self.queue.len()) + self.permits.available_permits();
            if room >= (self.room / 2).max(1) {
                break room;
            }
            // The queue is more than half full, so not empty.
            tokio::select! {
                () = cancel.cancelled() => return,
                slot = self.permits.clone().acquire_owned() => {
                    drop(slot.expect("semaphore is never closed"));
                }
                _ = ticks.tick() => self.keep_queued().await,
            }
        };
        let mut messages = match self
            .consumer
            .batch()
            .max_messages(room)
            .expires(PULL_WAIT)
            .messages()
            .await
        {
            Ok(messages) => messages,
            Err(err) => {
                tracing::warn!(error = %err, "pull request failed; retrying");
                pause(cancel).await;
                return;
            }
        };
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                next = messages.next() => match next {
                    Some(Ok(msg)) => {
                        self.queue.push_back(Queued { msg, since: Instant::now() });
                        self.start_queued(inflight);
                    }
                    Some(Err(err)) => {
                        // A status the server ends a pull with (the
                        // consumer deleted, a leader change): pause first.
                        tracing::warn!(error = %err, "pull ended with an error; pulling again");
                        pause(cancel).await;
                        return;
                    }
                    None => return,
                },
                slot = self.permits.clone().acquire_owned(), if !self.queue.is_empty() => {
                    drop(slot.expect("semaphore is never closed"));
                    self.start_queued(inflight);
                }
                _ = ticks.tick(), if !self.queue.is_empty() => self.keep_queued().await,
            }
            while let Some(done) = inflight.try_join_next() {
                log_task_failure(done);
            }
        }
    }

    /// Starts queued messages, oldest first, on the free slots.
    fn start_queued(&mut self, inflight: &mut JoinSet<()>) {
        while !self.queue.is_empty() {
            let Ok(slot) = self.permits.clone().try_acquire_owned() else {
                return;
            };
            let Some(queued) = self.queue.pop_front() else {
                return;
            };
            let this = self.handler.clone();
            // Handling marks it in progress only after half an ack wait:
            // one that waited here a while is marked first.
            let stale = queued.since.elapsed() >= self.handler.progress_period() / 2;
            inflight.spawn(async move {
                if stale {
                    hold::progress(&queued.msg).await;
                }
                this.handle(queued.msg).await;
                drop(slot);
            });
        }
    }

    /// Marks in progress the queued messages that have waited a quarter of
    /// an ack wait since they arrived or were last marked: called every half
    /// ack wait, so no queued message goes more than three quarters of one
    /// unmarked.
    async fn keep_queued(&mut self) {
        let period = self.handler.progress_period() / 2;
        for queued in &mut self.queue {
            if queued.since.elapsed() >= period {
                hold::progress(&queued.msg).await;
                queued.since = Instant::now();
            }
        }
    }
}

/// A second's pause after a failed pull, unless `cancel` fires.
async fn pause(cancel: &CancellationToken) {
    tokio::select! {
        () = cancel.cancelled() => {}
        () = tokio::time::sleep(Duration::from_secs(1)) => {}
    }
}
