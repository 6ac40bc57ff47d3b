//! `/api/v1/inbox`: markers and claims; release a stuck claim.

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use entity::inbox_message;
use service::ClaimState;
use service::admin::{self, Cursor, MarkerFilter};
use service::claim::Release;
use service::stuck::{self, ClaimReason};

use crate::AppState;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Path, Query};
use crate::page::{Page, Reason, limit};

/// State of an inbox marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InboxState {
    /// The message was applied.
    Processed,
    /// A two-phase claim holds a live lease.
    Claimed,
    /// A claim whose lease ran out (or was released) without completion.
    ExpiredClaim,
    /// A claim a person must judge.
    Quarantined,
}

/// Filters for the inbox list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InboxQuery {
    /// Only markers of this consumer.
    pub consumer: Option<String>,
    /// Only markers in this state.
    pub state: Option<InboxState>,
    /// Only markers of this message id.
    pub message_id: Option<String>,
    /// Cursor: markers with an id below this one.
    pub after: Option<i64>,
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<u64>,
}

/// An inbox marker.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct InboxRow {
    pub id: i64,
    pub message_id: String,
    pub consumer: String,
    pub state: InboxState,
    pub received_at: DateTime<Utc>,
    pub processed_at: Option<DateTime<Utc>>,
    pub claimed_by: Option<String>,
    pub claimed_at: Option<DateTime<Utc>>,
    pub lease_until: Option<DateTime<Utc>>,
    pub attempts: i32,
    pub result: Option<String>,
    pub quarantined_at: Option<DateTime<Utc>>,
    /// Why the claim is not done (absent once processed).
    pub reason: Option<Reason>,
}

impl From<ClaimState> for InboxState {
    fn from(state: ClaimState) -> Self {
        match state {
            ClaimState::Processed => Self::Processed,
            ClaimState::Claimed => Self::Claimed,
            ClaimState::Expired => Self::ExpiredClaim,
            ClaimState::Quarantined => Self::Quarantined,
        }
    }
}

impl From<InboxState> for ClaimState {
    fn from(state: InboxState) -> Self {
        match state {
            InboxState::Processed => Self::Processed,
            InboxState::Claimed => Self::Claimed,
            InboxState::ExpiredClaim => Self::Expired,
            InboxState::Quarantined => Self::Quarantined,
        }
    }
}

pub(crate) fn row(
    m: inbox_message::Summary,
    now: DateTime<Utc>,
    reason: Option<&ClaimReason>,
) -> InboxRow {
    InboxRow {
        reason: reason.map(Reason::from),
        state: ClaimState::of(&m, now).into(),
        id: m.id,
        message_id: m.message_id,
        consumer: m.consumer,
        received_at: m.received_at,
        processed_at: m.processed_at,
        claimed_by: m.claimed_by,
        claimed_at: m.claimed_at,
        lease_until: m.lease_until,
        attempts: m.attempts,
        result: m.result,
        quarantined_at: m.quarantined_at,
    }
}

/// Lists inbox markers, newest first.
#[utoipa::path(get, path = "/api/v1/inbox", tag = "inbox", params(InboxQuery),
    responses((status = 200, body = Page<InboxRow>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_inbox(
    State(state): State<AppState>,
    Query(q): Query<InboxQuery>,
) -> Result<Json<Page<InboxRow>>, ApiError> {
    let limit = limit(q.limit)?;
    let now = Utc::now();
    let filter = MarkerFilter {
        state: q.state.map(ClaimState::from),
        consumer: q.consumer,
        message_id: q.message_id,
    };
    let cursor = Cursor {
        after: q.after,
        limit,
    };
    let rows = admin::markers(state.reads(), &filter, cursor, now).await?;
    let reasons = stuck::claim_reasons(state.reads(), &rows, now).await?;
    let rows = rows
        .into_iter()
        .map(|m| {
            let reason = reasons.get(&m.id);
            row(m, now, reason)
        })
        .collect();
    Ok(Json(Page::from_rows(rows, limit, |r: &InboxRow| r.id)))
}

/// How a release is asked for.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReleaseQuery {
    /// Release a claim whose lease has not run out (refused with 409
    /// otherwise: its effect may be running, and a redelivery would perform
    /// it again).
    pub force: Option<bool>,
}

/// Releases a stuck claim so the next delivery or replay takes it: an
/// expired claim loses its lease; a quarantined one (a person decided the
/// effect did not happen) is un-quarantined with a fresh attempt count. A
/// claim under a live lease is refused (409, naming its holder and when the
/// lease ends) unless `force=true`.
#[utoipa::path(post, path = "/api/v1/inbox/{id}/release", tag = "inbox", params(("id" = i64, Path, description = "Inbox marker id"), ReleaseQuery),
    responses((status = 200, body = InboxRow), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn release_claim(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    Query(q): Query<ReleaseQuery>,
) -> Result<Json<InboxRow>, ApiError> {
    match service::claim::release(&state.db, id, q.force.unwrap_or(false)).await? {
        Release::Released(m) => {
            let m = inbox_message::Summary::from(*m);
            let now = Utc::now();
            let reasons = stuck::claim_reasons(&state.db, std::slice::from_ref(&m), now).await?;
            let reason = reasons.get(&m.id).cloned();
            Ok(Json(row(m, now, reason.as_ref())))
        }
        Release::NotFound => Err(ApiError::NotFound(format!("no inbox marker with id {id}"))),
        Release::Processed => Err(ApiError::Conflict(format!(
            "inbox marker {id} is processed; there is no claim to release"
        ))),
        Release::LiveLease { until, claimed_by } => Err(ApiError::Conflict(format!(
            "the claim of inbox marker {id} is held by {} until {until}: its effect may be running now, and a release would let a redelivery perform it again. Release with force=true only if its holder is gone",
            claimed_by.as_deref().unwrap_or("an unnamed instance")
        ))),
    }
}
