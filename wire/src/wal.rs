//! The outbox in the write-ahead log (`outbox_mode = "wal"`, PostgreSQL).
//!
//! Instead of a row per event, the handler's transaction calls
//! `pg_logical_emit_message(true, 'seawall.outbox', <events>)`: the events
//! are written to the WAL with the transaction's other changes, become
//! visible to a logical replication slot when (and only if) it commits, and
//! cost no heap row, index entry, update or vacuum. The relay reads them from
//! the slot in commit order (`worker::relay::wal`). This module is the
//! encoding both sides share; `service::wal` writes it to the WAL.
//!
//! # Encoding, version 1
//!
//! One logical message carries the events of one `enqueue`/`enqueue_all`
//! call, or a part of them in order when they are more than
//! [`MESSAGE_BYTES`]. Integers are big-endian; `str16` is a `u16` byte length and UTF-8
//! bytes, `bytes32` a `u32` length and the bytes, `opt` a `u8` (0 absent,
//! 1 present) followed by the value when present.
//!
//! | field | type |
//! |---|---|
//! | version | `u8`, 1 |
//! | events | `u32` count, then each event: |
//! | message id | `str16` (the `Nats-Msg-Id`) |
//! | subject | `str16` |
//! | ordering key | `opt str16` |
//! | headers | `u16` count, then `str16` name and `bytes32` UTF-8 value each |
//! | payload | `bytes32` |
//! | causation id, causation consumer, correlation id | `opt str16` each |
//! | created at | `i64` microseconds since the Unix epoch |
//!
//! A reader refuses a version it does not know rather than guess.

use std::collections::BTreeMap;

use bytes::Bytes;
use chrono::{DateTime, Utc};

/// The prefix of seawall's logical messages; messages with other prefixes
/// (other applications on the same database) are not seawall's.
pub const PREFIX: &str = "seawall.outbox";

/// The encoding this version writes.
pub const VERSION: u8 = 1;

/// An event as the WAL carries it: everything an outbox row holds that the
/// relay needs to publish it, or to record it as a dead row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalEvent {
    /// Sent as `Nats-Msg-Id`.
    pub message_id: String,
    /// NATS subject.
    pub subject: String,
    /// Events sharing a key are published in commit order.
    pub ordering_key: Option<String>,
    /// NATS headers (trace context, correlation id, the handler's own).
    pub headers: BTreeMap<String, String>,
    /// The message body.
    pub payload: Bytes,
    /// The message whose handler wrote it, if any.
    pub causation_id: Option<String>,
    /// That handler's consumer.
    pub causation_consumer: Option<String>,
    /// Its conversation.
    pub correlation_id: Option<String>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
}

/// Content that is not a batch of events this version can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Written by a newer (or foreign) writer.
    #[error("unknown outbox encoding version {0} (this relay reads version {VERSION})")]
    Version(u8),
    /// Cut short or padded.
    #[error("malformed outbox message: {0}")]
    Malformed(&'static str),
}

/// A field too long for its length prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("outbox event field {field} is {len} bytes, more than its encoding allows")]
pub struct TooLong {
    /// The field.
    pub field: &'static str,
    /// Its length.
    pub len: usize,
}

fn put_str16(out: &mut Vec<u8>, field: &'static str, s: &str) -> Result<(), TooLong> {
    let len = u16::try_from(s.len()).map_err(|_| TooLong {
        field,
        len: s.len(),
    })?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put_bytes32(out: &mut Vec<u8>, field: &'static str, b: &[u8]) -> Result<(), TooLong> {
    let len = u32::try_from(b.len()).map_err(|_| TooLong {
        field,
        len: b.len(),
    })?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(b);
    Ok(())
}

fn put_opt(out: &mut Vec<u8>, field: &'static str, s: Option<&str>) -> Result<(), TooLong> {
    match s {
        None => {
            out.push(0);
            Ok(())
        }
        Some(s) => {
            out.push(1);
            put_str16(out, field, s)
        }
    }
}

/// Most content bytes a logical message carries when it holds more than
/// one event. The relay reads a message whole (one replication message,
/// one frame), so this bounds what each message it buffers takes: a
/// megabyte-event `enqueue_all` of a gigabyte would otherwise be a
/// gigabyte in one piece.
pub const MESSAGE_BYTES: usize = 1 << 20;

/// The bytes `encode` writes for `e` (a message adds 5 of its own).
fn encoded_size(e: &WalEvent) -> usize {
    let opt = |s: &Option<String>| 1 + s.as_ref().map_or(0, |s| 2 + s.len());
    let headers: usize = e.headers.iter().map(|(n, v)| 6 + n.len() + v.len()).sum();
    2 + e.message_id.len()
        + 2
        + e.subject.len()
        + opt(&e.ordering_key)
        + 2
        + headers
        + 4
        + e.payload.len()
        + opt(&e.causation_id)
        + opt(&e.causation_consumer)
        + opt(&e.correlation_id)
        + 8
}

/// Encodes `events` as the contents of as few logical messages as keep
/// each within `max` bytes, in order (an event larger than `max` alone in
/// its message): see [`MESSAGE_BYTES`].
///
/// # Errors
/// As [`encode`].
pub fn encode_split(events: &[WalEvent], max: usize) -> Result<Vec<Vec<u8>>, TooLong> {
    let mut contents = Vec::new();
    let (mut start, mut bytes) = (0, 5);
    for (i, e) in events.iter().enumerate() {
        let size = encoded_size(e);
        if i > start && bytes + size > max {
            contents.push(encode(&events[start..i])?);
            (start, bytes) = (i, 5);
        }
        bytes += size;
    }
    if start < events.len() {
        contents.push(encode(&events[start..])?);
    }
    Ok(contents)
}

/// Encodes `events` as one logical message's content.
///
/// # Errors
/// [`TooLong`] for a field longer than its length prefix (a subject over
/// 64 KiB, a payload over 4 GiB).
pub fn encode(events: &[WalEvent]) -> Result<Vec<u8>, TooLong> {
    let size: usize = 5 + events.iter().map(encoded_size).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(VERSION);
    let count = u32::try_from(events.len()).map_err(|_| TooLong {
        field: "events",
        len: events.len(),
    })?;
    out.extend_from_slice(&count.to_be_bytes());
    for e in events {
        put_str16(&mut out, "message_id", &e.message_id)?;
        put_str16(&mut out, "subject", &e.subject)?;
        put_opt(&mut out, "ordering_key", e.ordering_key.as_deref())?;
        let headers = u16::try_from(e.headers.len()).map_err(|_| TooLong {
            field: "headers",
            len: e.headers.len(),
        })?;
        out.extend_from_slice(&headers.to_be_bytes());
        for (name, value) in &e.headers {
            put_str16(&mut out, "header name", name)?;
            put_bytes32(&mut out, "header value", value.as_bytes())?;
        }
        put_bytes32(&mut out, "payload", &e.payload)?;
        put_opt(&mut out, "causation_id", e.causation_id.as_deref())?;
        put_opt(
            &mut out,
            "causation_consumer",
            e.causation_consumer.as_deref(),
        )?;
        put_opt(&mut out, "correlation_id", e.correlation_id.as_deref())?;
        out.extend_from_slice(&e.created_at.timestamp_micros().to_be_bytes());
    }
    Ok(out)
}

/// A cursor over content being decoded.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Malformed("cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn str16(&mut self) -> Result<String, DecodeError> {
        let len = u16::from_be_bytes(self.array()?);
        let bytes = self.take(usize::from(len))?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::Malformed("text is not UTF-8"))
    }

    fn bytes32(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = u32::from_be_bytes(self.array()?);
        self.take(usize::try_from(len).map_err(|_| DecodeError::Malformed("length"))?)
    }

    fn opt(&mut self) -> Result<Option<String>, DecodeError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.str16().map(Some),
            _ => Err(DecodeError::Malformed("presence flag")),
        }
    }
}

/// Decodes one logical message's content; the payloads share its buffer.
///
/// # Errors
/// [`DecodeError`] for another version or malformed content.
pub fn decode(content: &Bytes) -> Result<Vec<WalEvent>, DecodeError> {
    let mut r = Reader(content);
    let version = r.u8()?;
    if version != VERSION {
        return Err(DecodeError::Version(version));
    }
    let count = u32::from_be_bytes(r.array()?);
    // Each event takes at least 24 bytes: a count beyond that is garbage.
    if usize::try_from(count).unwrap_or(usize::MAX) > content.len() / 24 {
        return Err(DecodeError::Malformed("event count"));
    }
    // Bounded: a made-up count must not reserve memory for itself.
    let mut events = Vec::with_capacity((count as usize).min(1024));
    for _ in 0..count {
        let message_id = r.str16()?;
        let subject = r.str16()?;
        let ordering_key = r.opt()?;
        let header_count = u16::from_be_bytes(r.array()?);
        let mut headers = BTreeMap::new();
        for _ in 0..header_count {
            let name = r.str16()?;
            let value = String::from_utf8(r.bytes32()?.to_vec())
                .map_err(|_| DecodeError::Malformed("header value is not UTF-8"))?;
            if headers.insert(name, value).is_some() {
                // One value would be dropped without a word.
                return Err(DecodeError::Malformed("a header name appears twice"));
            }
        }
        let payload = content.slice_ref(r.bytes32()?);
        let causation_id = r.opt()?;
        let causation_consumer = r.opt()?;
        let correlation_id = r.opt()?;
        let micros = i64::from_be_bytes(r.array()?);
        let created_at =
            DateTime::from_timestamp_micros(micros).ok_or(DecodeError::Malformed("created_at"))?;
        events.push(WalEvent {
            message_id,
            subject,
            ordering_key,
            headers,
            payload,
            causation_id,
            causation_consumer,
            correlation_id,
            created_at,
        });
    }
    if !r.0.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes"));
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str) -> WalEvent {
        WalEvent {
            message_id: id.into(),
            subject: "ledger.recorded".into(),
            ordering_key: Some("acct-1".into()),
            headers: BTreeMap::from([
                ("traceparent".into(), "00-ab-cd-01".into()),
                ("Seawall-Correlation-Id".into(), "c-1".into()),
            ]),
            payload: Bytes::from_static(b"{\"n\":1}"),
            causation_id: Some("m-0".into()),
            causation_consumer: Some("ledger".into()),
            correlation_id: None,
            created_at: DateTime::from_timestamp_micros(1_764_550_000_123_456).unwrap(),
        }
    }

    #[test]
    fn events_survive_the_round_trip() {
        let events = vec![
            event("a"),
            event("b"),
            WalEvent {
                ordering_key: None,
                headers: BTreeMap::new(),
                payload: Bytes::new(),
                ..event("c")
            },
        ];
        assert_eq!(decode(&encode(&events).unwrap().into()).unwrap(), events);
        assert_eq!(decode(&encode(&[]).unwrap().into()).unwrap(), vec![]);
    }

    #[test]
    fn an_events_size_is_what_encode_writes() {
        let bare = WalEvent {
            ordering_key: None,
            headers: BTreeMap::new(),
            causation_id: None,
            ..event("b")
        };
        for e in [event("a"), bare] {
            assert_eq!(
                encode(std::slice::from_ref(&e)).unwrap().len(),
                5 + encoded_size(&e)
            );
        }
    }

    #[test]
    fn many_events_split_into_messages_within_the_bound() {
        let big = WalEvent {
            payload: Bytes::from(vec![7; 300]),
            ..event("big")
        };
        let events: Vec<_> = (0..10)
            .map(|i| WalEvent {
                message_id: format!("e-{i:02}"),
                ..event("x")
            })
            .chain([big.clone()])
            .chain((10..13).map(|i| WalEvent {
                message_id: format!("e-{i:02}"),
                ..event("x")
            }))
            .collect();
        let max = 5 + 3 * encoded_size(&events[0]);
        let contents = encode_split(&events, max).unwrap();
        // Three to a message; the big one alone, over the bound.
        let counts: Vec<usize> = contents
            .iter()
            .map(|c| decode(&c.clone().into()).unwrap().len())
            .collect();
        assert_eq!(counts, [3, 3, 3, 1, 1, 3]);
        for c in &contents {
            assert!(c.len() <= max || decode(&c.clone().into()).unwrap() == [big.clone()]);
        }
        let back: Vec<WalEvent> = contents
            .iter()
            .flat_map(|c| decode(&c.clone().into()).unwrap())
            .collect();
        assert_eq!(back, events);
        assert!(encode_split(&[], max).unwrap().is_empty());
    }

    #[test]
    fn other_versions_and_damaged_content_are_refused() {
        let decoded = |b: &[u8]| decode(&Bytes::copy_from_slice(b));
        let mut content = encode(&[event("a")]).unwrap();
        assert_eq!(
            decoded(&content[..content.len() - 1]),
            Err(DecodeError::Malformed("cut short"))
        );
        content.push(0);
        assert_eq!(
            decoded(&content),
            Err(DecodeError::Malformed("trailing bytes"))
        );
        content[0] = 2;
        assert_eq!(decoded(&content), Err(DecodeError::Version(2)));
        assert!(decoded(&[]).is_err());
        assert_eq!(
            decoded(&[1, 0xff, 0xff, 0xff, 0xff]),
            Err(DecodeError::Malformed("event count"))
        );
    }

    #[test]
    fn a_field_too_long_for_its_prefix_is_refused() {
        let long = WalEvent {
            subject: "s".repeat(70_000),
            ..event("a")
        };
        assert_eq!(encode(&[long]).unwrap_err().field, "subject");
    }
}
