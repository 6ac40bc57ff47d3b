//! The states an outbox row and an inbox marker can be in, each with the one
//! condition that selects it. The relay, the sweeper, the stats, the admin
//! API and the soak checker all ask "which rows are pending?" or "which claims
//! have expired?"; they ask it here, so they cannot disagree (an expired lease
//! is `lease_until <= now` everywhere). The state machines are drawn in
//! `docs/architecture.md`.

use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, Condition};

use entity::{inbox_message, outbox_message};

/// Where an outbox row is on its way to the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutboxState {
    /// Waiting for the relay (possibly backing off after failures).
    Pending,
    /// Acknowledged by JetStream.
    Published,
    /// The relay gave up after its attempt limit; waits for a person.
    Dead,
}

impl OutboxState {
    /// The state of `row`.
    pub fn of(row: &outbox_message::Summary) -> Self {
        if row.published_at.is_some() {
            Self::Published
        } else if row.dead_at.is_some() {
            Self::Dead
        } else {
            Self::Pending
        }
    }

    /// The SQL condition that selects rows in this state.
    pub fn condition(self) -> Condition {
        use outbox_message::Column;
        match self {
            Self::Pending => Self::unpublished().add(Column::DeadAt.is_null()),
            Self::Published => Condition::all().add(Column::PublishedAt.is_not_null()),
            Self::Dead => Self::unpublished().add(Column::DeadAt.is_not_null()),
        }
    }

    /// Rows not yet published: pending or dead. A retry may only touch these.
    pub fn unpublished() -> Condition {
        Condition::all().add(outbox_message::Column::PublishedAt.is_null())
    }
}

/// Where an inbox marker is. A marker written by [`crate::Inbox::process`]
/// is born processed; one written by a two-phase claim goes through the
/// others first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimState {
    /// The message was applied.
    Processed,
    /// An open claim with a live lease: its holder may still be working.
    Claimed,
    /// An open claim whose lease ran out or was released: the next delivery,
    /// a replay or the sweeper takes it.
    Expired,
    /// A claim a person must judge (the effect may or may not have happened).
    Quarantined,
}

impl ClaimState {
    /// The state of `row` at `now`.
    pub fn of(row: &inbox_message::Summary, now: DateTime<Utc>) -> Self {
        if row.processed_at.is_some() {
            Self::Processed
        } else if row.quarantined_at.is_some() {
            Self::Quarantined
        } else if lease_expired(row.lease_until, now) {
            Self::Expired
        } else {
            Self::Claimed
        }
    }

    /// The SQL condition that selects markers in this state at `now`.
    pub fn condition(self, now: DateTime<Utc>) -> Condition {
        use inbox_message::Column;
        match self {
            Self::Processed => Condition::all().add(Column::ProcessedAt.is_not_null()),
            Self::Quarantined => Condition::all()
                .add(Column::ProcessedAt.is_null())
                .add(Column::QuarantinedAt.is_not_null()),
            Self::Claimed => Self::open().add(Column::LeaseUntil.gt(now)),
            Self::Expired => Self::open().add(
                Condition::any()
                    .add(Column::LeaseUntil.is_null())
                    .add(Column::LeaseUntil.lte(now)),
            ),
        }
    }

    /// Claims neither processed nor quarantined: live or expired. Only these
    /// may be taken over, released or quarantined.
    pub fn open() -> Condition {
        use inbox_message::Column;
        Condition::all()
            .add(Column::ProcessedAt.is_null())
            .add(Column::QuarantinedAt.is_null())
    }
}

/// Whether a lease is over at `now` (none at all counts as over). The same
/// instant as [`ClaimState::Expired`]'s condition: at `lease_until` itself
/// the lease is over.
pub fn lease_expired(lease_until: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
    lease_until.is_none_or(|until| until <= now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_over_at_its_end_and_a_released_claim_is_free() {
        let now = Utc::now();
        assert!(lease_expired(None, now));
        assert!(lease_expired(Some(now), now));
        assert!(lease_expired(
            Some(now - chrono::Duration::milliseconds(1)),
            now
        ));
        assert!(!lease_expired(
            Some(now + chrono::Duration::milliseconds(1)),
            now
        ));
    }
}
