//! Counts that answer "is anything stuck?" at a glance. Shared by the CLI's
//! `seawall stats` and the admin API.

use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait, QueryFilter};
use serde::Serialize;

use entity::{dead_letter, inbox_message, outbox_message};

/// Row counts by table and state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Outbox rows waiting for the relay.
    pub outbox_pending: u64,
    /// Outbox rows JetStream acknowledged.
    pub outbox_published: u64,
    /// Outbox rows that reached the attempt limit.
    pub outbox_dead: u64,
    /// Inbox markers of completed work.
    pub inbox_processed: u64,
    /// Inbox markers of open two-phase claims.
    pub inbox_claimed: u64,
    /// Dead letters not yet replayed.
    pub dead_letters: u64,
}

/// Reads the counts.
///
/// # Errors
/// The first failing query's error.
pub async fn counts(db: &DatabaseConnection) -> Result<Counts, DbErr> {
    use outbox_message::Column as O;
    let outbox = || outbox_message::Entity::find();
    Ok(Counts {
        outbox_pending: outbox()
            .filter(O::PublishedAt.is_null())
            .filter(O::DeadAt.is_null())
            .count(db)
            .await?,
        outbox_published: outbox()
            .filter(O::PublishedAt.is_not_null())
            .count(db)
            .await?,
        outbox_dead: outbox().filter(O::DeadAt.is_not_null()).count(db).await?,
        inbox_processed: inbox_message::Entity::find()
            .filter(inbox_message::Column::ProcessedAt.is_not_null())
            .count(db)
            .await?,
        inbox_claimed: inbox_message::Entity::find()
            .filter(inbox_message::Column::ProcessedAt.is_null())
            .count(db)
            .await?,
        dead_letters: dead_letter::Entity::find()
            .filter(dead_letter::Column::ReplayedAt.is_null())
            .count(db)
            .await?,
    })
}
