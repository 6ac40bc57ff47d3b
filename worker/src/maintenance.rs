//! Periodic upkeep: the claim sweeper and the retention pruner.
//!
//! Both are safe to run in several processes at once (their statements are
//! conditional), so every `consume` process runs both and every `relay`
//! process the pruner (of the outbox and the rollup); no leader election.

use std::time::Duration;

use chrono::Utc;
use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;

use service::retention::{PruneConfig, prune};
use service::sweep::{SweepPolicy, sweep_claims};

/// Sweeps abandoned claims every `interval` until `cancel` fires.
pub async fn run_sweeper(
    db: DatabaseConnection,
    policy: SweepPolicy,
    interval: Duration,
    cancel: CancellationToken,
) {
    loop {
        match sweep_claims(&db, &policy, Utc::now()).await {
            Ok(report) if report.released + report.quarantined > 0 => {
                tracing::info!(?report, "claim sweep")
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "claim sweep failed; will retry"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Prunes past-retention rows every `interval` until `cancel` fires.
pub async fn run_pruner(
    db: DatabaseConnection,
    config: PruneConfig,
    interval: Duration,
    cancel: CancellationToken,
) {
    loop {
        match prune(&db, &config, Utc::now()).await {
            Ok(report) => {
                report.record_metrics();
                if report.inbox + report.outbox > 0 {
                    tracing::info!(?report, "pruned");
                }
            }
            Err(err) => tracing::warn!(error = %err, "prune failed; will retry"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
