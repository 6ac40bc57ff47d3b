//! Stream provisioning and the duplicate-window check.

use std::time::Duration;

use async_nats::jetstream::{self, stream};

use service::BoxError;

/// A stream the worker creates or updates at start-up.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Stream name (`CREDITS`).
    pub name: String,
    /// Subjects it captures (`credits.>`).
    pub subjects: Vec<String>,
    /// JetStream's dedupe window for `Nats-Msg-Id`.
    pub duplicate_window: Duration,
    /// How long messages are kept (zero: unlimited).
    pub max_age: Duration,
    /// Replicas (1 on a single server, 3 on a cluster).
    pub replicas: usize,
}

/// Stream set-up and checks failing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The server refused the create or update, or the stream could not be read.
    #[error("stream {name} could not be created, updated or read")]
    Provision {
        /// Stream.
        name: String,
        /// The JetStream client's error, with the server's reason.
        #[source]
        source: BoxError,
    },
    /// The dedupe window would let a republished row through.
    #[error(
        "stream {name} has a duplicate window of {window:?}, shorter than the longest a published row can wait to be marked ({longest:?}: the relay lease of {lease:?}, which also bounds a round, plus the longest publish retry backoff of {retry_max:?}): a row republished after a relay crash or a lost PubAck could be delivered twice; raise SEAWALL_DUPLICATE_WINDOW_MS or lower SEAWALL_RELAY_LEASE_MS / SEAWALL_RELAY_RETRY_MAX_MS"
    )]
    WindowTooShort {
        /// Stream.
        name: String,
        /// Its configured window.
        window: Duration,
        /// Lease plus retry backoff.
        longest: Duration,
        /// The relay lease.
        lease: Duration,
        /// The relay's longest retry backoff.
        retry_max: Duration,
    },
}

impl StreamError {
    fn provision(name: &str, source: impl Into<BoxError>) -> Self {
        Self::Provision {
            name: name.to_owned(),
            source: source.into(),
        }
    }

    /// Whether JetStream could not answer now (a request timed out, no
    /// server responded, JetStream unavailable: a node stopped, a stream
    /// leader being elected), as opposed to an answer refusing the stream.
    /// Start-up waits the first out and stops at the second.
    pub fn is_unavailable(&self) -> bool {
        let Self::Provision { source, .. } = self else {
            return false;
        };
        jetstream_unavailable(source.as_ref())
    }
}

/// Whether `err`, from a JetStream request that sets up a stream or a
/// consumer, says JetStream could not answer now (a timeout, no responders,
/// 503 while a node is stopped or a leader is being elected) rather than
/// refusing what was asked.
pub(crate) fn jetstream_unavailable(err: &(dyn std::error::Error + 'static)) -> bool {
    use async_nats::jetstream::context::{
        CreateStreamError, CreateStreamErrorKind, GetStreamError, GetStreamErrorKind, RequestError,
        RequestErrorKind,
    };
    use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};
    if let Some(err) = err.downcast_ref::<CreateStreamError>() {
        return match err.kind() {
            CreateStreamErrorKind::TimedOut | CreateStreamErrorKind::JetStreamUnavailable => true,
            CreateStreamErrorKind::JetStream(err) => err.code() == 503,
            _ => false,
        };
    }
    // A failed request is wrapped as `Request` whatever went wrong; only a
    // timeout or no responders is JetStream not answering (not a subject
    // or payload it refused, a closed client, a reply it could not read).
    let request_unanswered = |err: &(dyn std::error::Error + 'static)| {
        err.source()
            .and_then(|source| source.downcast_ref::<RequestError>())
            .is_some_and(|source| {
                matches!(
                    source.kind(),
                    RequestErrorKind::TimedOut | RequestErrorKind::NoResponders
                )
            })
    };
    if let Some(get) = err.downcast_ref::<GetStreamError>() {
        return match get.kind() {
            GetStreamErrorKind::Request => request_unanswered(err),
            GetStreamErrorKind::JetStream(err) => err.code() == 503,
            _ => false,
        };
    }
    if let Some(create) = err.downcast_ref::<ConsumerError>() {
        return match create.kind() {
            ConsumerErrorKind::TimedOut => true,
            ConsumerErrorKind::Request => request_unanswered(err),
            ConsumerErrorKind::JetStream(err) => err.code() == 503,
            _ => false,
        };
    }
    if let Some(err) = err.downcast_ref::<RequestError>() {
        return matches!(
            err.kind(),
            RequestErrorKind::TimedOut | RequestErrorKind::NoResponders
        );
    }
    false
}

/// Creates the stream, or sets on the existing one the fields seawall owns
/// (its subjects, with its consumers' replay subjects
/// ([`service::dead_letter::replay_subjects`]), the duplicate window, the
/// maximum age and the replicas), idempotently. Every other field (limits,
/// storage, retention, compression, placement, a flag an operator turned
/// on) stays as the operator set it: an update with the whole of seawall's
/// configuration would put each back to JetStream's default at every
/// start. What changed is logged.
///
/// # Errors
/// [`StreamError::Provision`], with the server's reason as its source.
pub async fn ensure_stream(
    js: &jetstream::Context,
    spec: &StreamSpec,
) -> Result<stream::Info, StreamError> {
    let stream = match js.get_stream(&spec.name).await {
        Ok(stream) => stream,
        Err(err) if is_not_found(&err) => match js.create_stream(spec.create_config()).await {
            Ok(created) => {
                tracing::info!(stream = %spec.name, "stream created");
                return Ok(created.cached_info().clone());
            }
            // Another process created it first: set its fields as below.
            Err(err) if is_name_taken(&err) => js
                .get_stream(&spec.name)
                .await
                .map_err(|e| StreamError::provision(&spec.name, e))?,
            Err(err) => return Err(StreamError::provision(&spec.name, err)),
        },
        Err(err) => return Err(StreamError::provision(&spec.name, err)),
    };
    let (config, changed) = spec.apply_to(stream.cached_info().config.clone());
    if changed.is_empty() {
        return Ok(stream.cached_info().clone());
    }
    tracing::info!(stream = %spec.name, changed = %changed.join(", "), "setting the stream's seawall fields");
    js.update_stream(config)
        .await
        .map_err(|e| StreamError::provision(&spec.name, e))
}

impl StreamSpec {
    /// The subjects the stream captures: the domain's and its consumers'
    /// replay subjects.
    fn all_subjects(&self) -> Vec<String> {
        self.subjects
            .iter()
            .cloned()
            .chain([service::dead_letter::replay_subjects(&self.name)])
            .collect()
    }

    /// A new stream's configuration: seawall's fields, JetStream's defaults
    /// for the rest.
    fn create_config(&self) -> stream::Config {
        stream::Config {
            name: self.name.clone(),
            subjects: self.all_subjects(),
            duplicate_window: self.duplicate_window,
            max_age: self.max_age,
            num_replicas: self.replicas,
            ..Default::default()
        }
    }

    /// `current` with seawall's fields set, and the names of those that
    /// changed.
    fn apply_to(&self, mut current: stream::Config) -> (stream::Config, Vec<&'static str>) {
        let mut changed = Vec::new();
        let subjects = self.all_subjects();
        if current.subjects != subjects {
            current.subjects = subjects;
            changed.push("subjects");
        }
        if current.duplicate_window != self.duplicate_window {
            current.duplicate_window = self.duplicate_window;
            changed.push("duplicate_window");
        }
        if current.max_age != self.max_age {
            current.max_age = self.max_age;
            changed.push("max_age");
        }
        if current.num_replicas != self.replicas {
            current.num_replicas = self.replicas;
            changed.push("num_replicas");
        }
        (current, changed)
    }
}

/// Whether stream `name` exists, looked up without creating or changing
/// it: for a stream another service owns, which a consumer only reads.
///
/// # Errors
/// [`StreamError::Provision`] when JetStream could not be asked.
pub async fn stream_exists(js: &jetstream::Context, name: &str) -> Result<bool, StreamError> {
    match js.get_stream(name).await {
        Ok(_) => Ok(true),
        Err(err) if is_not_found(&err) => Ok(false),
        Err(err) => Err(StreamError::provision(name, err)),
    }
}

/// Whether a stream lookup failed because there is no such stream.
fn is_not_found(err: &jetstream::context::GetStreamError) -> bool {
    matches!(
        err.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(ref e)
            if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

/// Whether a create failed because a stream of that name now exists.
fn is_name_taken(err: &jetstream::context::CreateStreamError) -> bool {
    matches!(
        err.kind(),
        jetstream::context::CreateStreamErrorKind::JetStream(ref e)
            if e.error_code() == jetstream::ErrorCode::STREAM_NAME_EXIST
    )
}

/// Reads the stream's configured duplicate window back and refuses one
/// shorter than the longest a row can stay published but unmarked: a crashed
/// relay's rows are republished once its lease runs out (on PostgreSQL the
/// lease bounds the round that holds them), and a row whose PubAck was lost
/// although the stream stored it is republished after its retry backoff.
///
/// # Errors
/// [`StreamError::WindowTooShort`], or [`StreamError::Provision`] if the stream
/// cannot be read.
pub async fn check_duplicate_window(
    js: &jetstream::Context,
    name: &str,
    lease: Duration,
    retry_max: Duration,
) -> Result<Duration, StreamError> {
    let mut stream = js
        .get_stream(name)
        .await
        .map_err(|e| StreamError::provision(name, e))?;
    let info = stream
        .info()
        .await
        .map_err(|e| StreamError::provision(name, e))?;
    let window = info.config.duplicate_window;
    let longest = lease.saturating_add(retry_max);
    if window < longest {
        return Err(StreamError::WindowTooShort {
            name: name.to_owned(),
            window,
            longest,
            lease,
            retry_max,
        });
    }
    Ok(window)
}

#[cfg(test)]
mod tests {
    use async_nats::jetstream::context::{RequestError, RequestErrorKind};
    use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};

    use super::jetstream_unavailable;

    /// A consumer's set-up that timed out or found no server (a node
    /// stopped, a leader election) is waited out; one JetStream refused,
    /// or a request that failed otherwise, is not.
    #[test]
    fn a_consumer_set_up_that_jetstream_could_not_answer_is_unavailable() {
        let request =
            |kind| ConsumerError::with_source(ConsumerErrorKind::Request, RequestError::new(kind));
        assert!(jetstream_unavailable(&ConsumerError::new(
            ConsumerErrorKind::TimedOut
        )));
        assert!(jetstream_unavailable(&request(
            RequestErrorKind::NoResponders
        )));
        assert!(!jetstream_unavailable(&request(RequestErrorKind::Other)));
        for kind in [
            ConsumerErrorKind::InvalidName,
            ConsumerErrorKind::InvalidConsumerType,
            ConsumerErrorKind::Other,
        ] {
            assert!(!jetstream_unavailable(&ConsumerError::new(kind)));
        }
    }
}
