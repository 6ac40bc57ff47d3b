//! The WAL relay's statements: where the relays of a slot durably got to,
//! which ordering keys wait behind rows in the table, and what a published
//! window leaves in the database (in one transaction: the events handed to
//! the table, dead letters, the minute's count and the relay's position).
//! The relay's replication stream and publishing are `worker::relay::wal`'s.

use std::collections::{HashMap, HashSet};

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

/// Where the relays of a slot durably got to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position {
    /// The end of the last window published whole (an LSN as a number):
    /// a session starts there, and the server skips what committed before.
    pub lsn: Option<u64>,
    /// A transaction after `lsn` published in part.
    pub partial: Option<Partial>,
}

/// A transaction the relay published in part: it is decoded again from its
/// start after a restart (the slot is confirmed only at commits), and its
/// first `messages` seawall messages are skipped then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partial {
    /// The transaction's commit position (pgoutput's `final_lsn`).
    pub commit: u64,
    /// How many of its seawall messages, in the order decoded, are done:
    /// their events published or handed to the table (a piece ends at a
    /// message, so a message is the unit).
    pub messages: u64,
}

/// Where the relays of `slot` durably got to.
///
/// # Errors
/// The database error.
pub async fn position(db: &DatabaseConnection, slot: &str) -> Result<Position, DbErr> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            // A position past the server's WAL is another cluster's
            // (a restored dump): starting there would skip events.
            "SELECT lsn, txn_lsn, txn_messages FROM wal_relay_position WHERE slot = $1 \
             AND lsn <= pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')",
            [slot.into()],
        ))
        .await?;
    let Some(row) = row else {
        return Ok(Position::default());
    };
    let number = |v: i64| u64::try_from(v).unwrap_or(0);
    let lsn = number(row.try_get::<i64>("", "lsn")?);
    let commit = row.try_get::<Option<i64>>("", "txn_lsn")?.map(number);
    let messages = number(row.try_get::<i64>("", "txn_messages")?);
    Ok(Position {
        // 0: the slot's row, made before any window was recorded.
        lsn: (lsn > 0).then_some(lsn),
        // A transaction at or before `lsn` is never sent again.
        partial: commit
            .filter(|&commit| commit > lsn && messages > 0)
            .map(|commit| Partial { commit, messages }),
    })
}

/// Takes `slot`'s relaying over for a session that has just taken the slot:
/// bumps the generation kept with the slot's position and returns it, with
/// the loss of a slot remade since the last session recorded
/// ([`super::slot::prepare`] looks for it too, but a session may start
/// without it: a failed check, a standby taking over). The session records
/// windows only while the generation is its own ([`record_window`]), and
/// stops once [`holds`] says it moved on.
///
/// # Errors
/// The database error.
pub async fn take_over(
    db: &DatabaseConnection,
    slot: &str,
) -> Result<(i64, Option<super::slot::SlotLoss>), DbErr> {
    let txn = db.begin().await?;
    // A holder frozen inside its record holds the row: wait a bounded
    // time, then this session ends and tries again.
    txn.execute_unprepared("SET LOCAL lock_timeout = '5s'")
        .await?;
    // Before the generation moves: the check holds only while it is the
    // one that recorded.
    let loss = super::slot::remade(&txn, slot).await?;
    // Never the same number twice, even after the row was dropped with
    // its slot and made again: at least the clock's microseconds.
    let row = txn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "INSERT INTO wal_relay_position (slot, lsn, generation) VALUES ($1, 0, \
                 (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) \
             ON CONFLICT (slot) DO UPDATE SET generation = GREATEST( \
                 wal_relay_position.generation + 1, \
                 (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) \
             RETURNING generation",
            [slot.into()],
        ))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("wal_relay_position".into()))?;
    let generation = row.try_get("", "generation")?;
    txn.commit().await?;
    Ok((generation, loss))
}

/// Whether the session of `generation` still holds `slot`: no other session
/// took it over since.
///
/// # Errors
/// The database error.
pub async fn holds(db: &DatabaseConnection, slot: &str, generation: i64) -> Result<bool, DbErr> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT generation FROM wal_relay_position WHERE slot = $1",
            [slot.into()],
        ))
        .await?;
    Ok(match row {
        Some(row) => row.try_get::<i64>("", "generation")? == generation,
        None => false,
    })
}

/// What the synchronous standbys of the server have of its WAL, for the
/// relay's gate: PostgreSQL decodes a commit once it is flushed locally,
/// before a synchronous standby has it, and a failover to that standby
/// would lose a transaction whose events were already published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standbys {
    /// `synchronous_standby_names` is set: commits wait for standbys, and
    /// so must the relay.
    pub required: bool,
    /// The lowest position the connected synchronous (or quorum) physical
    /// standbys have flushed; `None` while none is connected. Logical
    /// walsenders (a relay's own among them) are left out: a failover never
    /// promotes one, and a relay waiting on its own confirmation would wait
    /// for good. With `ANY k` this waits for the slowest member, not the
    /// k-th: never too early, sometimes later than needed.
    pub flushed: Option<u64>,
    /// The server's own flushed position now: past the commit of any
    /// transaction already decoded.
    pub local: u64,
    /// The slot is held by the replication connection named `application`:
    /// the pool reached the server the relay streams from. After a
    /// failover behind a proxy the pool reaches the new leader, whose
    /// standbys say nothing about what the old one sent.
    pub held: bool,
    /// The role may read other roles' `pg_stat_replication` rows
    /// (`pg_read_all_stats`); without it every standby looks disconnected.
    pub visible: bool,
}

/// Reads [`Standbys`] on the server `db` writes to, for the relay holding
/// `slot` through a replication connection named `application`.
///
/// # Errors
/// The database error (a server in recovery cannot tell its flush position).
pub async fn standbys(
    db: &DatabaseConnection,
    slot: &str,
    application: &str,
) -> Result<Standbys, DbErr> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT current_setting('synchronous_standby_names') <> '' AS required, \
                    pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::bigint AS local, \
                    (SELECT pg_wal_lsn_diff(min(flush_lsn), '0/0')::bigint FROM pg_stat_replication \
                      WHERE sync_state IN ('sync', 'quorum') \
                        AND pid NOT IN (SELECT active_pid FROM pg_replication_slots \
                                         WHERE slot_type = 'logical' AND active_pid IS NOT NULL)) AS flushed, \
                    EXISTS (SELECT 1 FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid \
                             WHERE s.slot_name = $1 AND a.application_name = $2) AS held, \
                    pg_has_role('pg_read_all_stats', 'USAGE') AS visible",
            [slot.into(), application.into()],
        ))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("pg_stat_replication".into()))?;
    let number = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(Standbys {
        required: row.try_get("", "required")?,
        flushed: row.try_get::<Option<i64>>("", "flushed")?.map(number),
        local: number(row.try_get("", "local")?),
        held: row.try_get("", "held")?,
        visible: row.try_get("", "visible")?,
    })
}

/// `synchronous_standby_names` now, on the server `db` writes to, and
/// whether a physical standby is a synchronous one (`sync_state = 'sync'`,
/// no logical walsender): a relay that stepped aside as a synchronous
/// standby waits for either to change.
///
/// # Errors
/// The database error.
pub async fn synchronous_standbys(db: &DatabaseConnection) -> Result<(String, bool), DbErr> {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT current_setting('synchronous_standby_names') AS names, \
                    EXISTS (SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync' \
                              AND pid NOT IN (SELECT active_pid FROM pg_replication_slots \
                                               WHERE slot_type = 'logical' AND active_pid IS NOT NULL)) AS physical",
        ))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("synchronous_standby_names".into()))?;
    Ok((row.try_get("", "names")?, row.try_get("", "physical")?))
}

/// `synchronous_standby_names` when the walsender streaming `slot` (a
/// relay's own) is a synchronous standby (`sync_state = 'sync'`): the
/// setting matches its `application_name` (`*` does) and it won the
/// priority. Commits then wait for the relay, whose own records and gate
/// wait for commits or for a physical standby they no longer wait for:
/// every commit that writes events would hang. `None` otherwise; as a
/// quorum member (`ANY k`) it is harmless, the physical standbys of the
/// quorum answering for it.
///
/// # Errors
/// The database error.
pub async fn synchronous_role(
    db: &DatabaseConnection,
    slot: &str,
) -> Result<Option<String>, DbErr> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT current_setting('synchronous_standby_names') AS names \
             FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid \
             WHERE s.slot_name = $1 AND r.sync_state = 'sync'",
            [slot.into()],
        ))
        .await?;
    row.map(|r| r.try_get("", "names")).transpose()
}

/// Whether the server `db` writes to has a walsender for the replication
/// connection named `application`: a relay whose stream has been silent
/// asks before it gives the session up, since a walsender reading through
/// a long stretch of other WAL sends nothing meanwhile.
///
/// # Errors
/// The database error.
pub async fn walsender_alive(db: &DatabaseConnection, application: &str) -> Result<bool, DbErr> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT count(*) AS n FROM pg_stat_replication WHERE application_name = $1",
            [application.into()],
        ))
        .await?;
    Ok(row
        .map(|r| r.try_get::<i64>("", "n"))
        .transpose()?
        .unwrap_or(0)
        > 0)
}

/// Most values bound in one statement: PostgreSQL takes at most 65,535,
/// and a window may hand over more events (or name more keys) than that.
const BINDS_PER_STATEMENT: usize = 10_000;

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
    let keys: Vec<&str> = keys.into_iter().collect();
    let mut held = HashSet::new();
    for chunk in keys.chunks(BINDS_PER_STATEMENT) {
        let found: Vec<Option<String>> = outbox_message::Entity::find()
            .select_only()
            .column(outbox_message::Column::OrderingKey)
            .distinct()
            .filter(OutboxState::Pending.condition())
            .filter(outbox_message::Column::OrderingKey.is_in(chunk.iter().copied()))
            .into_tuple()
            .all(db)
            .await?;
        held.extend(found.into_iter().flatten());
    }
    Ok(held)
}

/// What a published window moves the relay's durable position to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reached {
    /// The end of the window's last whole transaction, if it had one.
    pub end: Option<i64>,
    /// The transaction the window ends inside, and how many of its messages
    /// are done with it; `None` when the window ends at a commit.
    pub partial: Option<Partial>,
}

/// The relay session recording a window: its slot, and the generation it
/// took the slot with ([`take_over`]).
#[derive(Debug, Clone, Copy)]
pub struct Holder<'a> {
    /// The slot.
    pub slot: &'a str,
    /// The session's generation.
    pub generation: i64,
}

/// Writes the rows handed to the table, the dead letters of undecodable
/// messages, the minute's count of `published` events and how far the
/// window got (`reached`) as the slot's durable position, in one
/// transaction, and returns `true`; records nothing and returns `false`
/// when another session has taken the slot over. A row already there (a
/// window that went again after a crash) is left as it is; the count of
/// such a window is counted again.
///
/// # Errors
/// The database error; nothing of the window is recorded then.
pub async fn record_window(
    db: &DatabaseConnection,
    holder: Holder<'_>,
    published: usize,
    rows: Vec<(outbox_message::ActiveModel, WalEvent)>,
    undecodable: &[(Vec<u8>, String)],
    reached: Reached,
) -> Result<bool, DbErr> {
    let moved = reached.end.is_some() || reached.partial.is_some();
    if published == 0 && rows.is_empty() && undecodable.is_empty() && !moved {
        return Ok(true);
    }
    let Holder { slot, generation } = holder;
    let txn = db.begin().await?;
    // Locked to the end: a session taking the slot over waits for this
    // record, and one that took it already makes this one record nothing.
    let current = txn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT generation FROM wal_relay_position WHERE slot = $1 FOR UPDATE",
            [slot.into()],
        ))
        .await?
        .map(|row| row.try_get::<i64>("", "generation"))
        .transpose()?;
    if current != Some(generation) {
        txn.rollback().await?;
        return Ok(false);
    }
    if published > 0 {
        rollup::add(&txn, Tally::Published, Utc::now(), published as u64).await?;
    }
    if moved {
        record_position(&txn, slot, reached).await?;
    }
    let rows = without_clashes(&txn, rows).await?;
    for batch in crate::outbox::insert_batches(rows) {
        outbox_message::Entity::insert_many(batch)
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
    txn.commit().await?;
    Ok(true)
}

/// Moves `slot`'s durable position to what the window `reached`, in the
/// window's record.
async fn record_position(
    txn: &sea_orm::DatabaseTransaction,
    slot: &str,
    reached: Reached,
) -> Result<(), DbErr> {
    let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    txn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        // The row is there: the session made it when it took the slot.
        // Once the recorded position has caught up with the slot's,
        // every position the slot holds was recorded first: from then
        // on a slot ahead of it was remade (`slot::prepare`).
        "UPDATE wal_relay_position SET lsn = GREATEST(lsn, COALESCE($2, 0)), \
             txn_lsn = $3, txn_messages = $4, \
             recorded_generation = CASE WHEN GREATEST(lsn, COALESCE($2, 0)) >= COALESCE( \
                 (SELECT pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint \
                    FROM pg_replication_slots WHERE slot_name = $1), 0) \
               THEN generation ELSE recorded_generation END \
         WHERE slot = $1",
        [
            slot.into(),
            reached.end.into(),
            reached.partial.map(|p| to_i64(p.commit)).into(),
            reached.partial.map_or(0, |p| to_i64(p.messages)).into(),
        ],
    ))
    .await?;
    Ok(())
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
    let mut existing: HashMap<String, (String, Vec<u8>)> = HashMap::new();
    for chunk in ids.chunks(BINDS_PER_STATEMENT) {
        let found: Vec<(String, String, Vec<u8>)> = outbox_message::Entity::find()
            .select_only()
            .column(outbox_message::Column::MessageId)
            .column(outbox_message::Column::Subject)
            .column(outbox_message::Column::Payload)
            .filter(outbox_message::Column::MessageId.is_in(chunk.iter().copied()))
            .into_tuple()
            .all(txn)
            .await?;
        existing.extend(
            found
                .into_iter()
                .map(|(id, subject, payload)| (id, (subject, payload))),
        );
    }
    let mut fresh = Vec::new();
    for (row, event) in rows {
        match existing.get(&event.message_id) {
            None => fresh.push(row),
            Some((subject, payload))
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
