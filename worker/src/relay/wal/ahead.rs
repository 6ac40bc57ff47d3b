//! Replication messages read ahead of the reader, bounded in bytes. With
//! small events the reader wants thousands of messages read ahead (the
//! stream delivers in chunks while a window is published); with megabyte
//! events a few hundred would be hundreds of megabytes, and during a NATS
//! outage every buffer fills. So the library keeps a few messages, and a
//! pump moves them on into a queue that holds at most [`AHEAD_BYTES`] of
//! them, whatever their count. It owns the connection, so it also confirms
//! the positions the session sends back.

use std::sync::Arc;

use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::WalError;
use super::reader::ended;

/// Most bytes of replication messages queued for the reader (a message
/// larger than that alone takes all of it).
pub(super) const AHEAD_BYTES: usize = 8 << 20;

/// Replication messages the library itself buffers: few, as each may be a
/// whole logical message (up to `service::wal::MESSAGE_BYTES` as seawall
/// writes them, one event when it is larger).
pub(super) const LIBRARY_MESSAGES: usize = 8;

/// What each message weighs besides its content: the small ones (begin,
/// commit, keepalive) are counted too, or a stream of them would queue
/// without bound.
const OVERHEAD: usize = 128;

/// A replication message read ahead, holding its share of [`AHEAD_BYTES`]
/// until the reader is done with it.
pub(super) struct Ahead {
    /// The message.
    pub(super) event: ReplicationEvent,
    /// Given back when the message is dropped.
    _share: OwnedSemaphorePermit,
}

/// What the queue gives the reader: a message, or the stream's failure or
/// end (the last thing sent).
pub(super) type Queued = Result<Ahead, WalError>;

/// Starts moving `client`'s messages into the queue returned, confirming
/// each position `confirms` sends, until `stop` fires or the reader goes;
/// then lets the slot go.
pub(super) fn start(
    client: ReplicationClient,
    confirms: mpsc::UnboundedReceiver<Lsn>,
    stop: CancellationToken,
) -> mpsc::UnboundedReceiver<Queued> {
    let (queue, ahead) = mpsc::unbounded_channel();
    tokio::spawn(pump(client, confirms, queue, stop));
    ahead
}

/// The bytes `event` takes in the queue.
fn weight(event: &ReplicationEvent) -> u32 {
    let content = match event {
        ReplicationEvent::Message {
            prefix, content, ..
        } => prefix.len() + content.len(),
        ReplicationEvent::XLogData { data, .. } => data.len(),
        _ => 0,
    };
    u32::try_from((OVERHEAD + content).min(AHEAD_BYTES)).unwrap_or(u32::MAX)
}

/// The pump: a message is read only once the one before it is queued, and
/// queued only once its bytes fit.
async fn pump(
    mut client: ReplicationClient,
    mut confirms: mpsc::UnboundedReceiver<Lsn>,
    queue: mpsc::UnboundedSender<Queued>,
    stop: CancellationToken,
) {
    let budget = Arc::new(Semaphore::new(AHEAD_BYTES));
    loop {
        // The receives (the stream's while it streams) and the acquire are
        // cancel-safe.
        let read = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            Some(lsn) = confirms.recv() => {
                client.update_applied_lsn(lsn);
                continue;
            }
            read = client.recv() => read,
        };
        let event = match read {
            Ok(Some(event)) => event,
            Ok(None) => {
                let _ = queue.send(Err(ended()));
                break;
            }
            Err(err) => {
                let _ = queue.send(Err(err.into()));
                break;
            }
        };
        let share = loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break None,
                Some(lsn) = confirms.recv() => client.update_applied_lsn(lsn),
                share = budget.clone().acquire_many_owned(weight(&event)) => break share.ok(),
            }
        };
        let Some(share) = share else { break };
        if queue
            .send(Ok(Ahead {
                event,
                _share: share,
            }))
            .is_err()
        {
            break;
        }
    }
    // Positions sent back before the end are confirmed too.
    while let Ok(lsn) = confirms.try_recv() {
        client.update_applied_lsn(lsn);
    }
    client.stop();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_weighs_its_content_and_no_more_than_the_queue() {
        let message = |len: usize| ReplicationEvent::Message {
            transactional: true,
            lsn: Lsn(1),
            prefix: "seawall.outbox".into(),
            content: bytes::Bytes::from(vec![0; len]),
        };
        assert_eq!(weight(&message(1000)) as usize, OVERHEAD + 14 + 1000);
        assert_eq!(weight(&message(AHEAD_BYTES * 2)) as usize, AHEAD_BYTES);
        let keepalive = ReplicationEvent::KeepAlive {
            wal_end: Lsn(1),
            reply_requested: false,
            server_time_micros: 0,
        };
        assert_eq!(weight(&keepalive) as usize, OVERHEAD);
    }
}
