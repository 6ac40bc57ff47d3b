//! `GET /`: the dashboard, a single page compiled into the binary. It talks to
//! the same API with the same token, which the operator enters once per
//! browser session.

use axum::response::Html;

const PAGE: &str = include_str!("dashboard.html");

/// The page.
pub async fn page() -> Html<&'static str> {
    Html(PAGE)
}
