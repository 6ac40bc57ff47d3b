//! `GET /`: the dashboard, a single page compiled into the binary. It talks to
//! the same API with the same token, which the operator enters once per
//! browser session.

use axum::response::Html;

const PAGE: &str = include_str!("dashboard.html");

/// The dashboard page (HTML; it calls the API with the operator's token).
#[utoipa::path(get, path = "/", tag = "health", responses((status = 200, description = "The dashboard", content_type = "text/html")))]
pub async fn page() -> Html<&'static str> {
    Html(PAGE)
}
