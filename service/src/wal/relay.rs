//! The WAL relay's statements: where the relays of a slot durably got to,
//! which ordering keys wait behind rows in the table, and what a published
//! window leaves in the database (in one transaction: the events handed to
//! the table, dead letters, the minute's count and the relay's position).
//! The relay's replication stream and publishing are `worker::relay::wal`'s.

use std::collections::HashSet;

use chrono::Utc;
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr,
    EntityTrait, QueryFilter, QuerySelect, Statement, TransactionTrait,
};

use entity::{dead_letter, outbox_message};

use super::WalEvent;
use crate::rollup::{self, Tally};
use crate::state::OutboxState;

/// The consumer named on the WAL relay's dead letters: logical messages it
/// could not decode, and events reusing another event's message id.
pub const UNDECODABLE_CONSUMER: &str = "wal-relay";

/// Where the relays of `slot` durably got to (an LSN as a number), if
/// anywhere.
///
/// # Errors
/// The database error.
pub async fn position(db: &DatabaseConnection, slot: &str) -> Result<Option<u64>, DbErr> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            // A position past the server's WAL is another cluster's
            // (a restored dump): starting there would skip events.
            "SELECT lsn FROM wal_relay_position WHERE slot = $1 \
             AND lsn <= pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')",
            [slot.into()],
        ))
        .await?;
    Ok(match row {
        Some(row) => Some(u64::try_from(row.try_get::<i64>("", "lsn")?).unwrap_or(0)),
        None => None,
    })
}

/// The ordering keys of `events` with pending rows in `outbox_message`,
/// written by a relay or anyone else: their events must queue behind those
/// rows (a dead row holds nothing, as in table mode). Asked per window, for
/// its keys only.
///
/// # Errors
/// The database error.
pub async fn held_keys(
    db: &DatabaseConnection,
    events: &[WalEvent],
) -> Result<HashSet<String>, DbErr> {
    let keys: HashSet<&str> = events
        .iter()
        .filter_map(|e| e.ordering_key.as_deref())
        .collect();
    if keys.is_empty() {
        return Ok(HashSet::new());
    }
    let held: Vec<Option<String>> = outbox_message::Entity::find()
        .select_only()
        .column(outbox_message::Column::OrderingKey)
        .distinct()
        .filter(OutboxState::Pending.condition())
        .filter(outbox_message::Column::OrderingKey.is_in(keys))
        .into_tuple()
        .all(db)
        .await?;
    Ok(held.into_iter().flatten().collect())
}

/// Writes the rows handed to the table, the dead letters of undecodable
/// messages, the minute's count of `published` events and the window's
/// `end` as `slot`'s durable position, in one transaction. A row already
/// there (a window that went again after a crash) is left as it is; the
/// count of such a window is counted again.
///
/// # Errors
/// The database error; nothing of the window is recorded then.
pub async fn record_window(
    db: &DatabaseConnection,
    slot: &str,
    published: usize,
    rows: Vec<(outbox_message::ActiveModel, WalEvent)>,
    undecodable: &[(Vec<u8>, String)],
    end: Option<i64>,
) -> Result<(), DbErr> {
    if published == 0 && rows.is_empty() && undecodable.is_empty() {
        return Ok(());
    }
    let txn = db.begin().await?;
    rollup::add(&txn, Tally::Published, Utc::now(), published as u64).await?;
    if let Some(end) = end {
        txn.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "INSERT INTO wal_relay_position (slot, lsn) VALUES ($1, $2) \
             ON CONFLICT (slot) DO UPDATE SET lsn = GREATEST(wal_relay_position.lsn, EXCLUDED.lsn)",
            [slot.into(), end.into()],
        ))
        .await?;
    }
    let rows = without_clashes(&txn, rows).await?;
    for chunk in rows.chunks(crate::outbox::ROWS_PER_INSERT) {
        outbox_message::Entity::insert_many(chunk.to_vec())
            .on_conflict(
                OnConflict::column(outbox_message::Column::MessageId)
                    .do_nothing()
                    .to_owned(),
            )
            .exec_without_returning(&txn)
            .await?;
    }
    for (content, error) in undecodable {
        tracing::error!(%error, bytes = content.len(), "a seawall WAL message could not be decoded; kept as a dead letter");
        dead_letter::Entity::insert(dead_letter::ActiveModel {
            consumer: Set(UNDECODABLE_CONSUMER.into()),
            message_id: Set(None),
            subject: Set(super::PREFIX.into()),
            payload: Set(content.clone()),
            headers: Set(serde_json::json!({})),
            error: Set(error.clone()),
            deliveries: Set(1),
            created_at: Set(Utc::now()),
            replayed_at: Set(None),
            ..Default::default()
        })
        .exec_without_returning(&txn)
        .await?;
    }
    txn.commit().await
}

/// The rows to hand to the table, less those whose message id a row
/// already has: the same event again (a window read twice after a
/// crash) is left as it is, and another event reusing the id (which
/// table mode would have refused at enqueue) is kept as a dead letter
/// instead of being dropped.
async fn without_clashes(
    txn: &sea_orm::DatabaseTransaction,
    rows: Vec<(outbox_message::ActiveModel, WalEvent)>,
) -> Result<Vec<outbox_message::ActiveModel>, DbErr> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<&str> = rows.iter().map(|(_, e)| e.message_id.as_str()).collect();
    let existing: Vec<(String, String, Vec<u8>)> = outbox_message::Entity::find()
        .select_only()
        .column(outbox_message::Column::MessageId)
        .column(outbox_message::Column::Subject)
        .column(outbox_message::Column::Payload)
        .filter(outbox_message::Column::MessageId.is_in(ids))
        .into_tuple()
        .all(txn)
        .await?;
    let mut fresh = Vec::new();
    for (row, event) in rows {
        match existing.iter().find(|(id, _, _)| *id == event.message_id) {
            None => fresh.push(row),
            Some((_, subject, payload))
                if *subject == event.subject && payload[..] == event.payload[..] => {}
            Some(_) => {
                let error = format!(
                    "message id {:?} is already used by another outbox event; this one was not published",
                    event.message_id
                );
                tracing::error!(message_id = %event.message_id, "{error}");
                dead_letter::Entity::insert(dead_letter::ActiveModel {
                    consumer: Set(UNDECODABLE_CONSUMER.into()),
                    message_id: Set(Some(event.message_id.clone())),
                    subject: Set(event.subject.clone()),
                    payload: Set(event.payload.to_vec()),
                    headers: Set(serde_json::to_value(&event.headers)
                        .map_err(|e| DbErr::Json(e.to_string()))?),
                    error: Set(error),
                    deliveries: Set(0),
                    created_at: Set(Utc::now()),
                    replayed_at: Set(None),
                    ..Default::default()
                })
                .exec_without_returning(txn)
                .await?;
            }
        }
    }
    Ok(fresh)
}
