//! The relay's heartbeat: a tiny non-transactional logical message written
//! through the pool at a steady pace, so that the replication stream always
//! has something to deliver. PostgreSQL sends nothing on an idle database
//! while the relay keeps confirming, so without it a stream that went quiet
//! could be an idle server or a vanished one; with it, a silence longer
//! than a few heartbeats ends the session ([`super::WalError::Silent`]).

use std::convert::Infallible;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, Statement};

use super::WalRelay;

/// The heartbeat message's prefix: the relay reads only its own prefix
/// (`service::wal::PREFIX`), and other decoders of the database see what
/// it is.
const PREFIX: &str = "seawall-heartbeat";

/// Heartbeats per silence: a silence is several missed heartbeats, not one
/// slow one.
const PER_SILENCE: u32 = 4;

impl WalRelay {
    /// How long the replication stream may stay silent (and a connection
    /// take to open) before the session ends: twice `holder_timeout`, the
    /// time PostgreSQL itself gives a silent relay, and at least a second.
    pub(super) fn silence(&self) -> Duration {
        (self.config.holder_timeout * 2).max(Duration::from_secs(1))
    }

    /// Writes a heartbeat every quarter of the silence, for as long as the
    /// session streams. A failed write is only logged: the silence that
    /// follows, if the server is gone, is what ends the session.
    pub(super) async fn heartbeats(&self) -> Infallible {
        let pace = self.silence() / PER_SILENCE;
        let beat = Statement::from_string(
            DbBackend::Postgres,
            format!("SELECT pg_logical_emit_message(false, '{PREFIX}', '')::text"),
        );
        loop {
            tokio::time::sleep(pace).await;
            if let Err(err) = self.db.execute_raw(beat.clone()).await {
                tracing::debug!(error = %err, "the WAL relay's heartbeat could not be written");
            }
        }
    }
}
