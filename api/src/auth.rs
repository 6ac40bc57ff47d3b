//! Bearer-token authentication for `/api/v1`, and what stands in for it
//! without a token.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, Method, Uri, header};
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq;

use crate::AppState;
use crate::error::ApiError;

/// Lets a request through when its `Authorization: Bearer` token equals the
/// configured one, compared in constant time so response timing does not leak
/// how much of a guess was right. Without a configured token the API only
/// listens on loopback (checked at start-up) and needs none.
pub async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if let Some(expected) = &state.config.token {
        let presented = request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let equal: bool = presented.as_bytes().ct_eq(expected.as_bytes()).into();
        if !equal {
            return Err(ApiError::Unauthorized);
        }
    }
    Ok(next.run(request).await)
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
    if state.config.token.is_none() {
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
