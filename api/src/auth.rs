//! Bearer-token authentication for `/api/v1`.

use axum::extract::{Request, State};
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
