//! Validated identifiers and the message envelope handed to handlers.
//!
//! Everything arriving from a broker is untrusted. These types are the one
//! place where it is checked; past this point an id is known to be usable as
//! an inbox key.

use std::collections::BTreeMap;
use std::fmt;

/// Longest accepted message id in bytes (the column is sized to match).
pub const MAX_MESSAGE_ID_LEN: usize = 200;
/// Longest accepted consumer name.
pub const MAX_CONSUMER_LEN: usize = 64;

/// Header carrying the producer's message id (docs/architecture.md, rule 10).
pub const HEADER_MSG_ID: &str = "Nats-Msg-Id";
/// Header naming the conversation a message belongs to: set on every event
/// seawall publishes, and carried from a
/// message to the events its handler writes.
pub const HEADER_CORRELATION_ID: &str = "Seawall-Correlation-Id";
/// Header carrying when the event was written (its outbox row's or WAL
/// message's commit-time `created_at`, in microseconds since the Unix
/// epoch: a short integer, cheap to write on every message; earlier relays
/// wrote RFC 3339, which consumers still read), set by the relays so a
/// consumer can measure the delay from write to handling across processes.
pub const HEADER_WRITTEN_AT: &str = "Seawall-Written-At";
/// CloudEvents binary-mode headers, used when `Nats-Msg-Id` is absent.
pub const HEADER_CE_SOURCE: &str = "ce-source";
/// See [`HEADER_CE_SOURCE`].
pub const HEADER_CE_ID: &str = "ce-id";

/// Why an identifier or envelope was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The message id was empty or only whitespace.
    #[error("message id is empty")]
    EmptyMessageId,
    /// The message id was longer than [`MAX_MESSAGE_ID_LEN`] bytes.
    #[error("message id is {len} bytes long; the limit is {MAX_MESSAGE_ID_LEN}")]
    MessageIdTooLong {
        /// Length that was seen.
        len: usize,
    },
    /// The message id contained a control character.
    #[error("message id contains a control character")]
    MessageIdControlChar,
    /// The consumer name was empty.
    #[error("consumer name is empty")]
    EmptyConsumer,
    /// The consumer name was too long or used characters NATS durable names forbid.
    #[error(
        "consumer name {0:?} is invalid: use 1 to {MAX_CONSUMER_LEN} characters from A-Z, a-z, 0-9, '-' and '_'"
    )]
    InvalidConsumer(String),
    /// Neither `Nats-Msg-Id` nor the CloudEvents `ce-source` + `ce-id` pair was present.
    #[error("message has no id: expected a Nats-Msg-Id header or ce-source and ce-id headers")]
    MissingMessageId,
}

/// A producer-assigned message id, stable across redeliveries.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(String);

impl MessageId {
    /// Accepts a non-empty id of at most [`MAX_MESSAGE_ID_LEN`] bytes without
    /// control characters.
    ///
    /// # Errors
    /// [`EnvelopeError`] naming what is wrong with the id.
    pub fn parse(raw: impl Into<String>) -> Result<Self, EnvelopeError> {
        let raw = raw.into();
        if raw.trim().is_empty() {
            return Err(EnvelopeError::EmptyMessageId);
        }
        if raw.len() > MAX_MESSAGE_ID_LEN {
            return Err(EnvelopeError::MessageIdTooLong { len: raw.len() });
        }
        if raw.chars().any(char::is_control) {
            return Err(EnvelopeError::MessageIdControlChar);
        }
        Ok(Self(raw))
    }

    /// The id as stored in the inbox.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The name of a consumer. It doubles as the JetStream durable name, so it is
/// restricted to characters NATS accepts there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConsumerName(String);

impl ConsumerName {
    /// Accepts 1 to [`MAX_CONSUMER_LEN`] characters from `[A-Za-z0-9_-]`.
    ///
    /// # Errors
    /// [`EnvelopeError::EmptyConsumer`] or [`EnvelopeError::InvalidConsumer`].
    pub fn parse(raw: impl Into<String>) -> Result<Self, EnvelopeError> {
        let raw = raw.into();
        if raw.is_empty() {
            return Err(EnvelopeError::EmptyConsumer);
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if raw.len() > MAX_CONSUMER_LEN || !raw.chars().all(allowed) {
            return Err(EnvelopeError::InvalidConsumer(raw));
        }
        Ok(Self(raw))
    }

    /// The name as stored in the inbox.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A received message: its stable id, where it came from, and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The inbox key (docs/architecture.md, rule 10).
    pub message_id: MessageId,
    /// The subject the message was published on.
    pub subject: String,
    /// Headers as received, for handlers that need them (trace context etc.).
    pub headers: BTreeMap<String, String>,
    /// The raw payload; handlers parse it themselves.
    pub payload: Vec<u8>,
    /// The broker delivered this message before (its ack was lost, or an
    /// earlier attempt failed), so it may well be processed already. Only a
    /// hint: the inbox's fast-path check runs for such deliveries;
    /// correctness never depends on it.
    pub redelivered: bool,
}

impl Envelope {
    /// The conversation this message belongs to: its correlation header, or
    /// its own id when it starts one.
    ///
    /// A header a producer wrote that could not be stored (empty, over
    /// [`MAX_MESSAGE_ID_LEN`] bytes, or with control characters) is ignored:
    /// the conversation then starts here rather than failing every event the
    /// handler writes.
    pub fn correlation_id(&self) -> &str {
        self.headers
            .get(HEADER_CORRELATION_ID)
            .filter(|id| {
                !id.is_empty() && id.len() <= MAX_MESSAGE_ID_LEN && !id.contains(char::is_control)
            })
            .map_or(self.message_id.as_str(), String::as_str)
    }

    /// Builds an envelope whose id is already known (tests, replays, producers).
    pub fn new(
        message_id: MessageId,
        subject: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            message_id,
            subject: subject.into(),
            headers: BTreeMap::new(),
            payload: payload.into(),
            redelivered: false,
        }
    }

    /// Marks the envelope as a redelivery (see [`Envelope::redelivered`]).
    #[must_use]
    pub fn redelivered(mut self, redelivered: bool) -> Self {
        self.redelivered = redelivered;
        self
    }

    /// Builds an envelope from what a broker delivered, taking the id from
    /// `Nats-Msg-Id`, or else from CloudEvents `ce-source` + `ce-id`. Never from a
    /// delivery counter or timestamp: those change between redeliveries.
    ///
    /// # Errors
    /// [`EnvelopeError::MissingMessageId`] when no id header is present, or the
    /// id's own validation error.
    pub fn from_delivery(
        subject: impl Into<String>,
        headers: BTreeMap<String, String>,
        payload: impl Into<Vec<u8>>,
    ) -> Result<Self, EnvelopeError> {
        let message_id = message_id_from_headers(&headers)?;
        Ok(Self {
            message_id,
            subject: subject.into(),
            headers,
            payload: payload.into(),
            redelivered: false,
        })
    }
}

/// Extracts the inbox key from delivery headers (docs/architecture.md, rule 10).
///
/// # Errors
/// See [`Envelope::from_delivery`].
pub fn message_id_from_headers(
    headers: &BTreeMap<String, String>,
) -> Result<MessageId, EnvelopeError> {
    if let Some(id) = headers.get(HEADER_MSG_ID) {
        return MessageId::parse(id.as_str());
    }
    match (headers.get(HEADER_CE_SOURCE), headers.get(HEADER_CE_ID)) {
        // `{source}/{id}` alone would give source `a/b` + id `c` and source
        // `a` + id `b/c` the same key, and the second message would be acked
        // as a duplicate of the first. Escaping `%` and `/` in the id makes
        // the last `/` the separator, and leaves the common ids (UUIDs,
        // numbers), and so the keys of markers already written, unchanged.
        (Some(source), Some(id)) if !source.is_empty() && !id.is_empty() => {
            let id = id.replace('%', "%25").replace('/', "%2F");
            MessageId::parse(format!("{source}/{id}"))
        }
        _ => Err(EnvelopeError::MissingMessageId),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_correlation_header_that_cannot_be_stored_starts_a_new_conversation() {
        let with = |value: &str| {
            let mut envelope = Envelope::new(MessageId::parse("m-1").unwrap(), "s", Vec::new());
            envelope
                .headers
                .insert(HEADER_CORRELATION_ID.to_owned(), value.to_owned());
            envelope.correlation_id().to_owned()
        };
        assert_eq!(with("c-1"), "c-1");
        assert_eq!(with(""), "m-1");
        assert_eq!(with(&"x".repeat(MAX_MESSAGE_ID_LEN + 1)), "m-1");
        assert_eq!(with("a\tb"), "m-1");
    }

    fn headers(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn nats_msg_id_wins_over_cloudevents() {
        let h = headers(&[("Nats-Msg-Id", "a"), ("ce-source", "s"), ("ce-id", "1")]);
        assert_eq!(message_id_from_headers(&h).unwrap().as_str(), "a");
    }

    #[test]
    fn cloudevents_source_and_id_form_the_key() {
        let h = headers(&[("ce-source", "/orders"), ("ce-id", "42")]);
        assert_eq!(message_id_from_headers(&h).unwrap().as_str(), "/orders/42");
    }

    #[test]
    fn cloudevents_keys_cannot_collide_across_the_separator() {
        let a = headers(&[("ce-source", "a/b"), ("ce-id", "c")]);
        let b = headers(&[("ce-source", "a"), ("ce-id", "b/c")]);
        assert_ne!(
            message_id_from_headers(&a).unwrap(),
            message_id_from_headers(&b).unwrap()
        );
        let c = headers(&[("ce-source", "a"), ("ce-id", "b%2Fc")]);
        assert_ne!(
            message_id_from_headers(&b).unwrap(),
            message_id_from_headers(&c).unwrap()
        );
    }

    #[test]
    fn a_message_without_id_headers_is_rejected() {
        let h = headers(&[("ce-id", "42")]);
        assert_eq!(
            message_id_from_headers(&h),
            Err(EnvelopeError::MissingMessageId)
        );
    }

    #[test]
    fn ids_are_bounded_and_non_empty() {
        assert_eq!(MessageId::parse("  "), Err(EnvelopeError::EmptyMessageId));
        let long = "x".repeat(MAX_MESSAGE_ID_LEN + 1);
        assert!(matches!(
            MessageId::parse(long),
            Err(EnvelopeError::MessageIdTooLong { .. })
        ));
        assert!(MessageId::parse("x".repeat(MAX_MESSAGE_ID_LEN)).is_ok());
        assert_eq!(
            MessageId::parse("a\nb"),
            Err(EnvelopeError::MessageIdControlChar)
        );
    }

    #[test]
    fn consumer_names_must_be_valid_durable_names() {
        assert_eq!(ConsumerName::parse(""), Err(EnvelopeError::EmptyConsumer));
        assert!(ConsumerName::parse("credit.v2").is_err());
        assert!(ConsumerName::parse("credit_v2-a").is_ok());
    }
}
