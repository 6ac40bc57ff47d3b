//! Reading the slot: committed transactions gathered into windows, and
//! the positions the relay confirms once a window is published.

use std::time::Duration;

use pgwire_replication::{Lsn, PgWireError, ReplicationClient, ReplicationEvent};
use service::wal::{self, WalEvent};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::WalError;

/// Fewest events a window may hold before it goes (when that many are ready).
pub const MIN_WINDOW: usize = 5_000;

/// Most payload bytes a window holds: with big events it goes sooner, so a
/// window of megabyte events does not hold gigabytes.
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

/// Reads windows from the slot for a session, and confirms the positions
/// the session sends back once their windows are published.
pub(super) struct Reader {
    pub(super) client: ReplicationClient,
    pub(super) confirms: mpsc::UnboundedReceiver<Lsn>,
    pub(super) size: usize,
}

impl Reader {
    /// Sends windows until `stop` fires, the session goes, or the stream
    /// fails (the error is the last thing sent); then lets the slot go.
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
        self.client.stop();
    }

    /// The next event, confirming positions while it waits (both receives
    /// are cancel-safe). `linger` bounds the wait: `None` once it passes.
    async fn next(
        &mut self,
        linger: Option<Duration>,
    ) -> Result<Option<ReplicationEvent>, WalError> {
        let deadline = linger.map(|l| tokio::time::Instant::now() + l);
        loop {
            let timeout = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = self.client.recv() => return Ok(Some(event?.ok_or_else(ended)?)),
                Some(lsn) = self.confirms.recv() => self.client.update_applied_lsn(lsn),
                () = timeout => return Ok(None),
            }
        }
    }

    /// Reads committed transactions until the window holds `size` events or
    /// no more come within [`LINGER`]; waits for the first one (or a
    /// keepalive that moves the position on).
    async fn window(&mut self) -> Result<Window, WalError> {
        let mut window = Window::default();
        let mut open: Option<Vec<WalEvent>> = None;
        let mut bytes = 0usize;
        loop {
            let waiting = open.is_some() || (window.events.is_empty() && window.end.is_none());
            // Under load the stream delivers in small chunks; waiting a
            // moment for the next one fills the window, so the wait for the
            // window's last PubAck is paid per window, not per chunk.
            let Some(event) = self.next((!waiting).then_some(LINGER)).await? else {
                return Ok(window);
            };
            match event {
                ReplicationEvent::Begin {
                    commit_time_micros, ..
                } => {
                    open = Some(Vec::new());
                    window.commit_time = Some(commit_time_micros);
                }
                ReplicationEvent::Message {
                    prefix,
                    content,
                    transactional,
                    lsn,
                } if prefix == wal::PREFIX => match checked(&content) {
                    Ok(events) => match open.as_mut() {
                        Some(txn) if transactional => txn.extend(events),
                        _ => {
                            window.events.extend(events);
                            window.end = window.end.max(Some(lsn));
                        }
                    },
                    Err(err) => {
                        let error = format!("{err} ({} bytes)", content.len());
                        window.undecodable.push((kept(&content), error));
                    }
                },
                ReplicationEvent::Commit { end_lsn, .. } => {
                    let txn = open.take().unwrap_or_default();
                    bytes += txn.iter().map(|e| e.payload.len()).sum::<usize>();
                    window.events.extend(txn);
                    window.end = window.end.max(Some(end_lsn));
                    if window.events.len() >= self.size || bytes >= WINDOW_BYTES {
                        return Ok(window);
                    }
                }
                ReplicationEvent::KeepAlive { wal_end, .. } if open.is_none() => {
                    window.end = window.end.max(Some(wal_end));
                }
                _ => {}
            }
        }
    }
}
