//! `/healthz`, `/readyz` and `/metrics` for a process that runs without the
//! admin API (`seawall relay`, `seawall consume`), on its own listener
//! (`SEAWALL_METRICS_ADDR`).
//!
//! The split deployment runs relays and consumers as separate processes, and
//! what they record (publishes, deliveries, dead letters, executor retries)
//! lives in their own recorders: without a listener of their own, nothing
//! could scrape it and no probe could tell a stuck process from a busy one.
//! Only the process's own metrics are rendered here; the table gauges (rows
//! pending, dead, open claims) are the admin API's, so they are queried once
//! per deployment and not once per process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;
use tower_http::timeout::TimeoutLayer;

use crate::ServeError;

/// A role's own readiness: `Some(problem)` while it cannot do its work (a
/// consumer paused for a database outage), `None` otherwise.
pub type RoleCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// What the probes read.
#[derive(Clone)]
pub struct Probes {
    /// The database the roles write to.
    pub db: DatabaseConnection,
    /// The broker connection, when the roles use one.
    pub nats: Option<async_nats::Client>,
    /// The process's recorder.
    pub metrics: Option<PrometheusHandle>,
    /// The roles' own checks, each asked at every `/readyz`.
    pub checks: Vec<RoleCheck>,
}

/// The probe routes: no token (they reveal no rows), no admin actions.
pub fn router(probes: Probes) -> Router {
    Router::new()
        .route("/healthz", get(crate::health::healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render))
        .fallback(crate::not_found)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            Duration::from_secs(10),
        ))
        .with_state(probes)
}

/// Ready when the database answers with its migrations applied, the broker
/// is connected and every role's check passes; 503 naming each problem
/// otherwise.
async fn readyz(State(probes): State<Probes>) -> Response {
    let mut problems = crate::health::problems(&probes.db, probes.nats.as_ref()).await;
    problems.extend(probes.checks.iter().filter_map(|check| check()));
    crate::health::answer(problems)
}

/// The process's recorder in Prometheus text format.
async fn render(State(probes): State<Probes>) -> Response {
    match &probes.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => crate::error::error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            "metrics are not enabled in this process",
        ),
    }
}

/// Binds the probes' listener, so a taken port stops start-up.
///
/// # Errors
/// [`ServeError::Bind`].
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, ServeError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Serves the probes on `listener` until `cancel` fires.
///
/// # Errors
/// [`ServeError::Bind`] when the listener fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    probes: Probes,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    let addr = crate::local_addr(&listener)?;
    tracing::info!(%addr, "probes and metrics listening (/healthz, /readyz, /metrics)");
    crate::serve_router(listener, addr, router(probes), cancel).await
}
