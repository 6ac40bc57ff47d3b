//! The audit trail: every state-changing admin call (a retry, a release, a
//! replay, a delete, a prune) leaves one log line on the `seawall_audit`
//! target, which the default log filter keeps (`SEAWALL_LOG` unset), with
//! what was done, to which ids or filter, how many rows it changed, the
//! answer, the client's address and who it was (the admin token, or a
//! loopback caller of a tokenless API). A person reading the logs after an
//! incident can so tell who replayed what.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

use crate::AppState;

/// The log target of the trail.
pub const TARGET: &str = "seawall_audit";

/// How many rows a bulk action changed, set by its handler as a response
/// extension; a single-row action that succeeded changed one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Changed(pub u64);

/// Logs each state-changing request once it is answered.
pub async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) {
        return next.run(request).await;
    }
    let action = format!("{} {}", request.method(), request.uri().path());
    let filter = request.uri().query().unwrap_or("").to_owned();
    let client = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_owned(), |c| c.0.to_string());
    let identity = if state.config.token.is_some() {
        "admin token"
    } else {
        "loopback caller without a token"
    };
    let response = next.run(request).await;
    let status = response.status();
    let rows = match response.extensions().get::<Changed>() {
        Some(Changed(n)) => *n,
        None if status.is_success() => 1,
        None => 0,
    };
    tracing::info!(
        target: TARGET,
        %action,
        %filter,
        rows,
        status = status.as_u16(),
        %client,
        identity,
        "admin action"
    );
    response
}
