//! The WAL mode's settings: the relay's, and the slot's name, which may be
//! one an earlier release gave a running deployment.

use std::time::Duration;

use super::Settings;

impl Settings {
    /// The WAL relay's settings (`outbox_mode = "wal"`).
    pub fn wal_relay(&self) -> worker::relay::wal::WalRelayConfig {
        let relay = self.relay();
        worker::relay::wal::WalRelayConfig {
            database_url: self.database_url.clone(),
            slot: self.wal_slot(),
            window: usize::try_from(self.wal_window).unwrap_or(usize::MAX),
            standby_retry: Duration::from_secs(1),
            holder_timeout: relay.lease,
            handoff_after: Duration::from_millis(self.wal_handoff_ms),
            retry_base: relay.retry_base,
            retry_max: relay.retry_max,
            server_errors: None,
        }
    }

    /// The WAL relay's slot: `wal_slot`, else the slot an earlier release
    /// named that still relays the database ([`Settings::settle_wal_slot`]),
    /// else one named after the database.
    pub fn wal_slot(&self) -> String {
        self.wal_slot
            .clone()
            .or_else(|| self.settled_wal_slot.get().cloned())
            .unwrap_or_else(|| worker::relay::wal::default_slot_name(&self.database_url))
    }

    /// Looks up, once, whether the database is still relayed from a slot an
    /// earlier release named differently (from the URL's path alone), and
    /// keeps that name for [`Settings::wal_slot`]: a default that changed
    /// must not leave a deployment's slot, and its position, behind.
    ///
    /// # Errors
    /// The database error.
    pub async fn settle_wal_slot(
        &self,
        db: &sea_orm::DatabaseConnection,
    ) -> Result<(), sea_orm::DbErr> {
        if self.wal_slot.is_some() || self.settled_wal_slot.get().is_some() {
            return Ok(());
        }
        if let Some(slot) = worker::relay::wal::settled_slot(db, &self.database_url).await? {
            tracing::info!(%slot, "wal_slot is unset: keeping the slot an earlier release named, which still relays this database");
            let _ = self.settled_wal_slot.set(slot);
        }
        Ok(())
    }
}
