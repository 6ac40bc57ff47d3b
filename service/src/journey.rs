//! A message's journey: what the database knows about it, and about what it
//! caused. The inbox, the outbox and the dead letters live in one database,
//! so "where is message X?" is a handful of indexed queries: the consumers
//! that handled it (markers), the events its handlers wrote (outbox rows with
//! `causation_id = X`), the consumers of those events, and the dead letters
//! on the way.

use std::collections::HashMap;

use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};

use entity::{dead_letter, inbox_message, outbox_message};

/// The most messages a correlation lists.
pub const MAX_STEPS: u64 = 500;

/// One message on a journey.
#[derive(Debug, Clone)]
pub struct Step {
    /// The message.
    pub message_id: String,
    /// Its outbox row, when a seawall handler (or producer) wrote it here.
    pub event: Option<outbox_message::Summary>,
    /// Each consumer's marker for it.
    pub markers: Vec<inbox_message::Summary>,
    /// Where consumers gave up on it.
    pub dead_letters: Vec<dead_letter::Summary>,
}

/// A message and the events it caused, one level down.
#[derive(Debug, Clone)]
pub struct Journey {
    /// The message itself.
    pub message: Step,
    /// The events its handlers wrote, each with its own consumers.
    pub caused: Vec<Step>,
}

impl Journey {
    /// Whether the database knows nothing of the message.
    pub fn is_empty(&self) -> bool {
        self.message.event.is_none()
            && self.message.markers.is_empty()
            && self.message.dead_letters.is_empty()
            && self.caused.is_empty()
    }
}

/// The journey of `message_id`. Five queries, whatever the fan-out.
///
/// # Errors
/// Database errors.
pub async fn message(db: &DatabaseConnection, message_id: &str) -> Result<Journey, DbErr> {
    let own = outbox_message::Entity::find()
        .filter(outbox_message::Column::MessageId.eq(message_id))
        .into_partial_model::<outbox_message::Summary>()
        .all(db)
        .await?;
    let caused = outbox_message::Entity::find()
        .filter(outbox_message::Column::CausationId.eq(message_id))
        .order_by_asc(outbox_message::Column::Id)
        .limit(MAX_STEPS)
        .into_partial_model::<outbox_message::Summary>()
        .all(db)
        .await?;
    let mut steps = steps(
        db,
        own.into_iter().chain(caused).collect(),
        Some(message_id),
    )
    .await?;
    let message = steps.remove(0);
    Ok(Journey {
        message,
        caused: steps,
    })
}

/// Every message of conversation `correlation_id` that the database knows,
/// first the one that started it, then the events in the order they were
/// written (at most [`MAX_STEPS`]).
///
/// # Errors
/// Database errors.
pub async fn correlation(
    db: &DatabaseConnection,
    correlation_id: &str,
) -> Result<Vec<Step>, DbErr> {
    let events = outbox_message::Entity::find()
        .filter(outbox_message::Column::CorrelationId.eq(correlation_id))
        .order_by_asc(outbox_message::Column::Id)
        .limit(MAX_STEPS)
        .into_partial_model::<outbox_message::Summary>()
        .all(db)
        .await?;
    let mut steps = steps(db, events, Some(correlation_id)).await?;
    let root_is_known = steps
        .first()
        .is_some_and(|s| s.event.is_some() || !s.markers.is_empty() || !s.dead_letters.is_empty());
    if !root_is_known {
        steps.remove(0);
    }
    Ok(steps)
}

/// A step per message: `first` (when given) and then each of `events`, with
/// their markers and dead letters (two queries).
async fn steps(
    db: &DatabaseConnection,
    events: Vec<outbox_message::Summary>,
    first: Option<&str>,
) -> Result<Vec<Step>, DbErr> {
    let mut order: Vec<String> = first.map(str::to_owned).into_iter().collect();
    let mut by_id: HashMap<String, outbox_message::Summary> = HashMap::new();
    for event in events {
        if !order.contains(&event.message_id) {
            order.push(event.message_id.clone());
        }
        by_id.insert(event.message_id.clone(), event);
    }
    let markers = inbox_message::Entity::find()
        .filter(inbox_message::Column::MessageId.is_in(order.iter().map(String::as_str)))
        .order_by_asc(inbox_message::Column::Id)
        .into_partial_model::<inbox_message::Summary>()
        .all(db)
        .await?;
    let letters = dead_letter::Entity::find()
        .filter(dead_letter::Column::MessageId.is_in(order.iter().map(String::as_str)))
        .order_by_asc(dead_letter::Column::Id)
        .into_partial_model::<dead_letter::Summary>()
        .all(db)
        .await?;
    Ok(order
        .into_iter()
        .map(|id| Step {
            event: by_id.remove(&id),
            markers: markers
                .iter()
                .filter(|m| m.message_id == id)
                .cloned()
                .collect(),
            dead_letters: letters
                .iter()
                .filter(|d| d.message_id.as_deref() == Some(id.as_str()))
                .cloned()
                .collect(),
            message_id: id,
        })
        .collect())
}
