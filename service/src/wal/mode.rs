//! The outbox mode of a database: WAL mode from the moment its first
//! WAL-mode process records the slot that relays it (the switch), table
//! mode otherwise. Table-mode writers check it inside their transactions,
//! under a lock the switch takes exclusively, so a rolling switch cannot
//! have writers of both modes reorder a key.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait};

use super::slot::SlotError;

/// The slots relaying this database's outbox: those a WAL-mode process
/// recorded (in `wal_relay_position`) that still exist. The database is in
/// WAL mode while there is one; dropping the slot (`seawall relay
/// --drop-slot`) ends it.
///
/// # Errors
/// The database error.
pub async fn wal_slots<C: ConnectionTrait>(db: &C) -> Result<Vec<String>, DbErr> {
    let rows = db
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT p.slot AS value FROM wal_relay_position p \
             JOIN pg_replication_slots s ON s.slot_name = p.slot \
             WHERE s.database = current_database() ORDER BY p.slot",
        ))
        .await?;
    rows.iter().map(|row| row.try_get("", "value")).collect()
}

/// The advisory lock that orders the switch to WAL mode after every
/// table-mode transaction that checked the mode: table-mode writers hold it
/// shared until they commit, and the switch takes it exclusively
/// (advisory locks are the database's own, so this key is too).
const MODE_LOCK: i64 = 0x005E_A3A1_10DE;

/// Checks, inside a table-mode writer's transaction `txn`, that the
/// database is not in WAL mode, and holds [`MODE_LOCK`] shared until `txn`
/// ends: a switch to WAL mode (the first WAL-mode process's [`super::slot::prepare`])
/// waits for `txn` to commit, so no row written after the switch can be
/// published ahead of a WAL event its key committed before it. Returns the
/// slot relaying the database if it is in WAL mode. Under READ COMMITTED
/// (the inbox's) it reads after the lock; a REPEATABLE READ transaction
/// would read its first snapshot, so it must call this first.
///
/// # Errors
/// The database error.
pub async fn table_mode_guard<C: ConnectionTrait>(txn: &C) -> Result<Option<String>, DbErr> {
    // The lock and the read are two queries of one function: a single
    // query that waited for the lock would read with its snapshot from
    // before the switch it waited for (see the migration that makes it).
    let row = txn
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            format!("SELECT fn_outbox_table_mode_guard({MODE_LOCK}) AS slot"),
        ))
        .await?;
    match row {
        Some(row) => row.try_get("", "slot"),
        None => Ok(None),
    }
}

/// Refuses a process that would write events to the table on a database in
/// WAL mode ([`SlotError::InWalMode`]): the mode is the database's, so a
/// rolling switch cannot have writers of both modes reorder a key.
///
/// # Errors
/// [`SlotError::InWalMode`] naming the slot, or the database error.
pub async fn check_table_mode(db: &DatabaseConnection) -> Result<(), SlotError> {
    match wal_slots(db).await?.into_iter().next() {
        Some(slot) => Err(SlotError::InWalMode(slot)),
        None => Ok(()),
    }
}

/// Puts the database in WAL mode: its row in `wal_relay_position` says
/// which slot relays it (a session's position and generation go in it
/// later). Written under [`MODE_LOCK`] taken exclusively, so it waits for
/// every table-mode transaction that checked the mode before
/// ([`table_mode_guard`]), and those after it see WAL mode.
pub(super) async fn switch_to_wal_mode(db: &DatabaseConnection, slot: &str) -> Result<(), DbErr> {
    let switched = super::slot::one_text(
        db,
        &format!("SELECT count(*)::text AS value FROM wal_relay_position WHERE slot = '{slot}'"),
    )
    .await?;
    if switched != "0" {
        return Ok(());
    }
    let txn = db.begin().await?;
    // Queued behind a long table-mode transaction, the switch would hold
    // every new table-mode writer behind it: it gives up after a while,
    // and start-up tries again.
    txn.execute_unprepared("SET LOCAL lock_timeout = '5s'")
        .await?;
    txn.execute_unprepared(&format!("SELECT pg_advisory_xact_lock({MODE_LOCK})"))
        .await?;
    // Its position is where the slot starts, checkable from the start
    // (`recorded_generation` is the row's first generation, 0): a slot
    // remade before any relay recorded a window is a loss too.
    txn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO wal_relay_position (slot, lsn, recorded_generation) VALUES ($1, \
           COALESCE((SELECT pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint \
                       FROM pg_replication_slots WHERE slot_name = $1), 0), 0) \
         ON CONFLICT (slot) DO NOTHING",
        [slot.into()],
    ))
    .await?;
    txn.commit().await
}
