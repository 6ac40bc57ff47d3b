//! Rows written straight into the platform's tables, as a busy service (or
//! a person) leaves them, for tests that start from a given state.

use chrono::{DateTime, Utc};
use sea_orm::ActiveValue::{NotSet, Set};

use entity::{inbox_message, outbox_message};

/// A marker of `consumer` for `message_id`, received and processed at `at`.
pub fn marker(message_id: String, consumer: &str, at: DateTime<Utc>) -> inbox_message::ActiveModel {
    inbox_message::ActiveModel {
        id: NotSet,
        message_id: Set(message_id),
        consumer: Set(consumer.into()),
        received_at: Set(at),
        processed_at: Set(Some(at)),
        claimed_by: Set(None),
        claimed_at: Set(None),
        lease_until: Set(None),
        attempts: Set(1),
        result: Set(None),
        quarantined_at: Set(None),
        subject: Set(None),
        payload: Set(None),
    }
}

/// A pending outbox row for `message_id`, created (and due) at `at`.
pub fn event(message_id: String, at: DateTime<Utc>) -> outbox_message::ActiveModel {
    outbox_message::ActiveModel {
        id: NotSet,
        message_id: Set(message_id),
        subject: Set("ledger.recorded".into()),
        payload: Set(b"{}".to_vec()),
        headers: Set(serde_json::json!({})),
        ordering_key: Set(None),
        created_at: Set(at),
        published_at: Set(None),
        attempts: Set(0),
        last_error: Set(None),
        next_attempt_at: Set(at),
        locked_by: Set(None),
        locked_until: Set(None),
        dead_at: Set(None),
        causation_id: Set(None),
        causation_consumer: Set(None),
        correlation_id: Set(None),
    }
}
