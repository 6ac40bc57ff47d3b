//! Why a row is not moving: the answer to an operator's most common question
//! ("where is message X, and why is it stuck?"), computed for a whole page
//! of rows with a fixed number of queries, never one per row.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, FromQueryResult, QueryFilter, QuerySelect,
};

use entity::{dead_letter, inbox_message, outbox_message};

use crate::state::{ClaimState, OutboxState};

/// Text the relay records when no stream captures a row's subject.
const NO_STREAM: &str = "no stream found for given subject";

/// Why an unpublished outbox row has not gone out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboxReason {
    /// Due; the relay's next round takes it.
    Ready,
    /// A relay holds it: publishing now, or crashed (its lease ends at `until`).
    Held {
        /// The relay instance and round.
        by: String,
        /// When the lease ends.
        until: DateTime<Utc>,
    },
    /// Failed `attempts` times; the next attempt is at `until`.
    BackingOff {
        /// The next attempt.
        until: DateTime<Utc>,
        /// Failed attempts so far.
        attempts: i32,
        /// The last failure.
        last_error: Option<String>,
    },
    /// The broker has no stream for the subject; the relay tries again at
    /// `until`, and keeps failing until a stream captures the subject.
    NoStream {
        /// The subject.
        subject: String,
        /// The next attempt.
        until: DateTime<Utc>,
    },
    /// An earlier pending row of the same ordering key goes first.
    Behind {
        /// The earliest pending row of the key.
        head: i64,
        /// The key.
        key: String,
        /// Why that row is not moving.
        head_reason: Box<OutboxReason>,
    },
    /// The relay gave up; the row waits for a person to retry it.
    Dead {
        /// When it gave up.
        since: DateTime<Utc>,
        /// Failed attempts.
        attempts: i32,
        /// The last failure.
        last_error: Option<String>,
    },
}

impl OutboxReason {
    /// A short stable name, for filters and dashboards.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Held { .. } => "held",
            Self::BackingOff { .. } => "backing_off",
            Self::NoStream { .. } => "no_stream",
            Self::Behind { .. } => "behind",
            Self::Dead { .. } => "dead",
        }
    }
}

impl std::fmt::Display for OutboxReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let error = |e: &Option<String>| {
            e.as_deref()
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default()
        };
        match self {
            Self::Ready => write!(f, "due; the relay's next round publishes it"),
            Self::Held { by, until } => write!(f, "held by relay {by} until {until}"),
            Self::BackingOff {
                until,
                attempts,
                last_error,
            } => write!(
                f,
                "backing off until {until} after {attempts} failed attempt(s){}",
                error(last_error)
            ),
            Self::NoStream { subject, until } => write!(
                f,
                "no stream captures subject {subject}; the next attempt is at {until}"
            ),
            Self::Behind {
                head,
                key,
                head_reason,
            } => write!(
                f,
                "waiting behind row #{head} of key {key}, which is {head_reason}"
            ),
            Self::Dead {
                since,
                attempts,
                last_error,
            } => write!(
                f,
                "dead since {since} after {attempts} attempt(s){}; retry it once the cause is fixed",
                error(last_error)
            ),
        }
    }
}

/// Why a claim (an inbox marker not yet processed) is not done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimReason {
    /// An instance holds it under a live lease and may still be working.
    Held {
        /// The instance.
        by: Option<String>,
        /// When the lease ends.
        until: DateTime<Utc>,
    },
    /// The lease ran out (or was released); the next delivery, a replay or
    /// the sweeper takes it.
    Expired {
        /// Attempts so far.
        attempts: i32,
    },
    /// A person must judge whether the effect happened.
    Quarantined {
        /// When it was quarantined.
        since: DateTime<Utc>,
        /// The dead letter that says why, if it is still there.
        dead_letter: Option<i64>,
    },
}

impl ClaimReason {
    /// A short stable name.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Held { .. } => "held",
            Self::Expired { .. } => "expired",
            Self::Quarantined { .. } => "quarantined",
        }
    }
}

impl std::fmt::Display for ClaimReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Held { by, until } => write!(
                f,
                "held by instance {} until {until}",
                by.as_deref().unwrap_or("(unknown)")
            ),
            Self::Expired { attempts } => write!(
                f,
                "lease expired after {attempts} attempt(s); waiting for a redelivery, a replay or the sweeper"
            ),
            Self::Quarantined { since, dead_letter } => match dead_letter {
                Some(id) => write!(f, "quarantined since {since}; see dead letter #{id}"),
                None => write!(f, "quarantined since {since}"),
            },
        }
    }
}

/// The head of an ordering key: its earliest pending row.
#[derive(Debug, FromQueryResult)]
struct Head {
    id: i64,
    subject: String,
    ordering_key: Option<String>,
    attempts: i32,
    last_error: Option<String>,
    next_attempt_at: DateTime<Utc>,
    locked_by: Option<String>,
    locked_until: Option<DateTime<Utc>>,
}

impl Head {
    fn of(row: &outbox_message::Summary) -> Self {
        Self {
            id: row.id,
            subject: row.subject.clone(),
            ordering_key: row.ordering_key.clone(),
            attempts: row.attempts,
            last_error: row.last_error.clone(),
            next_attempt_at: row.next_attempt_at,
            locked_by: row.locked_by.clone(),
            locked_until: row.locked_until,
        }
    }

    /// Its own reason, not counting any row ahead of it.
    fn reason(&self, now: DateTime<Utc>) -> OutboxReason {
        if let (Some(by), Some(until)) = (&self.locked_by, self.locked_until)
            && until > now
        {
            return OutboxReason::Held {
                by: by.clone(),
                until,
            };
        }
        if self.next_attempt_at > now && self.attempts > 0 {
            if self
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains(NO_STREAM))
            {
                return OutboxReason::NoStream {
                    subject: self.subject.clone(),
                    until: self.next_attempt_at,
                };
            }
            return OutboxReason::BackingOff {
                until: self.next_attempt_at,
                attempts: self.attempts,
                last_error: self.last_error.clone(),
            };
        }
        OutboxReason::Ready
    }
}

/// Why each unpublished row of `rows` is not moving, at `now`, by row id
/// (published rows have none). Two queries at most, whatever the page size:
/// the heads of the rows' ordering keys.
///
/// # Errors
/// Database errors.
pub async fn outbox_reasons(
    db: &DatabaseConnection,
    rows: &[outbox_message::Summary],
    now: DateTime<Utc>,
) -> Result<HashMap<i64, OutboxReason>, DbErr> {
    let heads = key_heads(db, rows).await?;
    let mut reasons = HashMap::new();
    for row in rows {
        let reason = match OutboxState::of(row) {
            OutboxState::Published => continue,
            OutboxState::Dead => OutboxReason::Dead {
                since: row.dead_at.unwrap_or(row.next_attempt_at),
                attempts: row.attempts,
                last_error: row.last_error.clone(),
            },
            OutboxState::Pending => {
                let own = Head::of(row).reason(now);
                let head = row.ordering_key.as_ref().and_then(|k| heads.get(k));
                match (own, head) {
                    (OutboxReason::Ready, Some(head)) if head.id < row.id => OutboxReason::Behind {
                        head: head.id,
                        key: head.ordering_key.clone().unwrap_or_default(),
                        head_reason: Box::new(head.reason(now)),
                    },
                    (own, _) => own,
                }
            }
        };
        reasons.insert(row.id, reason);
    }
    Ok(reasons)
}

/// The earliest pending row of each ordering key among `rows`' pending ones.
async fn key_heads(
    db: &DatabaseConnection,
    rows: &[outbox_message::Summary],
) -> Result<HashMap<String, Head>, DbErr> {
    use outbox_message::Column;
    let keys: HashSet<&str> = rows
        .iter()
        .filter(|r| OutboxState::of(r) == OutboxState::Pending)
        .filter_map(|r| r.ordering_key.as_deref())
        .collect();
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let first_ids = Query::select()
        .expr(Expr::col(Column::Id).min())
        .from(outbox_message::Entity)
        .cond_where(OutboxState::Pending.condition())
        .and_where(Column::OrderingKey.is_in(keys.iter().copied()))
        .group_by_col(Column::OrderingKey)
        .to_owned();
    let heads: Vec<Head> = outbox_message::Entity::find()
        .select_only()
        .columns([
            Column::Id,
            Column::Subject,
            Column::OrderingKey,
            Column::Attempts,
            Column::LastError,
            Column::NextAttemptAt,
            Column::LockedBy,
            Column::LockedUntil,
        ])
        .filter(Column::Id.in_subquery(first_ids))
        .into_model()
        .all(db)
        .await?;
    Ok(heads
        .into_iter()
        .filter_map(|h| h.ordering_key.clone().map(|k| (k, h)))
        .collect())
}

/// Why each open or quarantined marker of `rows` is not done, at `now`, by
/// marker id (processed markers have none). One query at most: the dead
/// letters of the quarantined ones.
///
/// # Errors
/// Database errors.
pub async fn claim_reasons(
    db: &DatabaseConnection,
    rows: &[inbox_message::Summary],
    now: DateTime<Utc>,
) -> Result<HashMap<i64, ClaimReason>, DbErr> {
    let quarantined: Vec<&inbox_message::Summary> = rows
        .iter()
        .filter(|r| ClaimState::of(r, now) == ClaimState::Quarantined)
        .collect();
    let letters: Vec<(i64, String, Option<String>)> = if quarantined.is_empty() {
        Vec::new()
    } else {
        dead_letter::Entity::find()
            .select_only()
            .columns([
                dead_letter::Column::Id,
                dead_letter::Column::Consumer,
                dead_letter::Column::MessageId,
            ])
            .filter(
                dead_letter::Column::MessageId
                    .is_in(quarantined.iter().map(|r| r.message_id.as_str())),
            )
            .into_tuple()
            .all(db)
            .await?
    };
    let letter_of = |row: &inbox_message::Summary| {
        letters
            .iter()
            .filter(|(_, consumer, id)| {
                consumer == &row.consumer && id.as_deref() == Some(row.message_id.as_str())
            })
            .map(|(id, _, _)| *id)
            .max()
    };
    let mut reasons = HashMap::new();
    for row in rows {
        let reason = match ClaimState::of(row, now) {
            ClaimState::Processed => continue,
            ClaimState::Claimed => ClaimReason::Held {
                by: row.claimed_by.clone(),
                until: row.lease_until.unwrap_or(now),
            },
            ClaimState::Expired => ClaimReason::Expired {
                attempts: row.attempts,
            },
            ClaimState::Quarantined => ClaimReason::Quarantined {
                since: row.quarantined_at.unwrap_or(now),
                dead_letter: letter_of(row),
            },
        };
        reasons.insert(row.id, reason);
    }
    Ok(reasons)
}
