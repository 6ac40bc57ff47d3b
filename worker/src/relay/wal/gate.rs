//! The synchronous-standby gate: a window is published only once every
//! synchronous standby has flushed its transactions. PostgreSQL's walsender
//! decodes a commit as soon as it is flushed locally, while the committing
//! client still waits for the standby; a failover in between promotes a
//! standby without the transaction, and its events, published already,
//! would announce something that never happened.

use std::time::{Duration, Instant};

use sea_orm::DatabaseConnection;
use service::wal::relay::standbys;
use tokio_util::sync::CancellationToken;

use super::WalError;
use super::reader::Window;

/// First pause between two readings of the standbys; doubles.
const FIRST_PAUSE: Duration = Duration::from_millis(1);

/// Longest pause between two readings.
const LONGEST_PAUSE: Duration = Duration::from_millis(100);

/// How long a window waits before the relay says why.
const WARN_AFTER: Duration = Duration::from_secs(10);

/// Holds windows back until the synchronous standbys have them.
#[derive(Debug)]
pub(super) struct Gate {
    /// The slot the session streams from.
    slot: String,
    /// The session's replication connection's `application_name`, by which
    /// the gate knows it asks the server that connection streams from.
    application: String,
    /// A position every synchronous standby had flushed when last read:
    /// windows ending before it go without asking again.
    synced: u64,
    /// The open transaction whose pieces are gated, and the position they
    /// wait for: the server's flush position when its first piece went,
    /// which is past its commit (a piece is decoded only once the
    /// transaction committed, but the commit's end is not known before its
    /// last piece is read).
    piece: Option<(u64, u64)>,
}

impl Gate {
    /// A gate for the session holding `slot` through the replication
    /// connection named `application`.
    pub(super) fn new(slot: &str, application: &str) -> Self {
        Self {
            slot: slot.to_owned(),
            application: application.to_owned(),
            synced: 0,
            piece: None,
        }
    }

    /// Whether every synchronous standby has flushed up to `window`'s end
    /// already (or none is required), asking at most once: a keepalive's
    /// position is recorded only then, since its record is a commit that
    /// would wait for a stalled standby.
    ///
    /// # Errors
    /// As [`Gate::wait`].
    pub(super) async fn caught_up(
        &mut self,
        db: &DatabaseConnection,
        window: &Window,
    ) -> Result<bool, WalError> {
        let target = window.end.map_or(0, |end| end.0);
        if target <= self.synced {
            return Ok(true);
        }
        let now = standbys(db, &self.slot, &self.application).await?;
        if !now.held {
            return Err(WalError::Elsewhere(self.slot.clone()));
        }
        if let Some(flushed) = now.flushed {
            self.synced = self.synced.max(flushed);
        }
        Ok(!now.required || target <= self.synced)
    }

    /// Waits until every synchronous standby has flushed `window`'s
    /// transactions, or, when `synchronous_standby_names` is empty, not at
    /// all. `false` when `cancel` fired first: the window was not published
    /// and the slot keeps it.
    ///
    /// # Errors
    /// The database error of a reading; [`WalError::Elsewhere`] when the
    /// pool reaches a server other than the one the session streams from.
    pub(super) async fn wait(
        &mut self,
        db: &DatabaseConnection,
        window: &Window,
        cancel: &CancellationToken,
    ) -> Result<bool, WalError> {
        if window.events.is_empty() {
            return Ok(true);
        }
        let commit = window.partial.map(|p| p.commit);
        if self.piece.map(|(c, _)| c) != commit {
            self.piece = None;
        }
        let mut target = window
            .end
            .map_or(0, |end| end.0)
            .max(self.piece.map_or(0, |(_, at)| at));
        let known = commit.is_none() || self.piece.is_some();
        if known && target <= self.synced {
            return Ok(true);
        }
        let started = Instant::now();
        let mut pause = FIRST_PAUSE;
        let mut warned = false;
        loop {
            let now = standbys(db, &self.slot, &self.application).await?;
            if !now.held {
                return Err(WalError::Elsewhere(self.slot.clone()));
            }
            if let (Some(commit), None) = (commit, self.piece) {
                self.piece = Some((commit, now.local));
                target = target.max(now.local);
            }
            if !now.required {
                return Ok(true);
            }
            if let Some(flushed) = now.flushed {
                self.synced = self.synced.max(flushed);
            }
            if target <= self.synced {
                return Ok(true);
            }
            if !warned && started.elapsed() >= WARN_AFTER {
                warned = true;
                let flushed = match now.flushed {
                    Some(f) => service::wal::slot::Lsn(f).to_string(),
                    None if now.visible => "none connected".to_owned(),
                    None => "not visible: grant pg_read_all_stats to the relay's role".to_owned(),
                };
                tracing::warn!(
                    waiting_for = %service::wal::slot::Lsn(target),
                    %flushed,
                    "the WAL relay holds a window until the synchronous standbys have flushed it (synchronous_standby_names is set)"
                );
            }
            tokio::select! {
                () = cancel.cancelled() => return Ok(false),
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }
}
