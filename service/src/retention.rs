//! Retention: how long inbox markers and published outbox rows are kept, and
//! pruning them in bounded batches.
//!
//! An inbox marker may only go once the broker can no longer redeliver the
//! original message (docs/architecture.md, rule 9): a redelivery after the marker was pruned
//! would be applied a second time. That horizon is the ack wait times the
//! delivery limit plus the stream's max age; a margin on top covers operators
//! replaying dead letters later.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{
    ColumnTrait, Condition, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect,
};
use serde::Serialize;

use entity::{inbox_message, outbox_message};

/// The broker settings that bound redelivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerSettings {
    /// JetStream consumer ack wait.
    pub ack_wait: Duration,
    /// JetStream consumer max deliveries.
    pub max_deliver: u32,
    /// The stream's max age (how long the original stays replayable).
    pub stream_max_age: Duration,
}

impl BrokerSettings {
    /// How long after first delivery the broker may still deliver a message:
    /// ack wait x max deliveries + the stream's max age. A max age of zero
    /// is JetStream's "keep forever", so the horizon is unbounded
    /// ([`Duration::MAX`]).
    pub fn redelivery_horizon(&self) -> Duration {
        if self.stream_max_age.is_zero() {
            return Duration::MAX;
        }
        self.ack_wait
            .saturating_mul(self.max_deliver)
            .saturating_add(self.stream_max_age)
    }

    /// The inbox retention derived from the broker: the horizon plus `margin`.
    pub fn inbox_retention(&self, margin: Duration) -> Duration {
        self.redelivery_horizon().saturating_add(margin)
    }
}

/// A retention the broker could outlive.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "inbox retention {retention:?} is shorter than the broker can still redeliver a message: ack_wait_ms ({ack_wait:?}) x max_deliver ({max_deliver}) + stream_max_age_ms ({max_age:?}) = {horizon:?}; raise inbox_retention_ms or set allow_short_retention = true"
)]
pub struct RetentionTooShort {
    /// The configured retention.
    pub retention: Duration,
    /// Ack wait.
    pub ack_wait: Duration,
    /// Max deliveries.
    pub max_deliver: u32,
    /// Stream max age.
    pub max_age: Duration,
    /// The horizon it falls short of.
    pub horizon: Duration,
}

/// Refuses an inbox retention shorter than the redelivery horizon, unless
/// `allow_short` overrides it.
///
/// # Errors
/// [`RetentionTooShort`] naming the settings involved.
pub fn check_inbox_retention(
    retention: Duration,
    broker: &BrokerSettings,
    allow_short: bool,
) -> Result<(), RetentionTooShort> {
    let horizon = broker.redelivery_horizon();
    if retention < horizon && !allow_short {
        return Err(RetentionTooShort {
            retention,
            ack_wait: broker.ack_wait,
            max_deliver: broker.max_deliver,
            max_age: broker.stream_max_age,
            horizon,
        });
    }
    Ok(())
}

/// What to prune.
#[derive(Debug, Clone, Copy)]
pub struct PruneConfig {
    /// Processed inbox markers older than this go; `None` leaves markers
    /// alone (a relay-only process prunes the outbox, while how long
    /// markers must outlive redeliveries is the consumers' to judge).
    pub inbox: Option<Duration>,
    /// Published outbox rows older than this go.
    pub outbox: Duration,
    /// Rows per delete statement (keeps locks short).
    pub batch_size: u64,
}

/// What a prune removed (or, dry, would remove).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct PruneReport {
    /// Inbox markers.
    pub inbox: u64,
    /// Published outbox rows.
    pub outbox: u64,
}

impl PruneReport {
    /// Adds the deletions to `seawall_pruned_rows_total{table}`.
    pub fn record_metrics(&self) {
        metrics::counter!("seawall_pruned_rows_total", "table" => "inbox_message")
            .increment(self.inbox);
        metrics::counter!("seawall_pruned_rows_total", "table" => "outbox_message")
            .increment(self.outbox);
    }
}

fn cutoff(now: DateTime<Utc>, age: Duration) -> DateTime<Utc> {
    now - chrono::Duration::from_std(age).unwrap_or(chrono::Duration::MAX)
}

/// Deletes processed inbox markers and published outbox rows past their
/// retention, `batch_size` rows per statement, and per-minute throughput
/// counts older than [`crate::rollup::KEEP`]. Open claims, quarantined
/// claims and dead or pending outbox rows are never touched. Safe with
/// several pruners: each batch deletes by id and counts what it removed.
///
/// # Errors
/// Database errors (rows deleted by earlier batches stay deleted).
pub async fn prune(
    db: &DatabaseConnection,
    config: &PruneConfig,
    now: DateTime<Utc>,
) -> Result<PruneReport, DbErr> {
    let batch = config.batch_size.max(1);
    crate::rollup::prune(db, now).await?;
    let inbox = match config.inbox {
        Some(age) => {
            delete_in_batches::<inbox_message::Entity>(
                db,
                inbox_message::Column::Id,
                inbox_expired(cutoff(now, age)),
                batch,
            )
            .await?
        }
        None => 0,
    };
    Ok(PruneReport {
        inbox,
        outbox: delete_in_batches::<outbox_message::Entity>(
            db,
            outbox_message::Column::Id,
            outbox_expired(cutoff(now, config.outbox)),
            batch,
        )
        .await?,
    })
}

/// Processed inbox markers older than `cutoff` (quarantined ones never go).
fn inbox_expired(cutoff: DateTime<Utc>) -> Condition {
    Condition::all()
        .add(inbox_message::Column::ProcessedAt.lt(cutoff))
        .add(inbox_message::Column::QuarantinedAt.is_null())
}

/// Outbox rows published before `cutoff` (pending and dead ones never go).
fn outbox_expired(cutoff: DateTime<Utc>) -> Condition {
    Condition::all().add(outbox_message::Column::PublishedAt.lt(cutoff))
}

/// Deletes the rows matching `expired`, `batch` ids per statement, and
/// returns how many went. Each delete re-checks `expired`, so a concurrent
/// pruner deleting the same ids only makes this one count fewer.
async fn delete_in_batches<E>(
    db: &DatabaseConnection,
    id: E::Column,
    expired: Condition,
    batch: u64,
) -> Result<u64, DbErr>
where
    E: EntityTrait,
{
    let mut deleted = 0;
    loop {
        let ids: Vec<i64> = E::find()
            .select_only()
            .column(id)
            .filter(expired.clone())
            .order_by_asc(id)
            .limit(batch)
            .into_tuple()
            .all(db)
            .await?;
        let full = ids.len() as u64 == batch;
        if !ids.is_empty() {
            deleted += E::delete_many()
                .filter(id.is_in(ids))
                .filter(expired.clone())
                .exec(db)
                .await?
                .rows_affected;
        }
        if !full {
            return Ok(deleted);
        }
    }
}

/// What [`prune`] would delete at `now`, without deleting.
///
/// # Errors
/// Database errors.
pub async fn prune_dry_run(
    db: &DatabaseConnection,
    config: &PruneConfig,
    now: DateTime<Utc>,
) -> Result<PruneReport, DbErr> {
    let inbox = match config.inbox {
        Some(age) => {
            inbox_message::Entity::find()
                .filter(inbox_expired(cutoff(now, age)))
                .count(db)
                .await?
        }
        None => 0,
    };
    Ok(PruneReport {
        inbox,
        outbox: outbox_message::Entity::find()
            .filter(outbox_expired(cutoff(now, config.outbox)))
            .count(db)
            .await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BROKER: BrokerSettings = BrokerSettings {
        ack_wait: Duration::from_secs(30),
        max_deliver: 5,
        stream_max_age: Duration::from_secs(3600),
    };

    #[test]
    fn the_horizon_is_ack_wait_times_deliveries_plus_max_age() {
        assert_eq!(BROKER.redelivery_horizon(), Duration::from_secs(150 + 3600));
        assert_eq!(
            BROKER.inbox_retention(Duration::from_secs(50)),
            Duration::from_secs(3800)
        );
    }

    #[test]
    fn a_retention_shorter_than_the_horizon_is_refused_unless_overridden() {
        let short = Duration::from_secs(100);
        let err = check_inbox_retention(short, &BROKER, false).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("ack_wait_ms")
                && text.contains("max_deliver")
                && text.contains("stream_max_age_ms"),
            "{text}"
        );
        assert!(check_inbox_retention(short, &BROKER, true).is_ok());
        assert!(check_inbox_retention(BROKER.redelivery_horizon(), &BROKER, false).is_ok());
    }
}
