//! Setting up a consumer's durable JetStream consumer, and waiting while
//! JetStream cannot answer (a node stopped, a leader being elected).

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use tokio_util::sync::CancellationToken;

use service::{BoxError, ConsumerName};

use super::{Consumer, Reads};

/// Consumer start-up failing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The durable consumer could not be created or read.
    #[error("JetStream consumer {consumer} on stream {stream} could not be set up")]
    Setup {
        /// Consumer.
        consumer: ConsumerName,
        /// Stream.
        stream: String,
        /// The JetStream client's error.
        #[source]
        source: BoxError,
    },
}

impl ConsumerError {
    /// Whether JetStream could not answer the set-up now (a node stopped, a
    /// leader being elected), as opposed to refusing it: start-up and a
    /// starting consumer wait the first out.
    pub fn is_unavailable(&self) -> bool {
        let Self::Setup { source, .. } = self;
        crate::streams::jetstream_unavailable(source.as_ref())
    }
}

impl Consumer {
    fn setup_error(&self, source: impl Into<BoxError>) -> ConsumerError {
        ConsumerError::Setup {
            consumer: self.registration.consumer.clone(),
            stream: self.config.stream.clone(),
            source: source.into(),
        }
    }

    /// Creates or updates the durable pull consumer (shared by every process
    /// running this consumer). JetStream's own delivery limit is off
    /// (`max_deliver = -1`), also on a consumer an earlier version created
    /// with a limit: a delivery the process never settled must come back, so
    /// the application can decide from the delivery count.
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
        let name = self
            .config
            .durable_name
            .clone()
            .unwrap_or_else(|| self.registration.consumer.to_string());
        stream
            .create_consumer(pull::Config {
                durable_name: Some(name),
                filter_subjects: self.filter_subjects(),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: self.config.ack_wait,
                max_deliver: -1,
                max_ack_pending: self.max_ack_pending(),
                ..Default::default()
            })
            .await
            .map_err(|e| self.setup_error(e))
    }

    /// How many deliveries JetStream lets be unacknowledged at once: one
    /// for an ordered consumer (the next message only once this one is
    /// settled, whichever process holds it), else room for every process's
    /// concurrency.
    fn max_ack_pending(&self) -> i64 {
        if self.registration.ordered {
            1
        } else {
            i64::try_from(self.config.concurrency * 64).unwrap_or(10_000)
        }
    }

    /// What the durable consumer reads: its subject, and its own replay
    /// subject, where a dead letter replayed reaches this consumer and no
    /// other (on the domain's own stream; see [`Reads`]).
    fn filter_subjects(&self) -> Vec<String> {
        match self.config.reads {
            Reads::All => vec![self.registration.subject.clone(), self.replay_subject()],
            Reads::Deliveries => vec![self.registration.subject.clone()],
            Reads::Replays => vec![self.replay_subject()],
        }
    }

    /// [`Consumer::ensure`], waiting with backoff while JetStream cannot
    /// answer: start-up ensured it already, but JetStream may be electing a
    /// leader again by the time the consumer starts. `None` when `cancel`
    /// fires first.
    pub(super) async fn ensure_waiting(
        &self,
        cancel: &CancellationToken,
    ) -> Result<Option<jetstream::consumer::Consumer<pull::Config>>, ConsumerError> {
        let backoff = service::Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        let mut waits = 0u32;
        loop {
            match self.ensure().await {
                Ok(consumer) => return Ok(Some(consumer)),
                Err(err) if err.is_unavailable() => {
                    if cancel.is_cancelled() {
                        return Ok(None);
                    }
                    waits = waits.saturating_add(1);
                    tracing::warn!(
                        consumer = %self.registration.consumer,
                        error = %err,
                        "JetStream cannot set up the consumer yet; waiting"
                    );
                    tokio::select! {
                        () = cancel.cancelled() => return Ok(None),
                        () = tokio::time::sleep(backoff.delay(waits)) => {}
                    }
                }
                Err(err) => return Err(err),
            }
        }
    }
}
