//! The claim sweeper's step: find claims abandoned by a crash and either
//! release them for a retry or, after too many attempts, quarantine them.
//!
//! Every change is a conditional update on the state that was read, so
//! several sweepers (one per `consume` process) can run at once: for each
//! claim, one of them acts and the others change nothing.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, Condition, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use serde::Serialize;

use entity::inbox_message::{self, Column};

use crate::claim::quarantine;
use crate::state::ClaimState;

/// Attempt limits per consumer, with a default.
#[derive(Debug, Clone)]
pub struct SweepPolicy {
    /// Limit for consumers not listed.
    pub default_max_attempts: i32,
    /// Per-consumer limits.
    pub max_attempts: HashMap<String, i32>,
    /// Claims examined per step.
    pub batch_size: u64,
}

impl Default for SweepPolicy {
    fn default() -> Self {
        Self {
            default_max_attempts: 5,
            max_attempts: HashMap::new(),
            batch_size: 500,
        }
    }
}

impl SweepPolicy {
    fn limit_for(&self, consumer: &str) -> i32 {
        self.max_attempts
            .get(consumer)
            .copied()
            .unwrap_or(self.default_max_attempts)
    }

    fn lowest_limit(&self) -> i32 {
        self.max_attempts
            .values()
            .copied()
            .chain([self.default_max_attempts])
            .min()
            .unwrap_or(1)
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Expired claims released so a redelivery or replay can take them.
    pub released: u64,
    /// Claims quarantined with a dead letter.
    pub quarantined: u64,
}

/// One sweep at time `now`.
///
/// # Errors
/// Database errors.
pub async fn sweep_claims(
    db: &DatabaseConnection,
    policy: &SweepPolicy,
    now: DateTime<Utc>,
) -> Result<SweepReport, DbErr> {
    // Expired claims with a lease that ran out, or released ones (no lease)
    // that have used up their attempts: a released claim under its limit
    // waits for its next delivery or replay instead.
    let abandoned = inbox_message::Entity::find()
        .filter(ClaimState::Expired.condition(now))
        .filter(
            Condition::any()
                .add(Column::LeaseUntil.is_not_null())
                .add(Column::Attempts.gte(policy.lowest_limit())),
        )
        .order_by_asc(Column::Id)
        .limit(policy.batch_size)
        .all(db)
        .await?;
    let mut report = SweepReport::default();
    for row in abandoned {
        if row.attempts >= policy.limit_for(&row.consumer) {
            if quarantine(db, &row).await? {
                report.quarantined += 1;
            }
        } else if row.lease_until.is_some() {
            let res = inbox_message::Entity::update_many()
                .col_expr(
                    Column::LeaseUntil,
                    Expr::value(Option::<DateTime<Utc>>::None),
                )
                .col_expr(Column::ClaimedBy, Expr::value(Option::<String>::None))
                .filter(Column::Id.eq(row.id))
                .filter(Column::Attempts.eq(row.attempts))
                .filter(ClaimState::Expired.condition(now))
                .filter(Column::LeaseUntil.is_not_null())
                .exec(db)
                .await?;
            if res.rows_affected == 1 {
                tracing::info!(message_id = %row.message_id, consumer = %row.consumer, attempts = row.attempts, "released an abandoned claim for retry");
                report.released += 1;
            }
        }
    }
    metrics::counter!("seawall_claim_sweeps_total").increment(1);
    metrics::counter!("seawall_claims_released_total").increment(report.released);
    metrics::counter!("seawall_claims_quarantined_total").increment(report.quarantined);
    Ok(report)
}
