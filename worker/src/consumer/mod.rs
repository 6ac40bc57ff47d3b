//! The JetStream consumer: messages in, through the inbox, acked by outcome.
//!
//! `Processed` and `Duplicate` are acked (double ack, so a lost ack is
//! noticed); a failure is nak'ed with a delay for redelivery; a message that
//! can never succeed (malformed, no id, rejected by the handler, a business
//! constraint) or whose last allowed delivery failed is written to
//! `dead_letter` with the reason and then terminated. If that row cannot be
//! written, the message is nak'ed instead: nothing is dropped without a row.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use service::dead_letter::DeadLetter;
use service::{Envelope, HandlerKind, Inbox, Registration};

mod effect;

/// Consumer settings shared by a worker's consumers.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Stream the consumers read.
    pub stream: String,
    /// How long JetStream waits for an ack before redelivering.
    pub ack_wait: Duration,
    /// Deliveries before a failing message is dead-lettered.
    pub max_deliver: i64,
    /// Messages handled at once per consumer in this process.
    pub concurrency: usize,
    /// Delay of the first nak; doubles per delivery.
    pub nak_base: Duration,
    /// Longest nak delay.
    pub nak_max: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            stream: service::credits::CREDITS_STREAM.into(),
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            concurrency: 16,
            nak_base: Duration::from_millis(100),
            nak_max: Duration::from_secs(30),
        }
    }
}

/// Consumer start-up failing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The durable consumer could not be created or read.
    #[error("JetStream consumer {consumer} on stream {stream}: {message}")]
    Setup {
        /// Consumer.
        consumer: String,
        /// Stream.
        stream: String,
        /// Reason.
        message: String,
    },
}

/// Runs one registered consumer.
#[derive(Clone)]
pub struct Consumer {
    inbox: Inbox,
    js: jetstream::Context,
    registration: Registration,
    config: ConsumerConfig,
}

impl Consumer {
    /// A consumer for `registration`.
    pub fn new(
        inbox: Inbox,
        js: jetstream::Context,
        registration: Registration,
        config: ConsumerConfig,
    ) -> Self {
        Self {
            inbox,
            js,
            registration,
            config,
        }
    }

    fn setup_error(&self, message: impl ToString) -> ConsumerError {
        ConsumerError::Setup {
            consumer: self.registration.consumer.to_string(),
            stream: self.config.stream.clone(),
            message: message.to_string(),
        }
    }

    /// Creates or updates the durable pull consumer (shared by every process
    /// running this consumer).
    ///
    /// # Errors
    /// [`ConsumerError::Setup`].
    pub async fn ensure(
        &self,
    ) -> Result<jetstream::consumer::Consumer<pull::Config>, ConsumerError> {
        let stream = self
            .js
            .get_stream(&self.config.stream)
            .await
            .map_err(|e| self.setup_error(e))?;
        let name = self.registration.consumer.to_string();
        stream
            .create_consumer(pull::Config {
                durable_name: Some(name),
                filter_subject: self.registration.subject.clone(),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: self.config.ack_wait,
                max_deliver: self.config.max_deliver,
                max_ack_pending: i64::try_from(self.config.concurrency * 64).unwrap_or(10_000),
                ..Default::default()
            })
            .await
            .map_err(|e| self.setup_error(e))
    }

    /// Pulls and handles messages until `cancel` fires, then stops pulling,
    /// finishes and acks the messages in flight, and returns.
    ///
    /// # Errors
    /// Only set-up failures; message failures are handled per message.
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), ConsumerError> {
        let consumer = self.ensure().await?;
        let permits = Arc::new(Semaphore::new(self.config.concurrency.max(1)));
        let mut inflight = JoinSet::new();
        tracing::info!(consumer = %self.registration.consumer, subject = %self.registration.subject, "consumer started");
        'outer: while !cancel.is_cancelled() {
            let mut messages = match consumer
                .stream()
                .max_messages_per_batch(self.config.concurrency.max(1))
                .messages()
                .await
            {
                Ok(m) => m,
                Err(err) => {
                    tracing::warn!(error = %err, "pull request failed; retrying");
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            loop {
                let permit = tokio::select! {
                    () = cancel.cancelled() => break 'outer,
                    p = permits.clone().acquire_owned() => p.expect("semaphore is never closed"),
                };
                let next = tokio::select! {
                    () = cancel.cancelled() => break 'outer,
                    next = messages.next() => next,
                };
                match next {
                    Some(Ok(msg)) => {
                        let this = self.clone();
                        inflight.spawn(async move {
                            this.handle(msg).await;
                            drop(permit);
                        });
                    }
                    Some(Err(err)) => {
                        tracing::debug!(error = %err, "pull stream error; continuing");
                    }
                    None => break,
                }
                while inflight.try_join_next().is_some() {}
            }
        }
        while inflight.join_next().await.is_some() {}
        tracing::info!(consumer = %self.registration.consumer, "consumer stopped");
        Ok(())
    }

    /// Handles one delivered message to its ack, nak or term.
    pub async fn handle(&self, msg: jetstream::Message) {
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
        let headers = headers_of(&msg);
        let span = tracing::info_span!(
            "consume",
            consumer = %self.registration.consumer,
            subject = %msg.subject,
            delivered,
            message_id = tracing::field::Empty,
            traceparent = headers.get("traceparent").map(String::as_str).unwrap_or(""),
        );
        async {
            let verdict = match Envelope::from_delivery(
                msg.subject.to_string(),
                headers.clone(),
                msg.payload.to_vec(),
            ) {
                Ok(envelope) => {
                    let envelope = envelope.redelivered(delivered > 1);
                    tracing::Span::current().record("message_id", envelope.message_id.as_str());
                    let verdict = match &self.registration.kind {
                        HandlerKind::Transaction(handler) => {
                            self.apply(&envelope, handler.as_ref(), delivered).await
                        }
                        HandlerKind::Effect(effect, policy) => {
                            effect::apply(self, &envelope, effect.as_ref(), policy, delivered).await
                        }
                    };
                    (verdict, Some(envelope.message_id.to_string()))
                }
                Err(err) => (
                    Verdict::DeadLetter(format!("unusable message: {err}")),
                    None,
                ),
            };
            self.settle(&msg, verdict.0, verdict.1.as_deref(), &headers, delivered)
                .await;
        }
        .instrument(span)
        .await;
    }

    /// The transactional path: the handler behind the inbox marker.
    async fn apply(
        &self,
        envelope: &Envelope,
        handler: &dyn service::Handle<()>,
        delivered: i64,
    ) -> Verdict {
        match self
            .inbox
            .process(envelope, &self.registration.consumer, handler)
            .await
        {
            Ok(outcome) => {
                let duplicate = matches!(outcome, service::Outcome::Duplicate);
                self.count(if duplicate { "duplicate" } else { "processed" });
                Verdict::Ack
            }
            Err(err) => {
                self.count("failed");
                if err.is_permanent() {
                    Verdict::DeadLetter(err.to_string())
                } else {
                    self.retry_or_give_up(&err.to_string(), delivered)
                }
            }
        }
    }

    /// Counts a message outcome in `seawall_consumer_messages_total`.
    fn count(&self, outcome: &'static str) {
        metrics::counter!("seawall_consumer_messages_total", "consumer" => self.registration.consumer.to_string(), "outcome" => outcome)
            .increment(1);
    }

    /// Nak for redelivery, or dead-letter when this was the last allowed delivery.
    fn retry_or_give_up(&self, error: &str, delivered: i64) -> Verdict {
        if delivered >= self.max_deliver() {
            Verdict::DeadLetter(format!("gave up after {delivered} deliveries: {error}"))
        } else {
            let delay = self.nak_delay(delivered);
            tracing::warn!(error, ?delay, "handling failed; nak for redelivery");
            Verdict::Nak(delay)
        }
    }

    async fn settle(
        &self,
        msg: &jetstream::Message,
        verdict: Verdict,
        message_id: Option<&str>,
        headers: &BTreeMap<String, String>,
        delivered: i64,
    ) {
        match verdict {
            Verdict::Ack => {
                if let Err(err) = msg.double_ack().await {
                    tracing::warn!(error = %err, "ack not confirmed; a redelivery will be a Duplicate");
                }
            }
            Verdict::Nak(delay) => {
                if let Err(err) = msg.ack_with(AckKind::Nak(Some(delay))).await {
                    tracing::warn!(error = %err, "nak failed; the ack wait will redeliver");
                }
            }
            Verdict::Term => {
                if let Err(err) = msg.double_ack_with(AckKind::Term).await {
                    tracing::warn!(error = %err, "term not confirmed");
                }
            }
            Verdict::DeadLetter(reason) => {
                self.dead_letter(msg, message_id, headers, &reason, delivered)
                    .await
            }
        }
    }

    fn max_deliver(&self) -> i64 {
        self.config.max_deliver.max(1)
    }

    fn nak_delay(&self, delivered: i64) -> Duration {
        let exp = u32::try_from(delivered.clamp(1, 16) - 1).unwrap_or(0);
        self.config
            .nak_base
            .saturating_mul(1 << exp)
            .min(self.config.nak_max)
    }

    async fn dead_letter(
        &self,
        msg: &jetstream::Message,
        message_id: Option<&str>,
        headers: &BTreeMap<String, String>,
        reason: &str,
        delivered: i64,
    ) {
        let row = DeadLetter {
            consumer: self.registration.consumer.as_str(),
            message_id,
            subject: msg.subject.as_str(),
            payload: &msg.payload,
            headers,
            error: reason,
            deliveries: i32::try_from(delivered).unwrap_or(i32::MAX),
        };
        match row.record(self.inbox.executor().db()).await {
            Ok(()) => {
                metrics::counter!("seawall_dead_letters_total", "consumer" => self.registration.consumer.to_string()).increment(1);
                tracing::warn!(reason, "dead-lettered");
                if let Err(err) = msg.double_ack_with(AckKind::Term).await {
                    tracing::warn!(error = %err, "term not confirmed; a redelivery may dead-letter it again");
                }
            }
            Err(err) => {
                tracing::error!(error = %err, reason, "could not record the dead letter; nak instead");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(self.nak_delay(delivered))))
                    .await;
            }
        }
    }
}

/// What to tell JetStream about a message.
#[derive(Debug)]
enum Verdict {
    /// Done (processed or duplicate).
    Ack,
    /// Redeliver after the delay.
    Nak(Duration),
    /// Never redeliver; the reason is already recorded elsewhere.
    Term,
    /// Record a dead letter with this reason, then term.
    DeadLetter(String),
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
