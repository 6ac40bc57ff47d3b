//! How claims end outside the happy path: quarantined by the sweeper, given
//! up by a consumer, released by an operator. Each writes the claim row and
//! what goes with it (a dead letter) in one transaction, so no claim row is
//! left open with nobody to finish it.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, TransactionTrait};

use entity::inbox_message::{self, Column};

use super::QUARANTINE_REASON;
use crate::dead_letter::{DeadLetter, Recorded};
use crate::state::ClaimState;

/// Marks an abandoned claim quarantined and writes its dead letter, in one
/// transaction and only if it is still open and expired (several sweepers
/// may try at once; one wins, the others change nothing).
///
/// Returns whether this call quarantined it.
///
/// # Errors
/// Database errors.
pub async fn quarantine(
    db: &DatabaseConnection,
    row: &inbox_message::Model,
) -> Result<bool, DbErr> {
    let now = Utc::now();
    let txn = db.begin().await?;
    let res = inbox_message::Entity::update_many()
        .col_expr(Column::QuarantinedAt, Expr::value(now))
        .col_expr(
            Column::LeaseUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(Column::Id.eq(row.id))
        .filter(Column::Attempts.eq(row.attempts))
        .filter(ClaimState::open())
        .exec(&txn)
        .await?;
    if res.rows_affected != 1 {
        txn.rollback().await?;
        return Ok(false);
    }
    let headers = std::collections::BTreeMap::from([(
        crate::envelope::HEADER_MSG_ID.to_owned(),
        row.message_id.clone(),
    )]);
    let error = match &row.result {
        Some(last) => format!(
            "{QUARANTINE_REASON}; {} attempts; last: {last}",
            row.attempts
        ),
        None => format!("{QUARANTINE_REASON}; {} attempts", row.attempts),
    };
    DeadLetter {
        consumer: &row.consumer,
        message_id: Some(&row.message_id),
        subject: row.subject.as_deref().unwrap_or(""),
        payload: row.payload.as_deref().unwrap_or_default(),
        headers: &headers,
        error: &error,
        deliveries: row.attempts,
    }
    .record(&txn)
    .await?;
    txn.commit().await?;
    tracing::warn!(message_id = %row.message_id, consumer = %row.consumer, attempts = row.attempts, "claim quarantined");
    Ok(true)
}

/// Gives a claimed message up for good: quarantines its claim row, if one
/// is still open, and records `letter`, in one transaction. A consumer calls
/// this instead of [`DeadLetter::record`] for messages of a claim path, so no
/// claim row outlives its message unfinished (nobody would ever revisit it).
///
/// # Errors
/// Database errors; nothing is written then, and the message must not be
/// terminated.
pub async fn give_up(db: &DatabaseConnection, letter: &DeadLetter<'_>) -> Result<Recorded, DbErr> {
    let txn = db.begin().await?;
    if let Some(message_id) = letter.message_id {
        let already = inbox_message::Entity::find()
            .filter(Column::MessageId.eq(message_id))
            .filter(Column::Consumer.eq(letter.consumer))
            .filter(Column::QuarantinedAt.is_not_null())
            .one(&txn)
            .await?;
        if already.is_some() {
            // Quarantined by the sweeper, whose dead letter is written.
            txn.commit().await?;
            return Ok(Recorded::AlreadyOpen);
        }
        inbox_message::Entity::update_many()
            .col_expr(Column::QuarantinedAt, Expr::value(Utc::now()))
            .col_expr(
                Column::LeaseUntil,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .filter(Column::MessageId.eq(message_id))
            .filter(Column::Consumer.eq(letter.consumer))
            .filter(ClaimState::open())
            .exec(&txn)
            .await?;
    }
    let recorded = letter.record(&txn).await?;
    txn.commit().await?;
    Ok(recorded)
}

/// What [`release`] found.
#[derive(Debug)]
pub enum Release {
    /// No marker with that id.
    NotFound,
    /// The marker is processed: there is no claim to release.
    Processed,
    /// The claim is held under a lease that has not run out: its effect may
    /// be running right now, and releasing it would let a redelivery
    /// perform it a second time. Refused unless forced.
    LiveLease {
        /// When the lease runs out.
        until: DateTime<Utc>,
        /// The instance holding it.
        claimed_by: Option<String>,
    },
    /// Released; the marker as it is now (boxed: a marker carries its
    /// message's payload).
    Released(Box<inbox_message::Model>),
}

/// Releases a stuck claim so the next delivery or replay takes it (an
/// operator's action): an open claim loses its lease; a quarantined one (a
/// person decided the effect did not happen) is un-quarantined with a fresh
/// attempt count. Its message must then be replayed: a quarantined claim's
/// message was terminated at the broker.
///
/// A claim under a live lease is refused ([`Release::LiveLease`]) unless
/// `force`: the page an operator acted on may have been read from a replica
/// that showed the lease expired, while its holder is performing the effect.
/// The check is repeated in the update itself, so a claim taken between the
/// read and the write is not released either.
///
/// # Errors
/// Database errors.
pub async fn release(db: &DatabaseConnection, id: i64, force: bool) -> Result<Release, DbErr> {
    let now = Utc::now();
    let Some(row) = inbox_message::Entity::find_by_id(id).one(db).await? else {
        return Ok(Release::NotFound);
    };
    if row.processed_at.is_some() {
        return Ok(Release::Processed);
    }
    let live = |row: &inbox_message::Model| match row.lease_until {
        Some(until) if row.quarantined_at.is_none() && until > now && !force => {
            Some(Release::LiveLease {
                until,
                claimed_by: row.claimed_by.clone(),
            })
        }
        _ => None,
    };
    if let Some(refused) = live(&row) {
        return Ok(refused);
    }
    let mut update = inbox_message::Entity::update_many()
        .col_expr(
            Column::LeaseUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(Column::ClaimedBy, Expr::value(Option::<String>::None));
    if row.quarantined_at.is_some() {
        update = update
            .col_expr(
                Column::QuarantinedAt,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .col_expr(Column::Attempts, Expr::value(0));
    }
    // The row as it was read: a claim quarantined (or un-quarantined) in
    // between is not what the operator released.
    let quarantined = if row.quarantined_at.is_some() {
        Column::QuarantinedAt.is_not_null()
    } else {
        Column::QuarantinedAt.is_null()
    };
    update = update
        .filter(Column::Id.eq(id))
        .filter(Column::ProcessedAt.is_null())
        .filter(quarantined);
    if !force {
        update = update.filter(
            sea_orm::Condition::any()
                .add(Column::LeaseUntil.is_null())
                .add(Column::LeaseUntil.lte(now))
                .add(Column::QuarantinedAt.is_not_null()),
        );
    }
    let changed = update.exec(db).await?.rows_affected;
    let after = inbox_message::Entity::find_by_id(id).one(db).await?;
    Ok(match after {
        None => Release::NotFound,
        Some(row) if row.processed_at.is_some() => Release::Processed,
        Some(row) if changed == 0 => live(&row).unwrap_or(Release::Released(Box::new(row))),
        Some(row) => {
            tracing::info!(id, message_id = %row.message_id, consumer = %row.consumer, force, "claim released by an operator");
            Release::Released(Box::new(row))
        }
    })
}

/// The id of `consumer`'s quarantined claim on `message_id`, if there is
/// one. A replay of such a message would only be terminated again: the claim
/// has to be released first (a person decided the effect did not happen).
///
/// # Errors
/// Database errors.
pub async fn quarantined(
    db: &DatabaseConnection,
    message_id: &str,
    consumer: &str,
) -> Result<Option<i64>, DbErr> {
    Ok(inbox_message::Entity::find()
        .filter(Column::MessageId.eq(message_id))
        .filter(Column::Consumer.eq(consumer))
        .filter(ClaimState::Quarantined.condition(Utc::now()))
        .one(db)
        .await?
        .map(|row| row.id))
}
