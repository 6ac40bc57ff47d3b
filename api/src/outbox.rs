//! `/api/v1/outbox`: see what waits, what went out, what died; retry.

use axum::Json;
use axum::extract::State;
use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use entity::outbox_message;
use sea_orm::DatabaseConnection;
use service::admin::{self, Cursor, OutboxFilter, TimeRange};
use service::stuck::{self, OutboxReason};
use service::{Outbox, OutboxState};

use crate::AppState;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Json as Body, Path, Query};
use crate::page::{Page, Reason, limit};

/// Publication state of an outbox row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutboxStatus {
    /// Waiting for the relay (possibly backing off after failures).
    Pending,
    /// Acknowledged by JetStream.
    Published,
    /// Gave up after the attempt limit; waits for a retry.
    Dead,
}

/// Filters for the outbox list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OutboxQuery {
    /// Only rows in this state.
    pub status: Option<OutboxStatus>,
    /// Only rows on this subject.
    pub subject: Option<String>,
    /// Only rows created at or after this time (RFC 3339).
    pub from: Option<DateTime<Utc>>,
    /// Only rows created before this time (RFC 3339).
    pub to: Option<DateTime<Utc>>,
    /// Only the row with this message id.
    pub message_id: Option<String>,
    /// Cursor: rows with an id below this one (from `next_after`).
    pub after: Option<i64>,
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<u64>,
}

/// An outbox row without its payload.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OutboxRow {
    pub id: i64,
    pub message_id: String,
    pub subject: String,
    pub status: OutboxStatus,
    pub ordering_key: Option<String>,
    pub created_at: DateTime<Utc>,
    pub published_at: Option<DateTime<Utc>>,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub next_attempt_at: DateTime<Utc>,
    pub dead_at: Option<DateTime<Utc>>,
    /// Why it has not been published yet (absent once it is).
    pub reason: Option<Reason>,
}

/// An outbox row with payload and headers.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OutboxDetail {
    #[serde(flatten)]
    pub row: OutboxRow,
    /// The payload: UTF-8 text, or base64 when it is not valid UTF-8.
    pub payload: String,
    /// `utf8` or `base64`.
    pub payload_encoding: String,
    /// NATS headers as a JSON object.
    pub headers: serde_json::Value,
}

/// Which dead rows a bulk retry resets.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct RetryFilter {
    /// Only rows on this subject.
    pub subject: Option<String>,
    /// Only rows created at or after this time.
    pub from: Option<DateTime<Utc>>,
    /// Only rows created before this time.
    pub to: Option<DateTime<Utc>>,
}

/// How many rows a bulk action changed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Affected {
    pub affected: u64,
}

impl From<OutboxState> for OutboxStatus {
    fn from(state: OutboxState) -> Self {
        match state {
            OutboxState::Pending => Self::Pending,
            OutboxState::Published => Self::Published,
            OutboxState::Dead => Self::Dead,
        }
    }
}

impl From<OutboxStatus> for OutboxState {
    fn from(status: OutboxStatus) -> Self {
        match status {
            OutboxStatus::Pending => Self::Pending,
            OutboxStatus::Published => Self::Published,
            OutboxStatus::Dead => Self::Dead,
        }
    }
}

impl OutboxRow {
    pub(crate) fn new(m: outbox_message::Summary, reason: Option<&OutboxReason>) -> Self {
        Self {
            reason: reason.map(Reason::from),
            status: OutboxState::of(&m).into(),
            id: m.id,
            message_id: m.message_id,
            subject: m.subject,
            ordering_key: m.ordering_key,
            created_at: m.created_at,
            published_at: m.published_at,
            attempts: m.attempts,
            last_error: m.last_error,
            next_attempt_at: m.next_attempt_at,
            dead_at: m.dead_at,
        }
    }
}

/// Text when the bytes are UTF-8, base64 otherwise.
pub fn encode_payload(bytes: &[u8]) -> (String, String) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_owned(), "utf8".to_owned()),
        Err(_) => (
            base64::engine::general_purpose::STANDARD.encode(bytes),
            "base64".to_owned(),
        ),
    }
}

fn created(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Result<TimeRange, ApiError> {
    TimeRange::new(from, to).map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// Lists outbox rows, newest first.
#[utoipa::path(get, path = "/api/v1/outbox", tag = "outbox", params(OutboxQuery),
    responses((status = 200, body = Page<OutboxRow>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_outbox(
    State(state): State<AppState>,
    Query(q): Query<OutboxQuery>,
) -> Result<Json<Page<OutboxRow>>, ApiError> {
    let limit = limit(q.limit)?;
    let filter = OutboxFilter {
        state: q.status.map(OutboxState::from),
        subject: q.subject,
        message_id: q.message_id,
        created: created(q.from, q.to)?,
        ..OutboxFilter::default()
    };
    let cursor = Cursor {
        after: q.after,
        limit,
    };
    let rows = admin::outbox_rows(state.reads(), &filter, cursor).await?;
    let reasons = stuck::outbox_reasons(state.reads(), &rows, Utc::now()).await?;
    let rows = rows
        .into_iter()
        .map(|m| {
            let reason = reasons.get(&m.id);
            OutboxRow::new(m, reason)
        })
        .collect();
    Ok(Json(Page::from_rows(rows, limit, |r: &OutboxRow| r.id)))
}

/// The row as the API shows it, with why it is not moving.
async fn with_reason(
    db: &DatabaseConnection,
    m: outbox_message::Summary,
) -> Result<OutboxRow, ApiError> {
    let reasons = stuck::outbox_reasons(db, std::slice::from_ref(&m), Utc::now()).await?;
    let reason = reasons.get(&m.id).cloned();
    Ok(OutboxRow::new(m, reason.as_ref()))
}

async fn find(db: &DatabaseConnection, id: i64) -> Result<outbox_message::Model, ApiError> {
    admin::outbox_row(db, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no outbox row with id {id}")))
}

/// One outbox row with payload and headers.
#[utoipa::path(get, path = "/api/v1/outbox/{id}", tag = "outbox", params(("id" = i64, Path, description = "Outbox row id")),
    responses((status = 200, body = OutboxDetail), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_outbox(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<OutboxDetail>, ApiError> {
    let m = find(state.reads(), id).await?;
    let (payload, payload_encoding) = encode_payload(&m.payload);
    let headers = m.headers.clone();
    Ok(Json(OutboxDetail {
        row: with_reason(state.reads(), m.into()).await?,
        payload,
        payload_encoding,
        headers,
    }))
}

/// Makes a dead (or backing-off) row publishable again now, with a fresh attempt count.
#[utoipa::path(post, path = "/api/v1/outbox/{id}/retry", tag = "outbox", params(("id" = i64, Path, description = "Outbox row id")),
    responses((status = 200, body = OutboxRow), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn retry_outbox(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<OutboxRow>, ApiError> {
    let m = find(&state.db, id).await?;
    if m.published_at.is_some() {
        return Err(ApiError::Conflict(format!(
            "outbox row {id} is already published"
        )));
    }
    let one = OutboxFilter {
        id: Some(id),
        ..OutboxFilter::default()
    };
    retry(&state, &one).await?;
    Ok(Json(
        with_reason(&state.db, find(&state.db, id).await?.into()).await?,
    ))
}

/// Makes every dead row matching the filter publishable again.
#[utoipa::path(post, path = "/api/v1/outbox/retry", tag = "outbox", request_body = RetryFilter,
    responses((status = 200, body = Affected), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn retry_dead(
    State(state): State<AppState>,
    Body(filter): Body<RetryFilter>,
) -> Result<(axum::Extension<crate::audit::Changed>, Json<Affected>), ApiError> {
    let dead = OutboxFilter {
        state: Some(OutboxState::Dead),
        subject: filter.subject,
        created: created(filter.from, filter.to)?,
        ..OutboxFilter::default()
    };
    let affected = retry(&state, &dead).await?;
    Ok((
        axum::Extension(crate::audit::Changed(affected)),
        Json(Affected { affected }),
    ))
}

/// Retries the rows and wakes this process's relay, if it runs one, so
/// they go now rather than at its next poll.
async fn retry(state: &AppState, filter: &OutboxFilter) -> Result<u64, ApiError> {
    let affected = Outbox::retry(&state.db, filter).await?;
    if affected > 0
        && let Some(wake) = &state.relay_wake
    {
        wake.notify_one();
    }
    Ok(affected)
}
