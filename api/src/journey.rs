//! `/api/v1/messages/{id}` and `/api/v1/correlations/{id}`: where a message
//! went, what it caused, and where it stopped.

use axum::Json;
use axum::extract::State;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use service::journey::{self, Step};
use service::stuck;

use crate::AppState;
use crate::dead_letters::DeadLetterRow;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Path;
use crate::inbox::{InboxRow, row as inbox_row};
use crate::outbox::OutboxRow;

/// What caused a message: the message and the consumer whose handler wrote it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Causation {
    pub message_id: String,
    pub consumer: Option<String>,
}

/// One message on a journey.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JourneyStep {
    pub message_id: String,
    /// The conversation it belongs to, when seawall wrote it.
    pub correlation_id: Option<String>,
    /// What caused it, when a seawall handler wrote it.
    pub caused_by: Option<Causation>,
    /// Its outbox row (publication state and why it waits), when seawall wrote it.
    pub event: Option<OutboxRow>,
    /// Each consumer's marker: processed, claimed or quarantined, with times.
    pub markers: Vec<InboxRow>,
    /// Where consumers gave up on it, and why.
    pub dead_letters: Vec<DeadLetterRow>,
}

/// A message and the events its handlers wrote.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Journey {
    pub message: JourneyStep,
    pub caused: Vec<JourneyStep>,
}

/// Every message of a conversation.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Correlation {
    pub correlation_id: String,
    /// The message that started it first, then the events in the order written.
    pub messages: Vec<JourneyStep>,
}

/// The steps as the API shows them, with why each event or claim waits.
async fn present(state: &AppState, steps: Vec<Step>) -> Result<Vec<JourneyStep>, ApiError> {
    let now = Utc::now();
    let events: Vec<_> = steps.iter().filter_map(|s| s.event.clone()).collect();
    let markers: Vec<_> = steps.iter().flat_map(|s| s.markers.clone()).collect();
    let event_reasons = stuck::outbox_reasons(state.reads(), &events, now).await?;
    let claim_reasons = stuck::claim_reasons(state.reads(), &markers, now).await?;
    Ok(steps
        .into_iter()
        .map(|step| JourneyStep {
            correlation_id: step.event.as_ref().and_then(|e| e.correlation_id.clone()),
            caused_by: step.event.as_ref().and_then(|e| {
                e.causation_id.clone().map(|message_id| Causation {
                    message_id,
                    consumer: e.causation_consumer.clone(),
                })
            }),
            event: step.event.map(|e| {
                let reason = event_reasons.get(&e.id);
                OutboxRow::new(e, reason)
            }),
            markers: step
                .markers
                .into_iter()
                .map(|m| {
                    let reason = claim_reasons.get(&m.id);
                    inbox_row(m, now, reason)
                })
                .collect(),
            dead_letters: step
                .dead_letters
                .into_iter()
                .map(DeadLetterRow::from)
                .collect(),
            message_id: step.message_id,
        })
        .collect())
}

/// Everything the database knows about a message: each consumer's marker,
/// the events its handlers wrote (with their consumers), and dead letters.
#[utoipa::path(get, path = "/api/v1/messages/{message_id}", tag = "journey", params(("message_id" = String, Path, description = "Message id")),
    responses((status = 200, body = Journey), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_message(
    State(state): State<AppState>,
    Path(message_id): Path<String>,
) -> Result<Json<Journey>, ApiError> {
    let found = journey::message(state.reads(), &message_id).await?;
    if found.is_empty() {
        return Err(ApiError::NotFound(format!(
            "nothing is known of message {message_id:?}"
        )));
    }
    let mut steps = present(
        &state,
        std::iter::once(found.message).chain(found.caused).collect(),
    )
    .await?;
    let message = steps.remove(0);
    Ok(Json(Journey {
        message,
        caused: steps,
    }))
}

/// Every message of a conversation (the tree: follow `caused_by`).
#[utoipa::path(get, path = "/api/v1/correlations/{correlation_id}", tag = "journey", params(("correlation_id" = String, Path, description = "Correlation id (the id of the message that started it)")),
    responses((status = 200, body = Correlation), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_correlation(
    State(state): State<AppState>,
    Path(correlation_id): Path<String>,
) -> Result<Json<Correlation>, ApiError> {
    let steps = journey::correlation(state.reads(), &correlation_id).await?;
    if steps.is_empty() {
        return Err(ApiError::NotFound(format!(
            "nothing is known of correlation {correlation_id:?}"
        )));
    }
    Ok(Json(Correlation {
        messages: present(&state, steps).await?,
        correlation_id,
    }))
}
