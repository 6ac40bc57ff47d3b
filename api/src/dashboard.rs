//! `GET /`: the dashboard, a single page compiled into the binary. It talks to
//! the same API with the same token, which the operator enters once per
//! browser session.

use axum::http::{HeaderName, HeaderValue, header};
use axum::response::Html;

const PAGE: &str = include_str!("dashboard.html");

/// What the page's answer says of itself: never inside another site's
/// frame (its buttons retry, replay and delete; a page that frames it could
/// trick a click, and without a token the API trusts the operator's own
/// browser), and never read as anything but HTML.
const HEADERS: [(HeaderName, HeaderValue); 3] = [
    (
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("frame-ancestors 'none'"),
    ),
    (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
    (
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    ),
];

/// The dashboard page (HTML; it calls the API with the operator's token).
#[utoipa::path(get, path = "/", tag = "health", responses((status = 200, description = "The dashboard", content_type = "text/html")))]
pub async fn page() -> ([(HeaderName, HeaderValue); 3], Html<&'static str>) {
    (HEADERS, Html(PAGE))
}
