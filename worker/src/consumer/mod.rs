//! The JetStream consumer: messages in, through the inbox, acked by outcome.
//!
//! `Processed` and `Duplicate` are acked (double ack, so a lost ack is
//! noticed); a failure is nak'ed with a delay for redelivery; a message that
//! can never succeed (malformed, no id, rejected by the handler, a business
//! constraint) or whose last allowed delivery failed is written to
//! `dead_letter` with the reason and then terminated. If that row cannot be
//! written, the message is nak'ed instead: nothing is dropped without a row.
//!
//! The give-up point is the application's alone: the durable consumer lets
//! JetStream redeliver without limit, so a delivery that never settles (the
//! process killed on the last one, a handler outliving the ack wait) comes
//! back and is counted here. A database outage is not the message's fault:
//! the consumer pauses as a whole (see `outage`) and the deliveries it holds
//! are kept with in-progress acks, not nak'ed. Nor is a resource failure (the
//! database answers but cannot do the work now: a lock or statement timeout,
//! a full disk, read-only): the delivery is held, with in-progress acks, and
//! tried again with a growing pause until it succeeds or the failure has
//! lasted [`ConsumerConfig::infra_patience`]; only then does it count
//! against the message. Held deliveries keep their place among the
//! consumer's `concurrency`, so a consumer whose every delivery meets such a
//! failure stops pulling until one gets through. It never pulls more
//! messages than it has free places for (see `pull`): a delivered message
//! is always being handled, never waiting with its ack wait running.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use service::classify::Blame;
use service::dead_letter::REPLAY_OF_HEADER;
use service::{ConsumerName, Envelope, HandlerKind, Inbox, Registration};

mod effect;
mod hold;
mod measure;
mod outage;
mod pull;
mod settle;
mod setup;

pub use setup::ConsumerError;

use hold::{Next, Waits};
use outage::Outage;
use settle::Handled;

/// Deliveries beyond the give-up point after which a message that never
/// reached an outcome (each delivery ended by a crash, not by a failure the
/// handler reported) is dead-lettered without running it again: a message
/// that kills its process must not loop forever.
pub const CRASH_ALLOWANCE: i64 = 10;

/// Times one delivery may be held for a database outage, each time after the
/// database answered the probe again, before it is held like a resource
/// failure instead (with [`ConsumerConfig::infra_patience`], after which it
/// counts as the message's own): an error that looks like a lost connection
/// but recurs while the database answers the probe is either a database
/// that refuses the work (read-only without being a standby) or the
/// message's.
const MAX_HOLDS: u32 = 5;

/// How long a stopping consumer still waits for a performed effect to be
/// recorded before it gives the delivery back.
const RECORD_GRACE: Duration = Duration::from_secs(10);

/// Longest subject `dead_letter.subject` holds.
const MAX_SUBJECT_LEN: usize = 255;

/// Consumer settings shared by a worker's consumers.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Stream the consumers read.
    pub stream: String,
    /// How long JetStream waits for an ack before redelivering.
    pub ack_wait: Duration,
    /// Deliveries before a failing message is dead-lettered: the
    /// application's give-up point (JetStream's own limit stays off).
    pub max_deliver: i64,
    /// Messages handled at once per consumer in this process.
    pub concurrency: usize,
    /// Delay of the first nak of a message that failed for a reason of its
    /// own; doubles per delivery (each jittered between half and all of
    /// it), so a failing message's deliveries span minutes and a
    /// downstream's blip of a few seconds does not spend them all.
    pub nak_base: Duration,
    /// Longest nak delay.
    pub nak_max: Duration,
    /// Longest time one delivery may be handled while in-progress acks keep
    /// it from being redelivered; after it the delivery counts as failed.
    pub max_handling: Duration,
    /// How long a resource failure (see [`service::classify::Blame`]) may
    /// keep recurring for one delivery before it counts against the message.
    pub infra_patience: Duration,
    /// A claim-path point to abort at (crash tests); `None` in production.
    pub fault: Option<crate::FaultPoint>,
    /// Which subjects of `stream` the durable consumer reads.
    pub reads: Reads,
    /// The durable consumer's name when it is not the consumer's own: on a
    /// stream another service owns, a name that service's own consumers
    /// cannot have (see `seawall::app`), since creating a durable consumer
    /// that exists updates it.
    pub durable_name: Option<String>,
}

/// Which subjects a consumer's durable JetStream consumer reads: a stream
/// another service owns has no replay subject, and seawall may not add one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reads {
    /// Its subject and its replay subject, on the domain's own stream.
    #[default]
    All,
    /// Its subject alone, on a stream another service owns.
    Deliveries,
    /// Its replay subject alone, on the domain's own stream: where the dead
    /// letters of a consumer of another service's stream are replayed.
    Replays,
}

impl ConsumerConfig {
    /// The defaults for a consumer reading `stream`: a 30 s ack wait, five
    /// deliveries, 16 messages in flight.
    pub fn new(stream: impl Into<String>) -> Self {
        Self {
            stream: stream.into(),
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            concurrency: 16,
            nak_base: Duration::from_secs(10),
            nak_max: Duration::from_secs(300),
            max_handling: Duration::from_secs(300),
            infra_patience: Duration::from_secs(15 * 60),
            fault: None,
            reads: Reads::All,
            durable_name: None,
        }
    }
}

/// Whether a running consumer can take deliveries (see [`Consumer::health`]).
#[derive(Debug, Clone)]
pub struct ConsumerHealth {
    consumer: ConsumerName,
    outage: Arc<Outage>,
}

impl ConsumerHealth {
    /// Why the consumer cannot handle messages now, if it cannot: it is
    /// paused for a database outage and holds its deliveries. A process in
    /// that state is up but not ready.
    pub fn problem(&self) -> Option<String> {
        self.outage.is_down().then(|| {
            format!(
                "consumer {} is paused: the database is unreachable or answers read-only",
                self.consumer
            )
        })
    }
}

/// Runs one registered consumer.
#[derive(Clone)]
pub struct Consumer {
    inbox: Inbox,
    js: jetstream::Context,
    registration: Registration,
    config: ConsumerConfig,
    outage: Arc<Outage>,
    /// Cancelled when [`Consumer::run`] stops: deliveries held for an outage
    /// are then left to JetStream's redelivery instead of held on.
    stopping: CancellationToken,
}

impl Consumer {
    /// A consumer for `registration`.
    pub fn new(
        inbox: Inbox,
        js: jetstream::Context,
        registration: Registration,
        config: ConsumerConfig,
    ) -> Self {
        let inbox = if registration.batched {
            inbox
        } else {
            inbox.without_batching()
        };
        // One delivery at a time in this process too: JetStream's limit
        // of one unacknowledged message holds the others back anyway.
        let config = if registration.ordered {
            ConsumerConfig {
                concurrency: 1,
                ..config
            }
        } else {
            config
        };
        Self {
            inbox,
            js,
            registration,
            config,
            outage: Arc::default(),
            stopping: CancellationToken::new(),
        }
    }

    /// A handle on this consumer's state for readiness probes, kept after
    /// the consumer has moved into its task.
    pub fn health(&self) -> ConsumerHealth {
        ConsumerHealth {
            consumer: self.registration.consumer.clone(),
            outage: Arc::clone(&self.outage),
        }
    }

    /// Pulls and handles messages until `cancel` fires, then stops pulling,
    /// finishes and acks the messages in flight, and returns.
    ///
    /// # Errors
    /// Only set-up failures other than JetStream being unable to answer
    /// (waited out); message failures are handled per message.
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), ConsumerError> {
        let Some(consumer) = self.ensure_waiting(&cancel).await? else {
            return Ok(());
        };
        let permits = Arc::new(Semaphore::new(self.config.concurrency.max(1)));
        let mut inflight = JoinSet::new();
        tracing::info!(consumer = %self.registration.consumer, subject = %self.registration.subject, "consumer started");
        // Present from the start, so "never paused" reads 0 rather than
        // absent, and the first dead letter is an increase from 0 (a series
        // that appears at 1 is no increase to `increase()`).
        metrics::gauge!("seawall_consumer_paused", "consumer" => self.registration.consumer.to_string())
            .set(0.0);
        metrics::counter!("seawall_dead_letters_total", "consumer" => self.registration.consumer.to_string())
            .increment(0);
        let mut puller = pull::Puller::new(
            self,
            &consumer,
            permits.clone(),
            self.config.concurrency.max(1),
        );
        while !cancel.is_cancelled() {
            // While the database is down, stop pulling: messages would only
            // wait in this process with their ack wait running.
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = self.outage.wait(None, self.progress_period(), &cancel) => {}
            }
            puller.round(&mut inflight, &cancel).await;
        }
        self.stopping.cancel();
        while let Some(done) = inflight.join_next().await {
            log_task_failure(done);
        }
        tracing::info!(consumer = %self.registration.consumer, "consumer stopped");
        Ok(())
    }

    /// Handles one delivered message to its ack, nak or term. During a
    /// database outage the delivery is held (in-progress acks) and handled
    /// again once the database answers, without a new delivery.
    pub async fn handle(&self, msg: jetstream::Message) {
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
        let headers = headers_of(&msg);
        let subject = self.original_subject(&msg, &headers);
        // At WARN, so that at the default log level every line logged while
        // handling a message (a failure, a dead letter, a hold) carries its
        // consumer and message id. One span per message costs little next
        // to its transaction; the relay's per-event spans stay at INFO.
        let span = tracing::warn_span!(
            "consume",
            consumer = %self.registration.consumer,
            subject = %subject,
            delivered,
            message_id = tracing::field::Empty,
        );
        service::trace::continue_from(&span, &headers);
        async {
            let envelope =
                Envelope::from_delivery(subject.clone(), headers.clone(), msg.payload.to_vec())
                    .map(|envelope| envelope.redelivered(delivered > 1));
            let message_id = envelope.as_ref().ok().map(|e| e.message_id.to_string());
            if let Some(id) = &message_id {
                // Quoted in text logs: an id is the producer's text, and may
                // hold spaces or `consumer=` of its own.
                tracing::Span::current().record("message_id", id.as_str());
            }
            let mut waits = Waits::default();
            loop {
                if !self.wait_for_database(&msg).await {
                    tracing::info!(
                        "stopping during a database outage; the delivery will be redelivered"
                    );
                    break;
                }
                let handled = match &envelope {
                    Ok(envelope) => {
                        let started = std::time::Instant::now();
                        let handled = self.decide(&msg, envelope, delivered).await;
                        metrics::histogram!("seawall_handler_duration_seconds", "consumer" => self.registration.consumer.to_string())
                            .record(started.elapsed().as_secs_f64());
                        handled
                    }
                    Err(err) => Handled::Failed {
                        reason: format!("unusable message: {err}"),
                        permanent: true,
                    },
                };
                let handled = match self.hold_or_settle(&msg, handled, &mut waits).await {
                    Next::Again => continue,
                    Next::Stop => break,
                    Next::Settle(handled) => handled,
                };
                let settled = self
                    .settle(
                        &msg,
                        handled,
                        &subject,
                        message_id.as_deref(),
                        &headers,
                        delivered,
                    )
                    .await;
                if settled.is_ok() {
                    break;
                }
                self.pause();
            }
        }
        .instrument(span)
        .await;
    }

    /// Runs the registered path for one delivery, with in-progress acks while
    /// it runs and [`ConsumerConfig::max_handling`] as its limit.
    async fn decide(
        &self,
        msg: &jetstream::Message,
        envelope: &Envelope,
        delivered: i64,
    ) -> Handled {
        if delivered > self.max_deliver() + CRASH_ALLOWANCE {
            return Handled::Failed {
                reason: format!(
                    "delivered {delivered} times without an outcome: handling it may be crashing the process"
                ),
                permanent: true,
            };
        }
        let claimer = match &self.registration.kind {
            HandlerKind::Effect(_, policy) => Some(effect::Claimer {
                db: self.inbox.executor().db(),
                consumer: &self.registration.consumer,
                policy,
                fault: self.config.fault,
            }),
            HandlerKind::Transaction(_) => None,
        };
        let handling = async {
            match (&self.registration.kind, &claimer) {
                (HandlerKind::Transaction(handler), _) => {
                    effect::Step::Handled(self.apply(envelope, handler.as_ref()).await)
                }
                (HandlerKind::Effect(effect, _), Some(claimer)) => {
                    claimer.apply(envelope, effect.as_ref()).await
                }
                (HandlerKind::Effect(..), None) => {
                    unreachable!("a claimer is made for every effect")
                }
            }
        };
        match self
            .keep_alive(msg, handling, Some(self.config.max_handling))
            .await
        {
            Some(effect::Step::Handled(handled)) => handled,
            // Performed: never given up while the process lives. Recording
            // it waits for the database (in-progress acks, no deadline);
            // giving up would let a redelivery perform it a second time.
            Some(effect::Step::Performed { guard, result }) => {
                let claimer = claimer.as_ref().expect("only effects are performed");
                let (claim, message_id) = (guard.id(), guard.idempotency_key().to_owned());
                let record = effect::record(claimer, &guard, result, |blame, waits| {
                    self.hold(msg, blame, waits)
                });
                // Bounded only by shutdown: a write that hangs (a lock, a
                // connection gone silent) must not keep a stopping process
                // from exiting.
                let stopped = async {
                    self.stopping.cancelled().await;
                    tokio::time::sleep(RECORD_GRACE).await;
                };
                tokio::select! {
                    handled = self.keep_alive(msg, record, None) => handled.expect("no deadline"),
                    () = stopped => {
                        tracing::error!(
                            claim,
                            message_id,
                            "stopping with an effect performed but not recorded; a redelivery will perform it again under the same idempotency key"
                        );
                        Handled::Outage("stopping before the effect was recorded".into())
                    }
                }
            }
            None => self.past_deadline(msg, envelope).await,
        }
    }

    /// A delivery whose handling outlived [`ConsumerConfig::max_handling`]:
    /// failed, unless its work committed all the same (the deadline passed
    /// during its transaction's `COMMIT`, which went on at the server). The
    /// marker says which, asked once that `COMMIT` has ended (see
    /// [`Inbox::is_recorded_once_settled`]); on a last delivery, a failure
    /// here would dead-letter a message whose work is done.
    async fn past_deadline(&self, msg: &jetstream::Message, envelope: &Envelope) -> Handled {
        let failed = Handled::failed(format!(
            "handling took longer than {:?} (max handling time)",
            self.config.max_handling
        ));
        // An effect's claim row tells the next delivery what happened.
        if !matches!(self.registration.kind, HandlerKind::Transaction(_)) {
            return failed;
        }
        // Unbounded but by shutdown, as recording a performed effect is: a
        // `COMMIT` that hangs (a synchronous standby gone) has an unknown
        // outcome, which no failure may settle.
        let probe = self
            .inbox
            .is_recorded_once_settled(envelope, &self.registration.consumer);
        let probed = tokio::select! {
            probed = self.keep_alive(msg, probe, None) => probed.expect("no deadline"),
            () = self.stopping.cancelled() => {
                return Handled::Outage("stopping while the deadline's outcome is unknown".into());
            }
        };
        match probed {
            Ok(true) => {
                tracing::info!(
                    "the handling deadline passed while the work committed; acknowledging"
                );
                Handled::Done { duplicate: false }
            }
            Ok(false) => failed,
            // The database, not the message: held, and handled again.
            Err(err) if service::classify::is_outage(&err) => Handled::Outage(err.to_string()),
            Err(err) => {
                tracing::debug!(error = %err, "could not ask the marker after the deadline");
                failed
            }
        }
    }

    /// Where replays of this consumer's dead letters arrive.
    pub fn replay_subject(&self) -> String {
        service::dead_letter::replay_subject(
            &self.config.stream,
            self.registration.consumer.as_str(),
        )
    }

    /// The subject the message was first published on: a replay carries it
    /// in a header, since it arrives on this consumer's replay subject.
    fn original_subject(
        &self,
        msg: &jetstream::Message,
        headers: &BTreeMap<String, String>,
    ) -> String {
        match headers.get(REPLAY_OF_HEADER) {
            // Bounded like a subject, so a header written by hand cannot make
            // the dead letter of this message impossible to record.
            Some(original)
                if msg.subject.as_str() == self.replay_subject()
                    && !original.is_empty()
                    && original.len() <= MAX_SUBJECT_LEN
                    && !original.contains(char::is_whitespace) =>
            {
                original.clone()
            }
            _ => msg.subject.to_string(),
        }
    }

    /// The transactional path: the handler behind the inbox marker.
    async fn apply(&self, envelope: &Envelope, handler: &dyn service::Handle<()>) -> Handled {
        match self
            .inbox
            .process(envelope, &self.registration.consumer, handler)
            .await
        {
            Ok(outcome) => Handled::Done {
                duplicate: matches!(outcome, service::Outcome::Duplicate),
            },
            Err(err) => match err.blame() {
                Blame::Outage => Handled::Outage(err.to_string()),
                Blame::Resource => Handled::Resource(err.to_string(), None),
                Blame::Message => Handled::Failed {
                    reason: err.to_string(),
                    permanent: err.is_permanent(),
                },
            },
        }
    }

    fn max_deliver(&self) -> i64 {
        self.config.max_deliver.max(1)
    }
}

/// Logs a message task that panicked or was cancelled; its delivery is
/// redelivered after the ack wait.
fn log_task_failure(done: Result<(), tokio::task::JoinError>) {
    if let Err(err) = done {
        tracing::error!(error = %err, "a message task failed; its delivery will be redelivered");
    }
}

/// Delivery headers as a map (first value per name).
fn headers_of(msg: &jetstream::Message) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    if let Some(headers) = &msg.headers {
        for (name, values) in headers.iter() {
            if let Some(value) = values.first() {
                map.insert(name.to_string(), value.to_string());
            }
        }
    }
    map
}
