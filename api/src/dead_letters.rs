//! `/api/v1/dead-letters`: what consumers gave up on; replay or delete.

use async_nats::jetstream::message::PublishMessage;
use async_nats::{HeaderName, HeaderValue};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use entity::dead_letter;
use sea_orm::DatabaseConnection;
use service::admin::{self, Cursor, DeadLetterFilter, Replay, ReplayError};
use service::dead_letter::{DeadLetter, REPLAY_OF_HEADER};

use crate::AppState;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Path, Query};
use crate::outbox::encode_payload;
use crate::page::{Page, limit};

/// Filters for the dead-letter list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeadLetterQuery {
    /// Only dead letters of this consumer.
    pub consumer: Option<String>,
    /// `true`: only replayed ones; `false`: only those not replayed yet.
    pub replayed: Option<bool>,
    /// Cursor: rows with an id below this one.
    pub after: Option<i64>,
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<u64>,
}

/// A dead letter.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterRow {
    pub id: i64,
    pub consumer: String,
    pub message_id: Option<String>,
    pub subject: String,
    pub error: String,
    pub deliveries: i32,
    pub created_at: DateTime<Utc>,
    pub replayed_at: Option<DateTime<Utc>>,
}

/// A dead letter with its message.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterDetail {
    #[serde(flatten)]
    pub row: DeadLetterRow,
    /// UTF-8 text, or base64 when not valid UTF-8.
    pub payload: String,
    /// `utf8` or `base64`.
    pub payload_encoding: String,
    /// Headers as received.
    pub headers: serde_json::Value,
}

impl From<dead_letter::Summary> for DeadLetterRow {
    fn from(m: dead_letter::Summary) -> Self {
        Self {
            id: m.id,
            consumer: m.consumer,
            message_id: m.message_id,
            subject: m.subject,
            error: m.error,
            deliveries: m.deliveries,
            created_at: m.created_at,
            replayed_at: m.replayed_at,
        }
    }
}

async fn find(db: &DatabaseConnection, id: i64) -> Result<dead_letter::Model, ApiError> {
    admin::dead_letter(db, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no dead letter with id {id}")))
}

/// Lists dead letters, newest first.
#[utoipa::path(get, path = "/api/v1/dead-letters", tag = "dead-letters", params(DeadLetterQuery),
    responses((status = 200, body = Page<DeadLetterRow>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_dead_letters(
    State(state): State<AppState>,
    Query(q): Query<DeadLetterQuery>,
) -> Result<Json<Page<DeadLetterRow>>, ApiError> {
    let limit = limit(q.limit)?;
    let filter = DeadLetterFilter {
        consumer: q.consumer,
        replayed: q.replayed,
    };
    let cursor = Cursor {
        after: q.after,
        limit,
    };
    let rows = admin::dead_letters(state.reads(), &filter, cursor).await?;
    let rows = rows.into_iter().map(DeadLetterRow::from).collect();
    Ok(Json(Page::from_rows(rows, limit, |r: &DeadLetterRow| r.id)))
}

/// One dead letter with payload and headers.
#[utoipa::path(get, path = "/api/v1/dead-letters/{id}", tag = "dead-letters", params(("id" = i64, Path, description = "Dead letter id")),
    responses((status = 200, body = DeadLetterDetail), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_dead_letter(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<DeadLetterDetail>, ApiError> {
    let m = find(state.reads(), id).await?;
    let (payload, payload_encoding) = encode_payload(&m.payload);
    let headers = m.headers.clone();
    Ok(Json(DeadLetterDetail {
        row: dead_letter::Summary::from(m).into(),
        payload,
        payload_encoding,
        headers,
    }))
}

/// How a replay is asked for.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReplayQuery {
    /// Replay a dead letter that was replayed before (refused with 409
    /// otherwise: its consumer's marker may have been pruned since, and the
    /// message would be applied twice).
    pub force: Option<bool>,
}

/// Publishes the message again, with its original message id (so the inbox
/// still dedupes it if it was applied after all), to the replay subject of
/// the consumer that gave up on it: other consumers of the original subject
/// never see the replay, and one whose marker was pruned cannot apply it
/// twice. The original subject travels in a header. A dead letter replayed
/// before is refused (409, naming when) unless `force=true`.
#[utoipa::path(post, path = "/api/v1/dead-letters/{id}/replay", tag = "dead-letters", params(("id" = i64, Path, description = "Dead letter id"), ReplayQuery),
    responses((status = 200, body = DeadLetterRow), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn replay_dead_letter(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    Query(q): Query<ReplayQuery>,
) -> Result<Json<DeadLetterRow>, ApiError> {
    if state.jetstream.is_none() {
        // Without a broker nothing can be replayed; say so before judging
        // the row itself (only a missing row or one without an id, which
        // could never be replayed anywhere, come first).
        let row = find(&state.db, id).await?;
        if row.message_id.is_none() {
            return Err(ApiError::Conflict(
                ReplayError::<ApiError>::NoMessageId(id).to_string(),
            ));
        }
        return Err(no_broker());
    }
    let force = q.force.unwrap_or(false);
    let row = DeadLetter::replay(&state.db, id, force, |replay| publish(&state, replay))
        .await
        .map_err(|e| match e {
            ReplayError::NotFound(_) => ApiError::NotFound(e.to_string()),
            ReplayError::Publish(api) => api,
            ReplayError::Database(db) => db.into(),
            _ => ApiError::Conflict(e.to_string()),
        })?;
    Ok(Json(dead_letter::Summary::from(row).into()))
}

fn no_broker() -> ApiError {
    ApiError::Unavailable("replay needs NATS, which this API process is not connected to".into())
}

/// Sends `replay` to its consumer's replay subject and waits for JetStream.
async fn publish(state: &AppState, replay: Replay) -> Result<(), ApiError> {
    let js = state.jetstream.as_ref().ok_or_else(no_broker)?;
    let replay_subject = state
        .config
        .replay_subjects
        .get(&replay.consumer)
        .ok_or_else(|| {
            ApiError::Conflict(format!(
                "consumer {:?} is not registered in this process, so its replay subject is unknown; replay from a process that runs it",
                replay.consumer
            ))
        })?;
    let mut msg = PublishMessage::build().payload(replay.payload.into());
    for (name, value) in &replay.headers {
        // Checked by `DeadLetter::replay` as NATS accepts them; async-nats
        // would panic on anything else, so parse rather than assume.
        let (Ok(name), Ok(value)) = (name.parse::<HeaderName>(), value.parse::<HeaderValue>())
        else {
            return Err(ApiError::Conflict(format!(
                "a header NATS cannot carry ({name:?}); fix or delete the dead letter"
            )));
        };
        msg = msg.header(name, value);
    }
    let msg = msg
        .header(REPLAY_OF_HEADER, replay.subject.as_str())
        .message_id(&replay.message_id);
    let publish = async {
        let ack = js
            .send_publish(replay_subject.clone(), msg)
            .await
            .map_err(|e| e.to_string())?;
        ack.await.map_err(|e| e.to_string())
    };
    let ack = publish.await.map_err(|e| {
        tracing::warn!(message_id = %replay.message_id, error = %e, "replay publish failed");
        ApiError::Unavailable(format!(
            "could not publish to {replay_subject}: the broker did not acknowledge"
        ))
    })?;
    if ack.duplicate {
        return Err(ApiError::Conflict(format!(
            "JetStream dropped the replay as a duplicate of message {} published within its duplicate window; retry after the window",
            replay.message_id
        )));
    }
    Ok(())
}

/// Deletes a dead letter (a person decided it needs nothing more).
#[utoipa::path(delete, path = "/api/v1/dead-letters/{id}", tag = "dead-letters", params(("id" = i64, Path, description = "Dead letter id")),
    responses((status = 204, description = "Deleted"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn delete_dead_letter(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<StatusCode, ApiError> {
    if !DeadLetter::delete(&state.db, id).await? {
        return Err(ApiError::NotFound(format!("no dead letter with id {id}")));
    }
    Ok(StatusCode::NO_CONTENT)
}
