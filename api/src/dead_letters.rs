//! `/api/v1/dead-letters`: what consumers gave up on; replay or delete.

use async_nats::jetstream::message::PublishMessage;
use async_nats::{HeaderName, HeaderValue};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, Condition, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use entity::dead_letter::{self, Column};

use service::dead_letter::REPLAY_OF_HEADER;

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

impl From<dead_letter::Model> for DeadLetterRow {
    fn from(m: dead_letter::Model) -> Self {
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

async fn find(state: &AppState, id: i64) -> Result<dead_letter::Model, ApiError> {
    dead_letter::Entity::find_by_id(id)
        .one(&state.db)
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
    let mut cond = Condition::all();
    if let Some(c) = q.consumer {
        cond = cond.add(Column::Consumer.eq(c));
    }
    match q.replayed {
        Some(true) => cond = cond.add(Column::ReplayedAt.is_not_null()),
        Some(false) => cond = cond.add(Column::ReplayedAt.is_null()),
        None => {}
    }
    if let Some(after) = q.after {
        cond = cond.add(Column::Id.lt(after));
    }
    let rows = dead_letter::Entity::find()
        .filter(cond)
        .order_by_desc(Column::Id)
        .limit(limit + 1)
        .all(&state.db)
        .await?;
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
    let m = find(&state, id).await?;
    let (payload, payload_encoding) = encode_payload(&m.payload);
    let headers = m.headers.clone();
    Ok(Json(DeadLetterDetail {
        row: m.into(),
        payload,
        payload_encoding,
        headers,
    }))
}

/// Publishes the message again, with its original message id (so the inbox
/// still dedupes it if it was applied after all), to the replay subject of
/// the consumer that gave up on it: other consumers of the original subject
/// never see the replay, and one whose marker was pruned cannot apply it
/// twice. The original subject travels in a header.
#[utoipa::path(post, path = "/api/v1/dead-letters/{id}/replay", tag = "dead-letters", params(("id" = i64, Path, description = "Dead letter id")),
    responses((status = 200, body = DeadLetterRow), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn replay_dead_letter(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<DeadLetterRow>, ApiError> {
    let m = find(&state, id).await?;
    let Some(message_id) = m.message_id.clone() else {
        return Err(ApiError::Conflict(format!(
            "dead letter {id} has no message id; replaying it would only dead-letter it again"
        )));
    };
    let js = state.jetstream.as_ref().ok_or_else(|| {
        ApiError::Unavailable(
            "replay needs NATS, which this API process is not connected to".into(),
        )
    })?;
    if let Some(claim) = service::claim::quarantined(&state.db, &message_id, &m.consumer).await? {
        return Err(ApiError::Conflict(format!(
            "consumer {:?} has quarantined its claim on message {message_id}; a replay would be terminated again. Release it first (POST /api/v1/inbox/{claim}/release) if the effect did not happen",
            m.consumer
        )));
    }
    if service::outbox::check_message_id(&message_id).is_err()
        || m.subject.is_empty()
        || m.subject.contains(char::is_whitespace)
    {
        return Err(ApiError::Conflict(format!(
            "dead letter {id} has a message id or subject NATS cannot carry; fix or delete it"
        )));
    }
    let replay_subject = state
        .config
        .replay_subjects
        .get(&m.consumer)
        .ok_or_else(|| {
            ApiError::Conflict(format!(
                "consumer {:?} is not registered in this process, so its replay subject is unknown; replay from a process that runs it",
                m.consumer
            ))
        })?;
    let mut msg = PublishMessage::build().payload(m.payload.clone().into());
    if let Some(headers) = m.headers.as_object() {
        for (name, value) in headers {
            let Some(value) = value.as_str() else {
                continue;
            };
            if name == REPLAY_OF_HEADER {
                continue;
            }
            // Rows can be edited by hand; async-nats panics on what NATS
            // cannot carry, so check first.
            let (Ok(name), Ok(value)) = (name.parse::<HeaderName>(), value.parse::<HeaderValue>())
            else {
                return Err(ApiError::Conflict(format!(
                    "dead letter {id} has a header NATS cannot carry ({name:?}); fix or delete it"
                )));
            };
            msg = msg.header(name, value);
        }
    }
    let msg = msg
        .header(REPLAY_OF_HEADER, m.subject.as_str())
        .message_id(&message_id);
    let publish = async {
        let ack = js
            .send_publish(replay_subject.clone(), msg)
            .await
            .map_err(|e| e.to_string())?;
        ack.await.map_err(|e| e.to_string())
    };
    let ack = publish.await.map_err(|e| {
        tracing::warn!(id, error = %e, "replay publish failed");
        ApiError::Unavailable(format!(
            "could not publish to {}: the broker did not acknowledge",
            m.subject
        ))
    })?;
    if ack.duplicate {
        return Err(ApiError::Conflict(format!(
            "JetStream dropped the replay as a duplicate of message {message_id} published within its duplicate window; retry after the window"
        )));
    }
    dead_letter::Entity::update_many()
        .col_expr(Column::ReplayedAt, Expr::value(Utc::now()))
        .filter(Column::Id.eq(id))
        .exec(&state.db)
        .await?;
    tracing::info!(id, %message_id, subject = %m.subject, "dead letter replayed by an operator");
    Ok(Json(find(&state, id).await?.into()))
}

/// Deletes a dead letter (a person decided it needs nothing more).
#[utoipa::path(delete, path = "/api/v1/dead-letters/{id}", tag = "dead-letters", params(("id" = i64, Path, description = "Dead letter id")),
    responses((status = 204, description = "Deleted"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn delete_dead_letter(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<StatusCode, ApiError> {
    let res = dead_letter::Entity::delete_by_id(id)
        .exec(&state.db)
        .await?;
    if res.rows_affected == 0 {
        return Err(ApiError::NotFound(format!("no dead letter with id {id}")));
    }
    Ok(StatusCode::NO_CONTENT)
}
