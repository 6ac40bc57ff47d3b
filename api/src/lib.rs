//! seawall's admin HTTP API: see what is stuck, and fix it without SQL.
//!
//! `GET /healthz`, `/readyz`, `/metrics`, the dashboard at `/`, and under
//! `/api/v1` (bearer token) stats, outbox, inbox and dead letters with their
//! repair actions, prune, and the OpenAPI document generated from the same
//! handler annotations that build the router, so the two cannot drift.
//!
//! # Layout
//! - [`router`] and [`serve`]: assembly, limits, shutdown.
//! - `outbox`, `inbox`, `dead_letters`, `stats`, `health`: the handlers.
//! - [`metrics`]: Prometheus recorder and `/metrics`.
//! - `error`, `extract`, `auth`, `page`: JSON errors, extractors that produce
//!   them, the token check, pagination.

pub mod audit;
pub mod auth;
mod dashboard;
mod dead_letters;
mod error;
mod extract;
mod health;
mod inbox;
mod journey;
pub mod metrics;
mod outbox;
mod page;
pub mod probes;
mod stats;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use metrics_exporter_prometheus::PrometheusHandle;
use sea_orm::DatabaseConnection;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use service::retention::PruneConfig;

pub use error::{ApiError, ErrorBody};

/// Settings of the API.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Bearer tokens for `/api/v1`, each named for the audit trail and
    /// read-only or not; without any the API only binds loopback.
    pub tokens: Vec<auth::Token>,
    /// Retention used by `POST /api/v1/prune`.
    pub prune: Option<PruneConfig>,
    /// Longest a request may take.
    pub request_timeout: Duration,
    /// Largest request body accepted.
    pub body_limit: usize,
    /// Each consumer's replay subject
    /// ([`service::dead_letter::replay_subject`]): a dead letter is replayed
    /// to its own consumer only.
    pub replay_subjects: std::collections::HashMap<String, String>,
    /// The WAL relay's slot when the outbox is in WAL mode: its backlog is
    /// part of the stats and the metrics.
    pub wal_slot: Option<String>,
    /// The domain's stream: each consumer's JetStream backlog (pending and
    /// unacknowledged deliveries) is read from it for the stats and metrics.
    pub stream: Option<String>,
    /// How long one reading of the stats is shared by every caller
    /// ([`stats::Cache`]); zero reads afresh at every call.
    pub stats_max_age: Duration,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            prune: None,
            request_timeout: Duration::from_secs(10),
            body_limit: 64 * 1024,
            replay_subjects: std::collections::HashMap::new(),
            wal_slot: None,
            stream: None,
            stats_max_age: Duration::from_secs(5),
        }
    }
}

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    /// The database: every write, and every read when `reads` is unset.
    pub db: DatabaseConnection,
    /// A read replica (`admin_database_url`) for lists, details, journeys
    /// and stats, so operators can look while the primary is loaded or
    /// failing over; writes never go there.
    pub reads: Option<DatabaseConnection>,
    /// NATS, for readiness and replays.
    pub nats: Option<async_nats::Client>,
    /// JetStream on that connection.
    pub jetstream: Option<async_nats::jetstream::Context>,
    /// Woken when an operator makes outbox rows publishable again.
    pub relay_wake: Option<Arc<Notify>>,
    /// The Prometheus handle, when this process exports metrics.
    pub metrics: Option<PrometheusHandle>,
    /// Settings.
    pub config: Arc<ApiConfig>,
    /// The last reading of the stats, shared by concurrent callers.
    pub stats: Arc<stats::Cache>,
    /// The other roles' readiness checks when they share this process
    /// (`seawall run`), asked at every `/readyz`.
    pub checks: Vec<probes::RoleCheck>,
}

impl AppState {
    /// Where read-only queries go: the replica when one is configured.
    pub fn reads(&self) -> &DatabaseConnection {
        self.reads.as_ref().unwrap_or(&self.db)
    }
}

/// Start-up problems.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// No token and a non-loopback address.
    #[error(
        "refusing to serve the admin API on {0} without SEAWALL_ADMIN_TOKEN: set a token or listen on a loopback address"
    )]
    NoTokenOffLoopback(SocketAddr),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Refuses to expose an unauthenticated API beyond this machine.
///
/// # Errors
/// [`ServeError::NoTokenOffLoopback`].
pub fn check_exposure(addr: SocketAddr, has_tokens: bool) -> Result<(), ServeError> {
    if !has_tokens && !addr.ip().is_loopback() {
        return Err(ServeError::NoTokenOffLoopback(addr));
    }
    Ok(())
}

struct SecurityAddon;

impl Modify for SecurityAddon {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "seawall admin API", description = "See what is stuck in the inbox and outbox, and fix it."),
    modifiers(&SecurityAddon),
    security(("bearer" = [])),
    components(schemas(ErrorBody))
)]
struct ApiDoc;

/// The authenticated routes, each registered together with its OpenAPI entry.
fn protected() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(stats::get_stats))
        .routes(routes!(stats::run_prune))
        .routes(routes!(outbox::list_outbox))
        .routes(routes!(outbox::get_outbox))
        .routes(routes!(outbox::retry_outbox))
        .routes(routes!(outbox::retry_dead))
        .routes(routes!(inbox::list_inbox))
        .routes(routes!(inbox::release_claim))
        .routes(routes!(dead_letters::list_dead_letters))
        .routes(routes!(
            dead_letters::get_dead_letter,
            dead_letters::delete_dead_letter
        ))
        .routes(routes!(dead_letters::replay_dead_letter))
        .routes(routes!(journey::get_message))
        .routes(routes!(journey::get_correlation))
        .routes(routes!(openapi_json))
}

/// The routes without a token, documented too.
fn public() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(metrics::render))
        .routes(routes!(dashboard::page))
}

/// The OpenAPI document: every route the router serves, generated from the
/// handlers' annotations.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut doc) = protected().split_for_parts();
    let (_, mut public_doc) = public().split_for_parts();
    for item in public_doc.paths.paths.values_mut() {
        // Health, metrics and the page need no token.
        for op in [&mut item.get, &mut item.post].into_iter().flatten() {
            op.security = Some(vec![
                utoipa::openapi::security::SecurityRequirement::default(),
            ]);
        }
    }
    doc.merge(public_doc);
    doc
}

/// The OpenAPI 3 document of this API.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "OpenAPI document", content_type = "application/json"), (status = 401, body = ErrorBody)))]
async fn openapi_json() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(openapi())
}

async fn not_found() -> axum::response::Response {
    error::error_response(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed() -> axum::response::Response {
    error::error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not accept that method",
    )
}

/// The whole router with its limits: body size, request timeout, JSON 404/405.
pub fn router(state: AppState) -> Router {
    let (protected, _) = protected()
        .layer(from_fn_with_state(state.clone(), audit::record))
        .layer(from_fn_with_state(state.clone(), auth::require_token))
        .split_for_parts();
    let (public, _) = public().split_for_parts();
    Router::new()
        .merge(protected)
        .merge(public)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(from_fn_with_state(state.clone(), auth::require_local))
        .layer(DefaultBodyLimit::max(state.config.body_limit))
        // A span per request (method, path, status, latency), so an admin
        // action (a retry, a release, a replay) is traceable in the logs.
        .layer(TraceLayer::new_for_http())
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            state.config.request_timeout,
        ))
        .with_state(state)
}

/// Serves until `cancel` fires, then finishes requests in flight.
///
/// # Errors
/// [`ServeError`] when the address is refused or cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    state: AppState,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    check_exposure(addr, !state.config.tokens.is_empty())?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    serve_listener(listener, state, cancel).await
}

/// Serves on an already bound listener (tests bind port 0 and read it back).
///
/// # Errors
/// [`ServeError::Bind`] when the listener fails.
pub async fn serve_listener(
    listener: tokio::net::TcpListener,
    state: AppState,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    let addr = local_addr(&listener)?;
    check_exposure(addr, !state.config.tokens.is_empty())?;
    tracing::info!(%addr, "admin API listening");
    serve_router(listener, addr, router(state), cancel).await
}

/// The address `listener` is bound to.
fn local_addr(listener: &tokio::net::TcpListener) -> Result<SocketAddr, ServeError> {
    listener.local_addr().map_err(|source| ServeError::Bind {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })
}

/// Serves `app` on `listener` (bound to `addr`) until `cancel` fires, each
/// request knowing its client's address (the audit trail names it).
async fn serve_router(
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    app: Router,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move { cancel.cancelled().await })
    .await
    .map_err(|source| ServeError::Bind { addr, source })
}
