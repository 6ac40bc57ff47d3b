//! The WAL relay's slot as the relay reports on it: made ready at start-up
//! (and after a failed session), its losses said loudly, its name for a
//! deployment an earlier release set up, and the WAL it risks losing.

use std::time::Duration;

use sea_orm::DatabaseConnection;

use super::{SlotError, SlotLoss, WalRelay, default_slot_name};

/// Makes sure the slot can be read ([`service::wal::slot::prepare`]: made
/// when missing, made again when PostgreSQL invalidated it) and reports a
/// loss it found: an error naming the slot and the WAL range whose events
/// were never relayed, and `seawall_wal_slot_recreated_total`. The loss is
/// in `wal_slot_loss` too, which the `api` exports for the alert.
///
/// # Errors
/// As [`service::wal::slot::prepare`].
pub async fn prepare(db: &DatabaseConnection, slot: &str) -> Result<(), SlotError> {
    if let Some(loss) = service::wal::slot::prepare(db, slot).await? {
        report_loss(slot, loss);
    }
    Ok(())
}

/// Says that `slot` was lost and made again (by seawall or someone else):
/// an error naming the WAL range whose events were never relayed, and
/// `seawall_wal_slot_recreated_total`.
pub(super) fn report_loss(slot: &str, loss: SlotLoss) {
    tracing::error!(
        %slot,
        relayed_to = %loss.relayed_to,
        restarted_at = %loss.restarted_at,
        "the WAL slot was gone (dropped, invalidated by max_slot_wal_keep_size, or made again by someone else) and a new one took its place: events committed between relayed_to and restarted_at were not relayed (recorded in wal_slot_loss)"
    );
    metrics::counter!("seawall_wal_slot_recreated_total").increment(1);
}

/// The slot a process without `wal_slot` uses on `db`: the one a release
/// before this one named from `database_url`'s path alone, while it still
/// relays this database (an existing slot keeps its name, and its
/// position); else `None`, and [`default_slot_name`] applies.
///
/// # Errors
/// The database error.
pub async fn settled_slot(
    db: &DatabaseConnection,
    database_url: &str,
) -> Result<Option<String>, sea_orm::DbErr> {
    let legacy = service::wal::slot::legacy_slot_name(database_url);
    if legacy == default_slot_name(database_url) {
        return Ok(None);
    }
    let relayed = service::wal::mode::wal_slots(db).await?;
    Ok(relayed.contains(&legacy).then_some(legacy))
}

/// How often a relay holding the slot checks that PostgreSQL keeps the WAL
/// the slot needs.
pub(super) const RESERVE_CHECK: Duration = Duration::from_secs(60);

impl WalRelay {
    /// Warns while the slot needs more WAL than `max_slot_wal_keep_size`
    /// keeps (`wal_status = 'unreserved'`): the next checkpoint may remove
    /// WAL not yet relayed, and the slot is lost. A failed check is only
    /// logged: it must not end the session.
    pub(super) async fn warn_if_at_risk(&self) {
        match service::wal::backlog(&self.db, &self.config.slot).await {
            Ok(Some(backlog)) if backlog.at_risk() => tracing::warn!(
                slot = %self.config.slot,
                wal_status = backlog.wal_status.as_deref().unwrap_or(""),
                retained_bytes = backlog.retained_bytes,
                behind_bytes = backlog.behind_bytes,
                "PostgreSQL keeps less WAL than the WAL slot needs (max_slot_wal_keep_size): if a checkpoint removes it, the events the relay has not read yet are lost",
            ),
            Ok(_) => {}
            Err(err) => tracing::debug!(error = %err, "could not check the WAL slot's reserve"),
        }
    }
}
