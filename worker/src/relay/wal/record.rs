//! What a published window leaves in the database: the statements are
//! `service::wal::relay`'s; this converts the stream's positions for them.

use pgwire_replication::Lsn;
use sea_orm::DbErr;

use entity::outbox_message;
use service::wal::WalEvent;
use service::wal::relay::{Partial, Position, Reached};

use super::WalRelay;

impl WalRelay {
    /// Records a published window in one transaction (see
    /// [`service::wal::relay::record_window`]).
    pub(super) async fn record(
        &self,
        published: usize,
        rows: Vec<(outbox_message::ActiveModel, WalEvent)>,
        undecodable: &[(Vec<u8>, String)],
        end: Option<Lsn>,
        partial: Option<Partial>,
    ) -> Result<(), DbErr> {
        service::wal::relay::record_window(
            &self.db,
            &self.config.slot,
            published,
            rows,
            undecodable,
            Reached {
                end: end.map(lsn_value),
                partial,
            },
        )
        .await
    }

    /// Where the relays of this slot durably got to.
    pub(super) async fn position(&self) -> Result<Position, DbErr> {
        service::wal::relay::position(&self.db, &self.config.slot).await
    }
}

/// `lsn` as stored in `wal_relay_position` (a `bigint`; positions stay far
/// below 2^63).
fn lsn_value(lsn: Lsn) -> i64 {
    i64::try_from(lsn.0).unwrap_or(i64::MAX)
}
