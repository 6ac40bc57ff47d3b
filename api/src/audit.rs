//! The audit trail: every state-changing admin call (a retry, a release, a
//! replay, a delete, a prune) leaves one log line on the `seawall_audit`
//! target, which the default log filter keeps (`SEAWALL_LOG` unset), with
//! what was done, to which ids (the path) and filter (the query and the JSON
//! body, quoted and cut to 1 KiB), how many rows it changed, the answer, the
//! client's address and who it was (the admin token, or a loopback caller of
//! a tokenless API). A person reading the logs after an incident can so tell
//! who replayed what.
//!
//! A call that never answers (the request timed out, the client went away)
//! may still have changed rows before it was dropped: it is logged all the
//! same, as `outcome unknown`. Requests refused by the token check are not
//! admin actions and are not logged here.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

use crate::AppState;
use crate::error::ApiError;

/// The log target of the trail.
pub const TARGET: &str = "seawall_audit";

/// The most of a filter (query or body) a line carries.
const FILTER_MAX: usize = 1024;

/// How many rows a bulk action changed, set by its handler as a response
/// extension; a single-row action that succeeded changed one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Changed(pub u64);

/// One admin action on its way: logged when it is answered, or when it is
/// dropped unanswered.
struct Action {
    action: String,
    filter: String,
    client: String,
    identity: String,
    answered: bool,
}

impl Action {
    fn answered(mut self, status: u16, rows: u64) {
        self.answered = true;
        tracing::info!(
            target: TARGET,
            action = %self.action,
            filter = ?self.filter,
            rows,
            status,
            client = %self.client,
            identity = self.identity,
            "admin action"
        );
    }
}

impl Drop for Action {
    fn drop(&mut self) {
        if !self.answered {
            tracing::warn!(
                target: TARGET,
                action = %self.action,
                filter = ?self.filter,
                client = %self.client,
                identity = self.identity,
                "admin action ended without an answer (timed out or the client left); outcome unknown, rows may have changed"
            );
        }
    }
}

/// Logs each state-changing request once it is answered (or dropped).
///
/// # Errors
/// [`ApiError::PayloadTooLarge`] for a body over the API's limit, as the
/// handler's own extractor would.
pub async fn record(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) {
        return Ok(next.run(request).await);
    }
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, state.config.body_limit)
        .await
        .map_err(|_| ApiError::PayloadTooLarge)?;
    let mut filter = parts.uri.query().unwrap_or("").to_owned();
    if !body.is_empty() {
        if !filter.is_empty() {
            filter.push(' ');
        }
        filter.push_str(&String::from_utf8_lossy(&body));
    }
    if filter.len() > FILTER_MAX {
        let cut = (0..=FILTER_MAX)
            .rev()
            .find(|i| filter.is_char_boundary(*i))
            .unwrap_or(0);
        filter.truncate(cut);
        filter.push_str("...");
    }
    let action = Action {
        action: format!("{} {}", parts.method, parts.uri.path()),
        filter,
        client: parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or_else(|| "unknown".to_owned(), |c| c.0.to_string()),
        identity: parts
            .extensions
            .get::<crate::auth::Identity>()
            .map_or_else(|| "unknown".to_owned(), |i| i.0.clone()),
        answered: false,
    };
    let response = next.run(Request::from_parts(parts, Body::from(body))).await;
    let status = response.status();
    let rows = match response.extensions().get::<Changed>() {
        Some(Changed(n)) => *n,
        None if status.is_success() => 1,
        None => 0,
    };
    action.answered(status.as_u16(), rows);
    Ok(response)
}
