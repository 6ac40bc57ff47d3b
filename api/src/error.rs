//! The one place API errors become HTTP responses.
//!
//! Every error is JSON `{"error": {"code", "message"}}`; database and broker
//! failures are logged with their cause and answered with a generic message,
//! so no SQL, stack trace or internal detail reaches the client.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// The error body.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Code and message of an error.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code (`bad_request`, `unauthorized`, `not_found`...).
    pub code: String,
    /// Human-readable explanation.
    pub message: String,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// A parameter or body was invalid; the message names it.
    #[error("{0}")]
    BadRequest(String),
    /// The request body is larger than the configured limit.
    #[error("request body is too large")]
    PayloadTooLarge,
    /// Missing or wrong bearer token.
    #[error("missing or invalid bearer token")]
    Unauthorized,
    /// Refused whatever the credentials: a tokenless API asked under a
    /// foreign `Host` or changed from a foreign origin.
    #[error("{0}")]
    Forbidden(String),
    /// No such resource or route.
    #[error("{0}")]
    NotFound(String),
    /// The resource is not in a state that allows the action.
    #[error("{0}")]
    Conflict(String),
    /// A dependency (database, NATS) is unavailable.
    #[error("{0}")]
    Unavailable(String),
    /// The database failed.
    #[error("database error")]
    Database(#[from] sea_orm::DbErr),
}

/// What a client is told when the database is down or changing primary: a
/// 503 it may retry, not a 500 that reads as a bug.
const DATABASE_UNAVAILABLE: &str =
    "the database is unavailable (down, or a failover is in progress); try again shortly";

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::PayloadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::Database(err) if service::classify::is_outage(err) => {
                (StatusCode::SERVICE_UNAVAILABLE, "database_unavailable")
            }
            Self::Database(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

/// A JSON error response with any status and code.
pub fn error_response(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            code: code.to_owned(),
            message: message.into(),
        },
    };
    (status, Json(body)).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        if let Self::Database(err) = &self {
            if status == StatusCode::SERVICE_UNAVAILABLE {
                tracing::warn!(error = %err, "admin API: database unavailable");
                return error_response(status, code, DATABASE_UNAVAILABLE);
            }
            tracing::error!(error = %err, "admin API database error");
        }
        error_response(status, code, self.to_string())
    }
}
