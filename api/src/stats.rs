//! `/api/v1/stats` and `/api/v1/prune`.

use axum::Json;
use axum::extract::State;
use chrono::Utc;

use service::retention::PruneReport;
use service::stats::Stats;

use crate::AppState;
use crate::error::{ApiError, ErrorBody};

/// Counts by table and state, relay lag, dead letters by consumer, and
/// throughput over the last minutes.
#[utoipa::path(get, path = "/api/v1/stats", tag = "stats",
    responses((status = 200, body = Stats), (status = 401, body = ErrorBody)))]
pub async fn get_stats(State(state): State<AppState>) -> Result<Json<Stats>, ApiError> {
    Ok(Json(service::stats::stats(&state.db, Utc::now()).await?))
}

/// Runs retention pruning now and returns how many rows it removed.
#[utoipa::path(post, path = "/api/v1/prune", tag = "stats",
    responses((status = 200, body = PruneReport), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn run_prune(State(state): State<AppState>) -> Result<Json<PruneReport>, ApiError> {
    let config = state.config.prune.ok_or_else(|| {
        ApiError::Unavailable("no retention is configured for this API process".into())
    })?;
    let report = service::retention::prune(&state.db, &config, Utc::now()).await?;
    report.record_metrics();
    tracing::info!(?report, "pruned on request");
    Ok(Json(report))
}
