//! Reading the slot: committed transactions gathered into windows, and
//! the positions the relay confirms once a window is published.

use std::time::Duration;

use pgwire_replication::{Lsn, PgWireError, ReplicationEvent};
use service::wal::relay::Partial;
use service::wal::{self, WalEvent};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::WalError;
use super::ahead::{Ahead, Queued};

/// Most payload bytes a window holds: with big events it goes sooner, so a
/// window of megabyte events does not hold gigabytes. A transaction larger
/// than a window goes in pieces of about this size (or of the window's
/// event count), at message boundaries.
const WINDOW_BYTES: usize = 16 << 20;

/// How long a window that has events waits for more before it goes.
const LINGER: Duration = Duration::from_millis(1);

/// Committed transactions read from the slot, up to a commit boundary.
#[derive(Debug, Default)]
pub(super) struct Window {
    /// Their events, in commit order.
    pub(super) events: Vec<WalEvent>,
    /// Where the slot may be confirmed once they are published.
    pub(super) end: Option<Lsn>,
    /// Commit time of the last transaction (microseconds since 2000-01-01).
    pub(super) commit_time: Option<i64>,
    /// Seawall messages this version could not decode, with why.
    pub(super) undecodable: Vec<(Vec<u8>, String)>,
    /// Set when the window ends inside a transaction too large for one
    /// window: the transaction, and how many of its messages are done once
    /// this window is published.
    pub(super) partial: Option<Partial>,
}

/// The pace of keepalive-only windows (a keepalive, other databases' or
/// other applications' WAL): every position the slot is confirmed at is
/// recorded first (so a slot confirmed past the record was remade, see
/// `service::wal::slot::prepare`), and these come far more often than a
/// record is worth. Each record is a commit, and the slot lags the server
/// by at most `every` of WAL.
#[derive(Debug)]
pub(super) struct Keepalives {
    every: Duration,
    last: Option<tokio::time::Instant>,
}

impl Keepalives {
    /// Keepalive positions recorded at most once `every`.
    pub(super) fn every(every: Duration) -> Self {
        Self { every, last: None }
    }

    /// Whether a keepalive-only window is to be recorded (and confirmed)
    /// now. One passed over is neither recorded nor confirmed; a later one
    /// is.
    pub(super) fn due(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if self.last.is_some_and(|last| now - last < self.every) {
            return false;
        }
        self.last = Some(now);
        true
    }
}

impl Window {
    /// Whether the window only moves the position on: no events, nothing
    /// undecodable, no piece of a transaction.
    pub(super) fn only_moves(&self) -> bool {
        self.events.is_empty() && self.undecodable.is_empty() && self.partial.is_none()
    }
}

/// The transaction being read, not yet committed.
#[derive(Debug)]
pub(super) struct Open {
    /// Its commit position, which names it.
    commit: Lsn,
    /// Its events read since the last piece went.
    events: Vec<WalEvent>,
    /// Their payload bytes.
    bytes: usize,
    /// Seawall messages of it read so far, skipped ones included.
    read: u64,
    /// Messages of it a piece published before a restart: skipped.
    skip: u64,
}

/// Most bytes of an undecodable message kept in its dead letter.
const KEPT_BYTES: usize = 1 << 20;

/// The events of a seawall message, each checked as an outbox row would
/// store it: the relay may have to write any of them to the table, and a
/// row that cannot be written would stop it on that window for good.
fn checked(content: &bytes::Bytes) -> Result<Vec<WalEvent>, String> {
    let events = wal::decode(content).map_err(|e| e.to_string())?;
    for (i, e) in events.iter().enumerate() {
        service::outbox::check_event(
            &e.message_id,
            &e.subject,
            e.ordering_key.as_deref(),
            &e.headers,
        )
        .map_err(|err| format!("event {i} of the message: {err}"))?;
    }
    Ok(events)
}

/// What a dead letter keeps of an undecodable message: all of it up to
/// [`KEPT_BYTES`], its start beyond that.
fn kept(content: &[u8]) -> Vec<u8> {
    content[..content.len().min(KEPT_BYTES)].to_vec()
}

/// The stream's end, as an error: a session ends when its stream does.
pub(super) fn ended() -> WalError {
    WalError::Replication(PgWireError::Protocol("the replication stream ended".into()))
}

/// Reads windows from the slot for a session, from the messages
/// [`super::ahead`] reads ahead (which also confirms the positions the
/// session sends back once their windows are published).
pub(super) struct Reader {
    pub(super) ahead: mpsc::UnboundedReceiver<Queued>,
    /// How long the stream may stay silent while the reader waits on it
    /// before the reader asks whether the server still streams to it
    /// ([`WalError::Silent`] when not).
    pub(super) silence: Duration,
    /// The pool, to ask that.
    pub(super) db: sea_orm::DatabaseConnection,
    /// The session's replication connection's `application_name`.
    pub(super) application: String,
    pub(super) size: usize,
    /// A transaction published in part before this session.
    pub(super) resume: Option<Partial>,
    /// The transaction being read, across the windows it spans.
    pub(super) open: Option<Open>,
}

impl Reader {
    /// Sends windows until `stop` fires, the session goes, or the stream
    /// fails (the error is the last thing sent); the pump then lets the
    /// slot go.
    pub(super) async fn run(
        mut self,
        windows: mpsc::Sender<Result<Window, WalError>>,
        stop: CancellationToken,
    ) {
        loop {
            let window = tokio::select! {
                () = stop.cancelled() => break,
                window = self.window() => window,
            };
            let failed = window.is_err();
            if windows.send(window).await.is_err() || failed {
                break;
            }
        }
    }

    /// The next message (the receive is cancel-safe). `linger` bounds the
    /// wait: `None` once it passes. Without one, the wait is checked every
    /// silence: PostgreSQL sends nothing to a relay that keeps confirming
    /// while there is nothing to send, or while its walsender reads through
    /// a long stretch of other WAL, but then the pool sees that walsender;
    /// when it does not (or cannot answer), the server is gone or the
    /// connection is.
    async fn next(&mut self, linger: Option<Duration>) -> Result<Option<Ahead>, WalError> {
        let mut deadline = tokio::time::Instant::now() + linger.unwrap_or(self.silence);
        loop {
            tokio::select! {
                ahead = self.ahead.recv() => return Ok(Some(ahead.ok_or_else(ended)??)),
                () = tokio::time::sleep_until(deadline) => {
                    if linger.is_some() {
                        return Ok(None);
                    }
                    if !self.still_streamed().await {
                        return Err(WalError::Silent(self.silence));
                    }
                    tracing::debug!(silence = ?self.silence, "the WAL relay's stream is quiet, and its walsender is there: waiting on");
                    deadline = tokio::time::Instant::now() + self.silence;
                }
            }
        }
    }

    /// Whether the server still has this session's walsender, asked
    /// through the pool within one silence (a vanished server answers
    /// neither connection).
    async fn still_streamed(&self) -> bool {
        let asked = service::wal::relay::walsender_alive(&self.db, &self.application);
        match tokio::time::timeout(self.silence, asked).await {
            Ok(Ok(alive)) => alive,
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "could not ask whether the WAL relay's walsender is there");
                false
            }
            Err(_) => false,
        }
    }

    /// Reads committed transactions until the window holds `size` events or
    /// no more come within [`LINGER`]; waits for the first one (or a
    /// keepalive that moves the position on). A transaction that alone
    /// outgrows the window goes in pieces, each its own window, so the
    /// memory a transaction takes is bounded by the window's, not its size.
    async fn window(&mut self) -> Result<Window, WalError> {
        let mut window = Window::default();
        let mut bytes = 0usize;
        loop {
            let waiting = self.open.is_some() || (window.events.is_empty() && window.end.is_none());
            // Under load the stream delivers in small chunks; waiting a
            // moment for the next one fills the window, so the wait for the
            // window's last PubAck is paid per window, not per chunk.
            let Some(ahead) = self.next((!waiting).then_some(LINGER)).await? else {
                return Ok(window);
            };
            // Its share of the read-ahead goes back once it is in the window.
            match ahead.event {
                ReplicationEvent::Begin {
                    final_lsn,
                    commit_time_micros,
                    ..
                } => {
                    self.open_transaction(final_lsn);
                    window.commit_time = Some(commit_time_micros);
                }
                ReplicationEvent::Message {
                    prefix,
                    content,
                    transactional,
                    lsn,
                } if prefix == wal::PREFIX => {
                    let piece =
                        self.read_message(&mut window, &mut bytes, &content, transactional, lsn);
                    if piece {
                        return Ok(window);
                    }
                }
                ReplicationEvent::Commit { end_lsn, .. } => {
                    if let Some(txn) = self.open.take() {
                        bytes += txn.bytes;
                        window.events.extend(txn.events);
                    }
                    window.end = window.end.max(Some(end_lsn));
                    if window.events.len() >= self.size || bytes >= WINDOW_BYTES {
                        return Ok(window);
                    }
                }
                ReplicationEvent::KeepAlive { wal_end, .. } if self.open.is_none() => {
                    window.end = window.end.max(Some(wal_end));
                }
                _ => {}
            }
        }
    }

    /// Opens the transaction a `Begin` starts. One published in part before
    /// a restart is decoded again from its start (the slot is confirmed only
    /// at commits), so the messages its pieces did are counted to be skipped.
    fn open_transaction(&mut self, commit: Lsn) {
        let skip = self
            .resume
            .filter(|p| p.commit == commit.0)
            .map_or(0, |p| p.messages);
        self.open = Some(Open {
            commit,
            events: Vec::new(),
            bytes: 0,
            read: 0,
            skip,
        });
    }

    /// Adds a seawall message's events to the open transaction, or to
    /// `window` when it came outside one; one this version cannot decode is
    /// kept as a dead letter (`held` counts the bytes `window` holds). `true`
    /// when the transaction has outgrown the window and `window` holds its
    /// next piece, so a large transaction never sits whole in memory.
    fn read_message(
        &mut self,
        window: &mut Window,
        held: &mut usize,
        content: &bytes::Bytes,
        transactional: bool,
        lsn: Lsn,
    ) -> bool {
        let mut txn = self.open.as_mut().filter(|_| transactional);
        if let Some(txn) = txn.as_mut() {
            txn.read += 1;
            // Done by a piece published before a restart.
            if txn.read <= txn.skip {
                return false;
            }
        }
        let events = match checked(content) {
            Ok(events) => events,
            Err(err) => {
                let error = format!("{err} ({} bytes)", content.len());
                let kept = kept(content);
                // Held until the window is recorded: counted.
                *held += kept.len();
                window.undecodable.push((kept, error));
                return false;
            }
        };
        let Some(txn) = txn else {
            window.events.extend(events);
            window.end = window.end.max(Some(lsn));
            return false;
        };
        txn.bytes += events.iter().map(|e| e.payload.len()).sum::<usize>();
        txn.events.extend(events);
        if txn.events.len() >= self.size || *held + txn.bytes >= WINDOW_BYTES {
            window.events.append(&mut txn.events);
            txn.bytes = 0;
            window.partial = Some(Partial {
                commit: txn.commit.0,
                messages: txn.read,
            });
            return true;
        }
        false
    }
}
