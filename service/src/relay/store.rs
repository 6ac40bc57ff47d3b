//! The relay's database side: claiming, marking and releasing outbox rows.
//!
//! Two ways to own a batch while it is published:
//! - [`lock`] (PostgreSQL, MySQL): `SELECT … FOR UPDATE SKIP LOCKED` in a
//!   transaction that stays open while the batch is published and in which
//!   the rows are then marked published. Concurrent relays take disjoint
//!   batches, each row is written once, and a crashed relay's rows are free
//!   the moment its connection drops.
//! - [`claim`] (SQLite, which has no row locks): a lease (`locked_by`,
//!   `locked_until`) written in a `BEGIN IMMEDIATE` transaction, so a crashed
//!   relay's rows are picked up by another after the lease runs out.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Alias, Expr, ExprTrait, LockBehavior, LockType, Query, SelectStatement};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend,
    DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Select, TransactionTrait,
};

use crate::rollup::{self, Tally};
use crate::state::OutboxState;
use entity::outbox_message::{self, Column};

/// Chrono duration from std, saturating (leases and backoffs are small).
pub fn span(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// The first `limit` rows a relay may publish now: unpublished, not dead,
/// past their backoff, not under someone's live lease, and not queued behind
/// a blocked earlier row of their key, in id order.
fn publishable(now: DateTime<Utc>, limit: u64) -> Select<outbox_message::Entity> {
    outbox_message::Entity::find()
        .filter(OutboxState::Pending.condition())
        .filter(Column::NextAttemptAt.lte(now))
        .filter(
            Condition::any()
                .add(Column::LockedUntil.is_null())
                .add(Column::LockedUntil.lt(now)),
        )
        .filter(
            Condition::any()
                .add(Column::OrderingKey.is_null())
                .add(Expr::not_exists(blocked_head(now))),
        )
        .order_by_asc(Column::Id)
        .limit(limit)
}

/// An earlier pending row of the outer row's key that cannot go now (backing
/// off or under a live lease). Rows behind it must wait anyway; excluding
/// them here keeps them from filling every batch while the head backs off,
/// which would starve every other key and the unkeyed rows. Served by
/// `ix_outbox_message_ordering_key` (ordering_key, id).
fn blocked_head(now: DateTime<Utc>) -> SelectStatement {
    let head = Alias::new("head");
    let outer = outbox_message::Entity;
    Query::select()
        .expr(Expr::val(1))
        .from_as(outer, head.clone())
        .and_where(
            Expr::col((head.clone(), Column::OrderingKey)).equals((outer, Column::OrderingKey)),
        )
        .and_where(Expr::col((head.clone(), Column::Id)).lt(Expr::col((outer, Column::Id))))
        // OutboxState::Pending, on the aliased table.
        .and_where(Expr::col((head.clone(), Column::PublishedAt)).is_null())
        .and_where(Expr::col((head.clone(), Column::DeadAt)).is_null())
        .cond_where(
            Condition::any()
                .add(Expr::col((head.clone(), Column::NextAttemptAt)).gt(now))
                .add(Expr::col((head, Column::LockedUntil)).gte(now)),
        )
        .to_owned()
}

/// Most payload bytes one batch loads: a batch is counted in rows, and 500
/// rows of megabyte events would be half a gigabyte in one relay's memory
/// (a WAL relay handing a NATS outage to the table writes such rows by the
/// thousand). At least one row is taken, whatever its size.
pub const BATCH_BYTES: i64 = 16 << 20;

/// A candidate row: its id, ordering key and payload size.
type Candidate = (i64, Option<String>, i64);

/// The publishable rows' ids, keys and payload sizes (as a signed 64-bit
/// integer on each backend), up to `limit`. PostgreSQL reads a toasted
/// value's size from its header, without reading the value.
fn candidates(
    backend: DbBackend,
    now: DateTime<Utc>,
    limit: u64,
) -> Select<outbox_message::Entity> {
    let size = match backend {
        DbBackend::Postgres => "octet_length(payload)::int8",
        DbBackend::MySql => "CAST(LENGTH(payload) AS SIGNED)",
        // A blob's bytes even for a value written by hand as text.
        _ => "length(CAST(payload AS BLOB))",
    };
    publishable(now, limit)
        .select_only()
        .column(Column::Id)
        .column(Column::OrderingKey)
        .expr(Expr::cust(size))
}

/// The candidates that fit in [`BATCH_BYTES`], from the first (which always
/// does); whether some were left out. A prefix in id order: a key's rows
/// stay an unbroken prefix of its key.
fn fit(candidates: Vec<Candidate>) -> (Vec<(i64, Option<String>)>, bool) {
    let mut bytes = 0i64;
    let mut fitting = Vec::with_capacity(candidates.len());
    let total = candidates.len();
    for (id, key, size) in candidates {
        bytes = bytes.saturating_add(size);
        if !fitting.is_empty() && bytes > BATCH_BYTES {
            break;
        }
        fitting.push((id, key));
    }
    let cut = fitting.len() < total;
    (fitting, cut)
}

/// The rows a relay round took, and whether it left publishable rows out
/// for their bytes (the next round is then due at once, as after a full
/// batch).
#[derive(Debug, Default)]
pub struct Taken {
    /// The rows, whole, in id order.
    pub rows: Vec<outbox_message::Model>,
    /// Whether [`BATCH_BYTES`] cut the batch short.
    pub cut: bool,
}

/// Locks up to `limit` publishable rows in `txn` (`FOR UPDATE SKIP LOCKED`),
/// at most [`BATCH_BYTES`] of payloads of them, and returns them whole;
/// they stay this relay's until `txn` ends.
///
/// The same ordering-key rule as [`claim`] applies; rows it drops (and
/// those past the byte bound) stay locked until `txn` ends, which only
/// delays them to the next round.
pub async fn lock(txn: &DatabaseTransaction, limit: u64) -> Result<Taken, DbErr> {
    let locked: Vec<Candidate> = candidates(txn.get_database_backend(), Utc::now(), limit)
        .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
        .into_tuple()
        .all(txn)
        .await?;
    let (fitting, cut) = fit(locked);
    let ids = keep_key_prefixes(txn, fitting).await?;
    let rows = whole(txn, ids, None).await?;
    // A cut batch that kept nothing (its rows wait behind another relay's
    // rows of their keys) is no reason to come straight back.
    let cut = cut && !rows.is_empty();
    Ok(Taken { rows, cut })
}

/// The rows `ids` whole, in id order (those `owner` holds by lease, when
/// given).
async fn whole<C: ConnectionTrait>(
    conn: &C,
    ids: Vec<i64>,
    owner: Option<&str>,
) -> Result<Vec<outbox_message::Model>, DbErr> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    outbox_message::Entity::find()
        .filter(Column::Id.is_in(ids))
        .filter(held_by(owner))
        .order_by_asc(Column::Id)
        .all(conn)
        .await
}

/// Claims up to `limit` publishable rows for `me` until `now + lease`, at
/// most [`BATCH_BYTES`] of payloads of them (SQLite, where `BEGIN IMMEDIATE`
/// serialises claimers; the other backends lock rows with [`lock`] instead).
///
/// A row with an ordering key is only claimed together with every earlier
/// unpublished row of its key, so a key's rows are never in flight from two
/// relays at once and never overtake an earlier row that is leased elsewhere,
/// backing off, or still being claimed by a concurrent transaction.
pub async fn claim(
    db: &DatabaseConnection,
    me: &str,
    lease: Duration,
    limit: u64,
) -> Result<Taken, DbErr> {
    let now = Utc::now();
    let txn = db.begin_with_options(crate::db::BEGIN_IMMEDIATE).await?;
    let sized = candidates(DbBackend::Sqlite, now, limit);
    let (fitting, cut) = fit(sized.into_tuple().all(&txn).await?);
    let ids = keep_key_prefixes(&txn, fitting).await?;
    if ids.is_empty() {
        txn.commit().await?;
        return Ok(Taken::default());
    }
    outbox_message::Entity::update_many()
        .col_expr(Column::LockedBy, Expr::value(me))
        .col_expr(Column::LockedUntil, Expr::value(now + span(lease)))
        .filter(Column::Id.is_in(ids.clone()))
        .exec(&txn)
        .await?;
    txn.commit().await?;
    let rows = whole(db, ids, Some(me)).await?;
    Ok(Taken { rows, cut })
}

/// Drops keyed candidates that do not form an unbroken prefix of their key's
/// unpublished rows.
async fn keep_key_prefixes<C: sea_orm::ConnectionTrait>(
    conn: &C,
    candidates: Vec<(i64, Option<String>)>,
) -> Result<Vec<i64>, DbErr> {
    let keys: HashSet<&String> = candidates.iter().filter_map(|(_, k)| k.as_ref()).collect();
    if keys.is_empty() {
        return Ok(candidates.into_iter().map(|(id, _)| id).collect());
    }
    let max_id = candidates.iter().map(|(id, _)| *id).max().unwrap_or(0);
    let pending: Vec<(i64, Option<String>)> = outbox_message::Entity::find()
        .select_only()
        .column(Column::Id)
        .column(Column::OrderingKey)
        .filter(Column::OrderingKey.is_in(keys.iter().map(|k| k.as_str())))
        .filter(OutboxState::Pending.condition())
        .filter(Column::Id.lte(max_id))
        .order_by_asc(Column::Id)
        .into_tuple()
        .all(conn)
        .await?;
    let mine: HashSet<i64> = candidates.iter().map(|(id, _)| *id).collect();
    // For each key, the candidates up to the first pending row that is not ours.
    let mut open: HashMap<&str, bool> = HashMap::new();
    let mut allowed = HashSet::new();
    for (id, key) in &pending {
        let Some(key) = key.as_deref() else { continue };
        let still_open = open.entry(key).or_insert(true);
        if *still_open && mine.contains(id) {
            allowed.insert(*id);
        } else {
            *still_open = false;
        }
    }
    Ok(candidates
        .into_iter()
        .filter(|(id, key)| key.is_none() || allowed.contains(id))
        .map(|(id, _)| id)
        .collect())
}

/// Restricts an update to rows `owner` still holds by lease; `None` when the
/// caller holds them by row lock in its own transaction.
fn held_by(owner: Option<&str>) -> Condition {
    owner.map_or_else(Condition::all, |me| {
        Condition::all().add(Column::LockedBy.eq(me))
    })
}

/// Marks rows JetStream acknowledged as published (if `owner` still holds
/// them) and counts them in the minute's throughput, on `txn`.
pub async fn mark_published(
    txn: &DatabaseTransaction,
    owner: Option<&str>,
    ids: Vec<i64>,
) -> Result<u64, DbErr> {
    if ids.is_empty() {
        return Ok(0);
    }
    let now = Utc::now();
    // On PostgreSQL the ids travel as one array: the statement's text is
    // the same for every batch, so it is prepared once, where `IN` with a
    // placeholder per id was parsed and planned anew for each batch size.
    let ids = match txn.get_database_backend() {
        DbBackend::Postgres => Expr::cust_with_values("id = ANY($1::bigint[])", [id_array(&ids)]),
        _ => Expr::col(Column::Id).is_in(ids),
    };
    let res = outbox_message::Entity::update_many()
        .col_expr(Column::PublishedAt, Expr::value(now))
        .col_expr(Column::LockedBy, Expr::value(Option::<String>::None))
        .col_expr(
            Column::LockedUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(ids)
        .filter(held_by(owner))
        .exec(txn)
        .await?;
    rollup::add(txn, Tally::Published, now, res.rows_affected).await?;
    Ok(res.rows_affected)
}

/// `ids` as a PostgreSQL array literal (`{1,2,3}`), bound as one value.
fn id_array(ids: &[i64]) -> String {
    let mut text = String::with_capacity(ids.len() * 8 + 2);
    text.push('{');
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&id.to_string());
    }
    text.push('}');
    text
}

/// Records a failed publish: the error, a backoff, and, when `counted`,
/// one more attempt and `dead_at` once the attempt limit is reached. A
/// failure while NATS is unreachable is not counted: an outage is not the
/// row's fault, and would otherwise kill every row it outlasts.
pub async fn mark_failed<C: ConnectionTrait>(
    db: &C,
    owner: Option<&str>,
    row: &outbox_message::Model,
    error: &str,
    retry_after: Duration,
    max_attempts: i32,
    counted: bool,
) -> Result<bool, DbErr> {
    let now = Utc::now();
    let attempts = row.attempts.saturating_add(1);
    let dead = counted && attempts >= max_attempts;
    outbox_message::Entity::update_many()
        .col_expr(
            Column::Attempts,
            Expr::col(Column::Attempts).add(i32::from(counted)),
        )
        .col_expr(Column::LastError, Expr::value(error))
        .col_expr(Column::NextAttemptAt, Expr::value(now + span(retry_after)))
        .col_expr(Column::LockedBy, Expr::value(Option::<String>::None))
        .col_expr(
            Column::LockedUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(Column::DeadAt, Expr::value(dead.then_some(now)))
        .filter(Column::Id.eq(row.id))
        .filter(held_by(owner))
        .exec(db)
        .await?;
    Ok(dead)
}

/// Gives rows back without counting an attempt (a key's later rows after an
/// earlier one failed, or rows left when shutting down).
pub async fn release(db: &DatabaseConnection, me: &str, ids: Vec<i64>) -> Result<(), DbErr> {
    if ids.is_empty() {
        return Ok(());
    }
    outbox_message::Entity::update_many()
        .col_expr(Column::LockedBy, Expr::value(Option::<String>::None))
        .col_expr(
            Column::LockedUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(Column::Id.is_in(ids))
        .filter(Column::LockedBy.eq(me))
        .exec(db)
        .await?;
    Ok(())
}

/// Rows not yet published and not dead: what "drained" waits for.
pub async fn pending_count(db: &DatabaseConnection) -> Result<u64, DbErr> {
    use sea_orm::PaginatorTrait;
    outbox_message::Entity::find()
        .filter(OutboxState::Pending.condition())
        .count(db)
        .await
}
