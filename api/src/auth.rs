//! Bearer-token authentication for `/api/v1`, and what stands in for it
//! without a token.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, Method, Uri, header};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

use crate::AppState;
use crate::error::ApiError;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Every call: reads and repairs (retry, release, replay, delete,
    /// prune).
    Write,
    /// Reads only (`GET`): for dashboards, scripts and people who look.
    Read,
}

/// A bearer token with the name the audit trail records for its calls.
#[derive(Debug, Clone)]
pub struct Token {
    /// Who holds it (`admin` for `SEAWALL_ADMIN_TOKEN`).
    pub name: String,
    /// What it may do.
    pub access: Access,
    /// The secret itself.
    pub secret: String,
}

impl Token {
    /// The single all-powerful token of `SEAWALL_ADMIN_TOKEN`, named `admin`.
    pub fn admin(secret: impl Into<String>) -> Self {
        Self {
            name: "admin".into(),
            access: Access::Write,
            secret: secret.into(),
        }
    }
}

/// Who made a request, as the audit trail names it: a token's name, or
/// the loopback caller of an API without tokens.
#[derive(Debug, Clone)]
pub struct Identity(pub String);

/// Lets a request through when its `Authorization: Bearer` token is one of
/// the configured ones, and a read-only token only for reads (403
/// otherwise). Every token is compared, each in constant time, so response
/// timing tells neither how much of a guess was right nor which token it
/// resembled. The request carries the token's [`Identity`] on. Without
/// configured tokens the API only listens on loopback (checked at start-up)
/// and needs none.
pub async fn require_token(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let identity = if state.config.tokens.is_empty() {
        Identity("loopback caller without a token".into())
    } else {
        let presented = request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let mut matched = None;
        for token in &state.config.tokens {
            if bool::from(presented.as_bytes().ct_eq(token.secret.as_bytes())) {
                matched = Some(token);
            }
        }
        let Some(token) = matched else {
            refused(request.uri().path());
            return Err(ApiError::Unauthorized);
        };
        if token.access == Access::Read && !request.method().is_safe() {
            return Err(ApiError::Forbidden(format!(
                "token {:?} is read-only; this call changes state",
                token.name
            )));
        }
        Identity(format!("token {}", token.name))
    };
    request.extensions_mut().insert(identity);
    Ok(next.run(request).await)
}

/// Requests refused for a missing or unknown token since the last line
/// logged about them, and when that line was.
struct Refusals {
    since_logged: u64,
    logged_at: Option<Instant>,
}

static REFUSALS: Mutex<Refusals> = Mutex::new(Refusals {
    since_logged: 0,
    logged_at: None,
});

/// At most one log line about refused tokens per this long: someone
/// guessing tokens must not also flood the log.
const REFUSALS_LOGGED_EVERY: Duration = Duration::from_secs(10);

/// Counts a request refused for its token (`seawall_api_auth_failures_total`)
/// and logs it, the first at once and then at most one line per
/// [`REFUSALS_LOGGED_EVERY`] saying how many were refused since: a guessing
/// client, or a dashboard left open with a rotated token, shows in the log
/// and on an alert without a line per request. The presented token is
/// never logged.
fn refused(path: &str) {
    metrics::counter!("seawall_api_auth_failures_total").increment(1);
    let Ok(mut refusals) = REFUSALS.lock() else {
        return;
    };
    refusals.since_logged += 1;
    if refusals
        .logged_at
        .is_some_and(|at| at.elapsed() < REFUSALS_LOGGED_EVERY)
    {
        return;
    }
    tracing::warn!(
        refused = refusals.since_logged,
        path,
        "API request(s) refused: missing or unknown bearer token (logged at most every {REFUSALS_LOGGED_EVERY:?})"
    );
    refusals.since_logged = 0;
    refusals.logged_at = Some(Instant::now());
}

/// Without a token the API listens on loopback only, but the operator's
/// browser is on loopback too, and any page it shows can reach it: a
/// cross-site form POST needs no preflight, and DNS rebinding lets a page
/// read answers under its own host name. So a tokenless API answers only
/// requests addressed to a loopback `Host`, and takes state changes only from
/// its own origin (`Origin` equal to the `Host`, `Sec-Fetch-Site` same-origin
/// or none). Clients that send neither header (curl, scripts) are unaffected.
pub async fn require_local(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if state.config.tokens.is_empty() {
        check_local(request.method(), request.uri(), request.headers())?;
    }
    Ok(next.run(request).await)
}

fn check_local(method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<(), ApiError> {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &axum::http::HeaderValue| v.to_str().ok())
    };
    // HTTP/2 names the host in the request's authority, HTTP/1.1 in `Host`;
    // a request naming none (HTTP/1.0) cannot be told to be for this
    // machine, so it is refused like a foreign host.
    let host = text(header::HOST).or_else(|| uri.authority().map(|a| a.as_str()));
    let Some(host) = host else {
        return Err(ApiError::Forbidden(
            "no Host header; without SEAWALL_ADMIN_TOKEN the API answers only requests addressed to a loopback host".into(),
        ));
    };
    if !is_loopback_host(host) {
        return Err(ApiError::Forbidden(format!(
            "host {host:?} is not a loopback name; without SEAWALL_ADMIN_TOKEN the API answers only loopback hosts"
        )));
    }
    if method.is_safe() {
        return Ok(());
    }
    let foreign_origin =
        text(header::ORIGIN).is_some_and(|origin| origin_authority(origin) != Some(host));
    let foreign_site = text(HeaderName::from_static("sec-fetch-site"))
        .is_some_and(|site| !matches!(site, "same-origin" | "none"));
    if foreign_origin || foreign_site {
        return Err(ApiError::Forbidden(
            "a state-changing request from another origin; without SEAWALL_ADMIN_TOKEN only the API's own pages may change state".into(),
        ));
    }
    Ok(())
}

/// `host:port` of an `Origin` (`scheme://host[:port]`); `None` for `null`.
fn origin_authority(origin: &str) -> Option<&str> {
    origin.split_once("://").map(|(_, rest)| rest)
}

/// A `Host` header naming this machine: `localhost` (or a name under it),
/// an IPv4 loopback address, or `[::1]`, each with an optional port.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split_once(']').map_or(rest, |(addr, _)| addr)
    } else {
        host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                name
            } else {
                host
            }
        })
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_recognised_and_others_are_not() {
        for ok in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:80",
            "127.1.2.3",
            "[::1]:8080",
            "app.localhost",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "[::2]:80",
            "10.0.0.1",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }
}
