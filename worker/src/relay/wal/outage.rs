//! A NATS outage as the WAL relay lives through it: a short one is waited
//! out, each window retried in place; past `handoff_after` the windows go
//! to the outbox table instead (as a stopping relay's do), so the slot
//! keeps moving and PostgreSQL frees the WAL it would otherwise retain for
//! the whole database. The table relay publishes the rows once NATS is
//! back, and later events of their keys queue behind them, so a key's
//! order holds.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream;

/// Since when NATS has been unreachable, as windows found it.
#[derive(Debug, Default)]
pub(super) struct Outage {
    since: Mutex<Option<Instant>>,
    /// Set once the hand-over of this outage was logged.
    told: Mutex<bool>,
}

impl Outage {
    fn since(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that a window found NATS unreachable; whether the outage has
    /// lasted `limit` by now (it starts with the first such window).
    pub(super) fn lasted_past(&self, limit: Duration) -> bool {
        let since = *self.since().get_or_insert_with(Instant::now);
        let past = since.elapsed() >= limit;
        if past {
            let mut told = self.told.lock().unwrap_or_else(|e| e.into_inner());
            if !*told {
                *told = true;
                tracing::warn!(
                    outage = ?since.elapsed(),
                    "NATS has been unreachable past the WAL relay's handoff_after: windows go to the outbox table (published by the table relay once NATS is back, in key order), so the slot does not hold the database's WAL"
                );
            }
        }
        past
    }

    /// Whether the outage is past its limit and still on: a window then
    /// goes to the table without being tried. A connection that is up again
    /// is tried, but only a PubAck ends the outage ([`Outage::over`]): a
    /// connection that keeps coming up and failing must not restart the
    /// clock each time.
    pub(super) fn handing_off(&self, js: &jetstream::Context) -> bool {
        !crate::relay::connected(js) && *self.told.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// JetStream acknowledged a publish: the next outage starts from
    /// nothing.
    pub(super) fn over(&self) {
        if self.since().take().is_some() {
            let mut told = self.told.lock().unwrap_or_else(|e| e.into_inner());
            if std::mem::take(&mut *told) {
                tracing::info!(
                    "NATS is reachable again: the WAL relay publishes its windows itself"
                );
            }
        }
    }
}
