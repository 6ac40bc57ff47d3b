//! Query parameters shared by the list endpoints: keyset pagination and
//! bounded page sizes.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::ApiError;

/// Largest page a client may ask for.
pub const MAX_LIMIT: u64 = 500;
/// Page size when none is given.
pub const DEFAULT_LIMIT: u64 = 50;

/// Validates `limit`: 1 to [`MAX_LIMIT`].
///
/// # Errors
/// [`ApiError::BadRequest`] naming the parameter.
pub fn limit(requested: Option<u64>) -> Result<u64, ApiError> {
    match requested {
        None => Ok(DEFAULT_LIMIT),
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::BadRequest(format!(
            "limit must be between 1 and {MAX_LIMIT}, got {n}"
        ))),
    }
}

/// Why a row is not moving (absent once it is done): a stable `code` to
/// filter on and a sentence for a person.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Reason {
    /// `ready`, `held`, `backing_off`, `no_stream`, `behind` or `dead` for
    /// outbox rows; `held`, `expired` or `quarantined` for claims.
    pub code: String,
    /// What holds it, until when, and what to do.
    pub text: String,
}

impl From<&service::stuck::OutboxReason> for Reason {
    fn from(reason: &service::stuck::OutboxReason) -> Self {
        Self {
            code: reason.code().to_owned(),
            text: reason.to_string(),
        }
    }
}

impl From<&service::stuck::ClaimReason> for Reason {
    fn from(reason: &service::stuck::ClaimReason) -> Self {
        Self {
            code: reason.code().to_owned(),
            text: reason.to_string(),
        }
    }
}

/// A page of results, newest first. Pass `next_after` as `after` to get the
/// next page; it is absent on the last page.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Page<T> {
    /// The rows.
    pub items: Vec<T>,
    /// Cursor for the next page.
    pub next_after: Option<i64>,
}

impl<T> Page<T> {
    /// Builds a page from up to `limit + 1` rows fetched newest first: the
    /// extra row only tells that another page exists.
    pub fn from_rows(mut rows: Vec<T>, limit: u64, id: impl Fn(&T) -> i64) -> Self {
        let more = rows.len() as u64 > limit;
        rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        let next_after = if more { rows.last().map(&id) } else { None };
        Self {
            items: rows,
            next_after,
        }
    }
}
