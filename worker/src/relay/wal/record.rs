//! What a published window leaves in the database: the statements are
//! `service::wal::relay`'s; this converts the stream's positions for them.

use std::time::{Duration, Instant};

use pgwire_replication::Lsn;
use sea_orm::DbErr;

use entity::outbox_message;
use service::wal::WalEvent;
use service::wal::relay::{Holder, Partial, Position, Reached};

use super::{WalError, WalRelay};

/// How long a session goes on publishing before it checks again that no
/// other session took the slot over (a frozen relay, woken after a standby
/// took over, checks before its next round: the clock moved on).
pub(super) const FENCE_CHECK: Duration = Duration::from_millis(250);

/// A session's claim on the slot: the generation it took the slot with.
pub(super) struct Fence {
    generation: i64,
    checked: std::sync::Mutex<Instant>,
}

impl Fence {
    /// Whether the session still holds the slot, asking the database at
    /// most every [`FENCE_CHECK`]. An answer that took longer than that to
    /// come may be stale (the process was frozen while it waited, and a
    /// standby took over meanwhile): the question is asked again.
    ///
    /// A database that is merely slow answers late every time; its third
    /// late answer is taken, so a slow database slows the relay down
    /// without stopping it.
    pub(super) async fn check(&self, relay: &WalRelay) -> Result<(), WalError> {
        let mut late = 0;
        while !self.fresh(FENCE_CHECK) {
            let asked = Instant::now();
            let slot = &relay.config.slot;
            if !service::wal::relay::holds(&relay.db, slot, self.generation).await? {
                return Err(WalError::Fenced(slot.clone()));
            }
            if asked.elapsed() < FENCE_CHECK {
                *self.lock() = asked;
            } else {
                late += 1;
                if late == 3 {
                    *self.lock() = Instant::now();
                }
            }
        }
        Ok(())
    }

    /// Whether the last answer is younger than `age`: a round stops sending
    /// once it is not (a freeze in the middle of a round shows as a jump of
    /// the clock), and checks again before it goes on.
    pub(super) fn fresh(&self, age: Duration) -> bool {
        self.lock().elapsed() < age
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.checked.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl WalRelay {
    /// Takes the slot's relaying over for a session that has just taken the
    /// slot (see [`service::wal::relay::take_over`]).
    pub(super) async fn take_over(&self) -> Result<Fence, DbErr> {
        let (generation, loss) =
            service::wal::relay::take_over(&self.db, &self.config.slot).await?;
        if let Some(loss) = loss {
            super::slot::report_loss(&self.config.slot, loss);
        }
        Ok(Fence {
            generation,
            checked: std::sync::Mutex::new(Instant::now()),
        })
    }

    /// Records a published window in one transaction (see
    /// [`service::wal::relay::record_window`]); [`WalError::Fenced`] when
    /// another session took the slot over, and nothing is recorded.
    pub(super) async fn record(
        &self,
        fence: &Fence,
        published: usize,
        rows: Vec<(outbox_message::ActiveModel, WalEvent)>,
        undecodable: &[(Vec<u8>, String)],
        window: (Option<Lsn>, Option<Partial>),
    ) -> Result<(), WalError> {
        let holder = Holder {
            slot: &self.config.slot,
            generation: fence.generation,
        };
        let (end, partial) = window;
        let reached = Reached {
            end: end.map(lsn_value),
            partial,
        };
        let recorded = service::wal::relay::record_window(
            &self.db,
            holder,
            published,
            rows,
            undecodable,
            reached,
        )
        .await?;
        if recorded {
            Ok(())
        } else {
            Err(WalError::Fenced(self.config.slot.clone()))
        }
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
