//! The transactional outbox: events recorded in the business transaction.
//!
//! Publishing to the broker inside the transaction would either publish events
//! of transactions that later roll back, or lose events when the process dies
//! after commit. Writing a row in the same transaction makes the event commit
//! exactly when the business change does; the relay publishes it afterwards.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveValue::{NotSet, Set},
    ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, EntityTrait,
};

use entity::outbox_message;

use crate::envelope::{ConsumerName, Envelope, HEADER_CORRELATION_ID};
use crate::wal::{self, WalEvent};

/// An event to publish once the surrounding transaction commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// Sent as `Nats-Msg-Id`; JetStream drops a republished copy within its
    /// duplicate window. A fresh time-ordered UUID unless set.
    pub message_id: String,
    /// NATS subject to publish on.
    pub subject: String,
    /// The message body.
    pub payload: Vec<u8>,
    /// Extra headers (for example W3C `traceparent`).
    pub headers: BTreeMap<String, String>,
    /// Events sharing a key are published in commit order.
    pub ordering_key: Option<String>,
}

impl NewEvent {
    /// An event with a fresh message id.
    pub fn new(subject: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            message_id: uuid::Uuid::now_v7().to_string(),
            subject: subject.into(),
            payload: payload.into(),
            headers: BTreeMap::new(),
            ordering_key: None,
        }
    }

    /// An event whose payload is `value` as JSON, with a fresh message id.
    ///
    /// # Errors
    /// [`EventError::Payload`] if `value` does not serialize (a map with
    /// non-string keys, a failing `Serialize`); `?` in a handler makes it a
    /// rejection.
    pub fn json<T: serde::Serialize + ?Sized>(
        subject: impl Into<String>,
        value: &T,
    ) -> Result<Self, EventError> {
        let payload = serde_json::to_vec(value).map_err(|e| EventError::Payload(e.to_string()))?;
        Ok(Self::new(subject, payload))
    }

    /// Uses a caller-chosen message id (for example one derived from the input).
    pub fn with_message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = id.into();
        self
    }

    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Orders this event after earlier events with the same key.
    pub fn with_ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Checks that the event can travel as a NATS message: its id and header
    /// values on one line, its header names free of spaces and `:`. Checked
    /// when the event is enqueued, so a bad one fails the handler that wrote
    /// it instead of reaching the relay.
    ///
    /// # Errors
    /// [`EventError`] naming the offending part.
    pub fn validate(&self) -> Result<(), EventError> {
        check_event(
            &self.message_id,
            &self.subject,
            self.ordering_key.as_deref(),
            &self.headers,
        )
    }
}

/// Longest message id, subject or ordering key an outbox row stores (bytes).
pub const FIELD_LEN: usize = 255;

/// Checks an event's parts as NATS carries them and as an outbox row
/// stores them: in WAL mode an event the broker refuses becomes a row, and
/// one that could not would stop the relay on it.
///
/// # Errors
/// [`EventError`] naming the offending part.
pub fn check_event(
    message_id: &str,
    subject: &str,
    ordering_key: Option<&str>,
    headers: &BTreeMap<String, String>,
) -> Result<(), EventError> {
    check_message_id(message_id)?;
    for (field, value) in [
        ("message id", Some(message_id)),
        ("subject", Some(subject)),
        ("ordering key", ordering_key),
    ] {
        if let Some(value) = value
            && (value.is_empty() || value.len() > FIELD_LEN || value.contains('\0'))
        {
            return Err(EventError::Field(format!(
                "{field} must be 1 to {FIELD_LEN} bytes without NUL, got {} bytes",
                value.len()
            )));
        }
    }
    for (name, value) in headers {
        check_header(name, value)?;
    }
    Ok(())
}

/// Lets handlers use `?` on [`NewEvent::json`] and [`NewEvent::validate`].
impl From<EventError> for crate::HandlerError {
    fn from(err: EventError) -> Self {
        OutboxError::Invalid(err).into()
    }
}

/// Why an event cannot be published as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// The message id is not one every consumer can hold (the rule of
    /// [`crate::envelope::MessageId::parse`]): empty, longer than
    /// [`crate::envelope::MAX_MESSAGE_ID_LEN`] bytes, or with a control
    /// character. Published anyway, every seawall consumer would
    /// dead-letter it without an id, and it could never be replayed.
    #[error(
        "message id {0:?} must be 1 to {max} bytes without control characters",
        max = crate::envelope::MAX_MESSAGE_ID_LEN
    )]
    MessageId(String),
    /// A header name is empty or holds a space, `:`, a control character or
    /// non-ASCII.
    #[error("header name {0:?} must be non-empty printable ASCII without ':'")]
    HeaderName(String),
    /// A header value spans lines.
    #[error("header {0:?} has a value with CR/LF")]
    HeaderValue(String),
    /// A field is longer than the WAL encoding carries (a payload over
    /// 4 GiB).
    #[error("{0}")]
    TooLong(String),
    /// A message id, subject or ordering key is empty, too long for its
    /// column, or holds NUL.
    #[error("{0}")]
    Field(String),
    /// The payload could not be serialized.
    #[error("event payload does not serialize: {0}")]
    Payload(String),
}

/// Checks an id for `Nats-Msg-Id` by the rule consumers read it with (one
/// rule for both ends, [`crate::envelope::MessageId::parse`]); the relay
/// checks rows with it too, since rows can be written by hand.
///
/// # Errors
/// [`EventError::MessageId`].
pub fn check_message_id(id: &str) -> Result<(), EventError> {
    crate::envelope::MessageId::parse(id)
        .map(|_| ())
        .map_err(|_| EventError::MessageId(id.to_owned()))
}

/// Checks one header as NATS accepts it.
///
/// # Errors
/// [`EventError::HeaderName`] or [`EventError::HeaderValue`].
pub fn check_header(name: &str, value: &str) -> Result<(), EventError> {
    if name.is_empty() || name.contains(|c: char| !c.is_ascii_graphic() || c == ':') {
        return Err(EventError::HeaderName(name.to_owned()));
    }
    if value.contains(['\r', '\n']) {
        return Err(EventError::HeaderValue(name.to_owned()));
    }
    Ok(())
}

/// Recording an event failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The event cannot be published as written; nothing was recorded.
    #[error("invalid outbox event: {0}")]
    Invalid(#[from] EventError),
    /// The insert failed (a reused message id violates
    /// `ix_outbox_message_message_id`).
    #[error(transparent)]
    Database(#[from] DbErr),
    /// This process writes events to the table, but the database switched
    /// to WAL mode (a rolling deploy to `outbox_mode = "wal"` under way):
    /// a row written now could be published ahead of its key's events
    /// still in the slot. Nothing was recorded.
    #[error(
        "outbox_mode = \"table\", but the database is in WAL mode now (slot {0:?}): this process's events would be published ahead of their keys' events in the slot; restart it with outbox_mode = \"wal\""
    )]
    InWalMode(String),
}

/// Lets handlers use `?` on [`crate::Ctx::emit`]. An invalid event is a
/// rejection: running the same handler again writes the same event.
impl From<OutboxError> for crate::HandlerError {
    fn from(err: OutboxError) -> Self {
        match err {
            OutboxError::Invalid(invalid) => Self::Rejected(invalid.to_string()),
            OutboxError::Database(db) => Self::Database(db),
            // Not the message's fault: held and tried again (by a WAL-mode
            // process, once this one is replaced), never dead-lettered.
            err @ OutboxError::InWalMode(_) => Self::Unavailable {
                reason: err.to_string(),
                retry_after: None,
            },
        }
    }
}

/// Where events are recorded: rows of `outbox_message` (every backend), or
/// logical messages in PostgreSQL's write-ahead log ([`crate::wal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutboxMode {
    /// A row per event, published by the table relay.
    #[default]
    Table,
    /// One logical message per enqueue call, relayed from a replication slot.
    Wal,
}

/// Writes outbox events, the `mode` way. It takes a `&DatabaseTransaction`,
/// not a connection, so an event can only be recorded as part of a business
/// transaction. Handlers emit through their [`crate::Ctx`], which carries
/// the process's mode and the message that caused the event; this is for
/// code that writes events outside a handler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outbox {
    mode: OutboxMode,
}

impl Outbox {
    /// An outbox recording events the `mode` way.
    pub fn new(mode: OutboxMode) -> Self {
        Self { mode }
    }

    /// Where this outbox records events.
    pub fn mode(&self) -> OutboxMode {
        self.mode
    }

    /// Records `event` in `txn`, caused by no message. It becomes visible to
    /// the relay when `txn` commits, and never if it rolls back.
    ///
    /// # Errors
    /// [`OutboxError::Invalid`] for an event NATS cannot carry (nothing is
    /// written), or the database error.
    pub async fn enqueue(
        &self,
        txn: &DatabaseTransaction,
        event: NewEvent,
    ) -> Result<(), OutboxError> {
        self.enqueue_caused(txn, [event], None).await
    }

    /// Records many events in `txn`, in the order given, which is also their
    /// publishing order per ordering key: with multi-row inserts (one round
    /// trip per [`ROWS_PER_INSERT`] events, or [`BYTES_PER_INSERT`], rather
    /// than one per event; in a group-commit batch, one for the whole
    /// batch before it commits), or in
    /// WAL mode as one logical message (several of about
    /// [`wal::MESSAGE_BYTES`] each when the events are larger).
    ///
    /// # Errors
    /// As [`Outbox::enqueue`]; on an error none of the events is recorded
    /// once `txn` rolls back.
    pub async fn enqueue_all(
        &self,
        txn: &DatabaseTransaction,
        events: impl IntoIterator<Item = NewEvent>,
    ) -> Result<(), OutboxError> {
        self.enqueue_caused(txn, events, None).await
    }

    /// [`Outbox::enqueue_all`] for events `cause`'s handler writes.
    pub(crate) async fn enqueue_caused(
        &self,
        txn: &DatabaseTransaction,
        events: impl IntoIterator<Item = NewEvent>,
        cause: Option<&Cause>,
    ) -> Result<(), OutboxError> {
        let now = Utc::now();
        let events = events
            .into_iter()
            .map(|event| stamp(event, cause, now))
            .collect::<Result<Vec<_>, _>>()?;
        if events.is_empty() {
            return Ok(());
        }
        if self.mode == OutboxMode::Wal {
            let contents = wal::encode_split(&events, wal::MESSAGE_BYTES)
                .map_err(|e| EventError::TooLong(e.to_string()))?;
            for content in contents {
                wal::emit(txn, content).await?;
            }
            return Ok(());
        }
        let rows = events
            .into_iter()
            .map(row_of)
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(batch) = crate::group::deferring(txn) {
            // Written with the batch's other units' rows before it commits.
            batch.defer(rows);
            return Ok(());
        }
        if txn.get_database_backend() == DbBackend::Postgres
            && let Some(slot) = wal::mode::table_mode_guard(txn).await?
        {
            return Err(OutboxError::InWalMode(slot));
        }
        for batch in insert_batches(rows) {
            outbox_message::Entity::insert_many(batch)
                .exec_without_returning(txn)
                .await?;
        }
        Ok(())
    }
}

/// The message whose handler is running: every event it enqueues records
/// it (`causation_id`, `causation_consumer`) and carries its conversation
/// (`correlation_id`, also sent as the [`HEADER_CORRELATION_ID`] header), so
/// a message's journey can be followed from one service to the next.
#[derive(Debug, Clone)]
pub struct Cause {
    /// The message being handled.
    pub message_id: String,
    /// The consumer handling it.
    pub consumer: String,
    /// Its conversation.
    pub correlation_id: String,
    /// Its trace headers, passed on when this process traces nothing.
    pub trace: BTreeMap<String, String>,
}

impl Cause {
    /// The cause of what `consumer`'s handler of `envelope` emits.
    pub fn of(envelope: &Envelope, consumer: &ConsumerName) -> Self {
        Self {
            message_id: envelope.message_id.to_string(),
            consumer: consumer.to_string(),
            correlation_id: envelope.correlation_id().to_owned(),
            trace: crate::trace::carried(&envelope.headers),
        }
    }
}

/// Rows per multi-row insert: 14 bind values each stay well below SQLite's
/// 32,766 and PostgreSQL's 65,535 parameters per statement.
pub const ROWS_PER_INSERT: usize = 1_000;

/// Most payload bytes of one multi-row insert (past its first row): the
/// statement's values are copied by sea-orm and again by the driver, so an
/// insert of a thousand megabyte rows would hold gigabytes at once.
pub const BYTES_PER_INSERT: usize = 4 << 20;

/// `rows` as the multi-row inserts they go in, in order: at most
/// [`ROWS_PER_INSERT`] rows and [`BYTES_PER_INSERT`] of payloads each (a
/// larger row alone). The rows are moved, not copied.
#[must_use]
pub fn insert_batches(
    rows: Vec<outbox_message::ActiveModel>,
) -> Vec<Vec<outbox_message::ActiveModel>> {
    let mut batches: Vec<Vec<outbox_message::ActiveModel>> = Vec::new();
    let mut bytes = 0;
    for row in rows {
        let size = row.payload.try_as_ref().map_or(0, Vec::len);
        match batches.last_mut() {
            Some(batch) if batch.len() < ROWS_PER_INSERT && bytes + size <= BYTES_PER_INSERT => {
                bytes += size;
                batch.push(row);
            }
            _ => {
                bytes = size;
                batches.push(vec![row]);
            }
        }
    }
    batches
}

/// `event` checked and completed as it will be published: its correlation
/// header, its trace context, and the message that caused it.
fn stamp(
    mut event: NewEvent,
    cause: Option<&Cause>,
    now: DateTime<Utc>,
) -> Result<WalEvent, OutboxError> {
    event.validate()?;
    let correlation = cause.map_or_else(|| event.message_id.clone(), |c| c.correlation_id.clone());
    event
        .headers
        .entry(HEADER_CORRELATION_ID.to_owned())
        .or_insert_with(|| correlation.clone());
    // The event belongs to the trace of the message whose handler wrote it.
    let carried = cause.map(|c| c.trace.clone()).unwrap_or_default();
    crate::trace::inject_current(&mut event.headers, &carried);
    Ok(WalEvent {
        message_id: event.message_id,
        subject: event.subject,
        ordering_key: event.ordering_key,
        headers: event.headers,
        payload: event.payload.into(),
        causation_id: cause.map(|c| c.message_id.clone()),
        causation_consumer: cause.map(|c| c.consumer.clone()),
        correlation_id: Some(correlation),
        created_at: now,
    })
}

/// The outbox row holding `event`, pending and publishable from its
/// creation time. The WAL relay also writes an event it could not publish
/// as such a row, marked dead, so operators see and retry it as any other.
///
/// # Errors
/// [`DbErr::Json`] if the headers cannot be stored as JSON.
pub fn row_of(event: WalEvent) -> Result<outbox_message::ActiveModel, DbErr> {
    let headers = serde_json::to_value(&event.headers).map_err(|e| DbErr::Json(e.to_string()))?;
    Ok(outbox_message::ActiveModel {
        id: NotSet,
        message_id: Set(event.message_id),
        subject: Set(event.subject),
        payload: Set(event.payload.into()),
        headers: Set(headers),
        ordering_key: Set(event.ordering_key),
        created_at: Set(event.created_at),
        published_at: Set(None),
        attempts: Set(0),
        last_error: Set(None),
        next_attempt_at: Set(event.created_at),
        locked_by: Set(None),
        locked_until: Set(None),
        dead_at: Set(None),
        causation_id: Set(event.causation_id),
        causation_consumer: Set(event.causation_consumer),
        correlation_id: Set(event.correlation_id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_are_bounded_in_rows_and_in_bytes() {
        let row = |len: usize| outbox_message::ActiveModel {
            payload: Set(vec![0; len]),
            ..Default::default()
        };
        let sizes = |rows: Vec<outbox_message::ActiveModel>| -> Vec<usize> {
            insert_batches(rows).iter().map(Vec::len).collect()
        };
        assert_eq!(
            sizes((0..2_500).map(|_| row(10)).collect()),
            [1_000, 1_000, 500]
        );
        let mib = 1 << 20;
        // Four of 1 MiB fill an insert; one larger than the bound goes alone.
        let rows = vec![
            row(mib),
            row(mib),
            row(mib),
            row(mib),
            row(1),
            row(5 * mib),
            row(1),
        ];
        assert_eq!(sizes(rows), [4, 1, 1, 1]);
        assert!(insert_batches(Vec::new()).is_empty());
    }

    /// A table-mode writer on a database switched to WAL mode is not the
    /// message's fault: its delivery is held and tried again, never
    /// dead-lettered as a rejection would be.
    #[test]
    fn a_table_writer_on_a_wal_mode_database_is_unavailable() {
        let err = crate::HandlerError::from(OutboxError::InWalMode("s".into()));
        assert!(
            matches!(&err, crate::HandlerError::Unavailable { reason, .. } if reason.contains("outbox_mode")),
            "{err:?}"
        );
    }

    #[test]
    fn an_event_no_outbox_row_could_hold_is_refused_at_enqueue() {
        assert!(NewEvent::new("s", "{}").validate().is_ok());
        let long = NewEvent::new("s".repeat(256), "{}");
        assert!(matches!(long.validate(), Err(EventError::Field(_))));
        let nul = NewEvent::new("s", "{}").with_ordering_key("a\0b");
        assert!(matches!(nul.validate(), Err(EventError::Field(_))));
        let empty = NewEvent::new("", "{}");
        assert!(matches!(empty.validate(), Err(EventError::Field(_))));
    }
}
