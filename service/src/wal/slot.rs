//! The WAL relay's slot as the database sees it: its name, its creation and
//! checks at start-up, and dropping it. The replication connection that
//! streams it is `worker::relay::wal`'s.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, FromQueryResult, Statement};

/// Why the slot cannot be used, created or dropped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SlotError {
    /// The server does not decode its WAL logically.
    #[error(
        "outbox_mode = \"wal\" needs PostgreSQL's wal_level = logical, but it is {0:?}: set wal_level = logical (and max_replication_slots, max_wal_senders of at least 1 each) in postgresql.conf and restart PostgreSQL, or use outbox_mode = \"table\""
    )]
    WalLevel(String),
    /// The server is older than the relay's protocol: logical messages
    /// reach a `pgoutput` slot only with its `messages` option (14).
    #[error(
        "outbox_mode = \"wal\" needs PostgreSQL 14 or newer (pgoutput's `messages` option carries the outbox's events), but the server is {0}: upgrade PostgreSQL, or use outbox_mode = \"table\""
    )]
    Version(String),
    /// A slot of that name exists for something else.
    #[error(
        "replication slot {slot:?} exists but {problem}; set wal_slot to another name, or drop it with `seawall relay --drop-slot` if it is an abandoned seawall slot"
    )]
    ForeignSlot {
        /// The slot.
        slot: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Another slot relays this database's outbox already.
    #[error(
        "wal_slot {slot:?}: this database's outbox is relayed from slot {other:?} already, and two slots would each publish every event; set wal_slot = {other:?}, or, to move to a new slot, stop every WAL-mode process and drain and drop the old one first (`seawall relay --drop-slot --drain` with wal_slot = {other:?})"
    )]
    OtherSlot {
        /// The slot this process was given.
        slot: String,
        /// The slot relaying the database.
        other: String,
    },
    /// The database is in WAL mode, and this process would write its events
    /// to the table.
    #[error(
        "outbox_mode = \"table\", but this database's outbox is in WAL mode (slot {0:?}): a table-mode writer would publish a key's events ahead of that key's events still in the slot; set outbox_mode = \"wal\", or switch the database back to table mode once every WAL-mode process has stopped, with `seawall relay --drop-slot --drain` (and outbox_mode = \"wal\"), which publishes what the slot holds before dropping it"
    )]
    InWalMode(String),
    /// The slot is held by a running relay (drop refused).
    #[error(
        "replication slot {0:?} is in use by a running relay; stop the relays before dropping it"
    )]
    SlotActive(String),
    /// A database statement failed.
    #[error("WAL slot database error: {0}")]
    Database(#[from] DbErr),
}

/// A SQL literal-free check of a slot name: PostgreSQL allows lower-case
/// letters, digits and underscores, at most 63 bytes.
pub fn valid_slot_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The slot name seawall releases before this one derived from a database
/// URL: from its path alone, so `seawall_` for a URL that names its
/// database in `dbname` or `PGDATABASE`. A slot made under it keeps its
/// name (`worker::relay::wal::settle_slot`).
pub fn legacy_slot_name(database_url: &str) -> String {
    let database = url::Url::parse(database_url)
        .ok()
        .map(|u| u.path().trim_start_matches('/').to_owned())
        .unwrap_or_default();
    slot_name_for(&database)
}

/// The default slot name for database `database`: `seawall_` and its name
/// (lower-cased, other characters as `_`), so services sharing a
/// PostgreSQL cluster get a slot each.
pub fn slot_name_for(database: &str) -> String {
    let mut slot: String = format!("seawall_{database}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    slot.truncate(63);
    slot
}

#[derive(Debug, FromQueryResult)]
struct Setting {
    value: String,
}

#[derive(Debug, FromQueryResult)]
struct SlotRow {
    plugin: Option<String>,
    slot_type: String,
    database: Option<String>,
    active: bool,
}

/// A slot that was gone (dropped, or invalidated) and was made again: the
/// events committed between `relayed_to` and `restarted_at` were never
/// decoded, so never published. Also kept in `wal_slot_loss`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SlotLoss {
    /// The end of the last window the relay had recorded as published.
    pub relayed_to: Lsn,
    /// Where the new slot starts.
    pub restarted_at: Lsn,
}

/// A WAL position, printed as PostgreSQL prints it (`16/B374D848`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lsn(pub u64);

impl std::fmt::Display for Lsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

pub(super) async fn one_text(db: &DatabaseConnection, sql: &str) -> Result<String, DbErr> {
    Ok(
        Setting::find_by_statement(Statement::from_string(DbBackend::Postgres, sql))
            .one(db)
            .await?
            .map(|s| s.value)
            .unwrap_or_default(),
    )
}

async fn slot_row(db: &DatabaseConnection, slot: &str) -> Result<Option<SlotRow>, DbErr> {
    SlotRow::find_by_statement(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT plugin::text AS plugin, slot_type, database::text AS database, active FROM pg_replication_slots WHERE slot_name = $1",
        [slot.into()],
    ))
    .one(db)
    .await
}

/// Checks that the server can run the WAL relay and creates its
/// publication, then its slot, when missing. Several relays starting at once create them
/// once.
///
/// A slot that PostgreSQL invalidated (`wal_status = 'lost'`) is dropped
/// and made again. When a relay had recorded a position in the old slot
/// (so the slot existed and was not dropped by `seawall relay --drop-slot`,
/// which removes the position too), its loss is returned and written to
/// `wal_slot_loss`: the events between the two positions were never
/// relayed.
///
/// # Errors
/// [`SlotError::WalLevel`] naming the setting to change,
/// [`SlotError::ForeignSlot`] for a slot of that name made for something
/// else, or the database error (for example missing `REPLICATION`
/// privilege).
pub async fn prepare(db: &DatabaseConnection, slot: &str) -> Result<Option<SlotLoss>, SlotError> {
    let version = one_text(db, "SELECT current_setting('server_version_num') AS value").await?;
    check_version(&version)?;
    let level = one_text(db, "SELECT current_setting('wal_level') AS value").await?;
    if level != "logical" {
        return Err(SlotError::WalLevel(level));
    }
    if let Some(other) = super::mode::wal_slots(db)
        .await?
        .into_iter()
        .find(|s| s != slot)
    {
        return Err(SlotError::OtherSlot {
            slot: slot.to_owned(),
            other,
        });
    }
    let database = one_text(db, "SELECT current_database()::text AS value").await?;
    publication(db, slot).await?;
    drop_lost_slot(db, slot).await?;
    if slot_row(db, slot).await?.is_none() {
        forget_old_position(db, slot).await?;
        create_slot(db, slot).await?;
    }
    wait_consistent(db, slot).await?;
    let loss = restarted(db, slot).await?.max(remade(db, slot).await?);
    check_slot(db, slot, &database).await?;
    super::mode::switch_to_wal_mode(db, slot).await?;
    Ok(loss)
}

/// Refuses a server older than PostgreSQL 14 (`server_version_num`, e.g.
/// `130012`), named in the error as the major and minor version.
fn check_version(version_num: &str) -> Result<(), SlotError> {
    let num: u32 = version_num.trim().parse().unwrap_or(0);
    if num >= 140_000 {
        return Ok(());
    }
    let named = if num >= 100_000 {
        format!("PostgreSQL {}.{}", num / 10_000, num % 10_000)
    } else {
        format!("PostgreSQL with server_version_num {version_num:?}")
    };
    Err(SlotError::Version(named))
}

/// Drops the slot when PostgreSQL invalidated it (`wal_status = 'lost'`),
/// so that it is made again: the relay cannot read past such a slot.
async fn drop_lost_slot(db: &DatabaseConnection, slot: &str) -> Result<(), DbErr> {
    // Nothing can be decoded from an invalidated slot any more. Dropped
    // only while it is still the lost one: another relay may have made a
    // new one of the same name meanwhile.
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name = $1 AND wal_status = 'lost' AND NOT active",
        [slot.into()],
    ))
    .await?;
    Ok(())
}

/// Forgets the old slot's position before a new slot is made, recording
/// the loss it stands for in `wal_slot_loss`: a session must not start the
/// new slot from a position of the old one.
async fn forget_old_position(db: &DatabaseConnection, slot: &str) -> Result<(), DbErr> {
    // A new slot starts at its creation; an old slot's position says
    // nothing about it, except that there was an old slot: its loss is
    // recorded in the same statement that forgets the position, so a
    // failed creation after it cannot make it unrecorded.
    // The position is forgotten only while there is still no slot
    // (another relay may have made it, and recorded a window, since
    // `prepare` looked), and a position past the server's WAL is another
    // cluster's (a restored dump), not a loss on this one; nor is a row
    // a session took the slot with (its generation) before it recorded
    // any window (position 0).
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "WITH gone AS (DELETE FROM wal_relay_position WHERE slot = $1 \
             AND NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1) \
             RETURNING slot, lsn) \
         INSERT INTO wal_slot_loss (slot, relayed_to, recreated_at) \
         SELECT slot, lsn, now() FROM gone \
          WHERE lsn > 0 AND lsn <= pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')",
        [slot.into()],
    ))
    .await?;
    Ok(())
}

/// Creates the slot. Several relays starting at once may each try: the
/// slot one of them made is as good, so only a failure that left no slot
/// is an error.
async fn create_slot(db: &DatabaseConnection, slot: &str) -> Result<(), SlotError> {
    let created = db
        .execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            [slot.into()],
        ))
        .await;
    // Another relay may have created it in the meantime.
    if let Err(err) = created
        && slot_row(db, slot).await?.is_none()
    {
        return Err(err.into());
    }
    Ok(())
}

/// Refuses a slot of that name made for something else (another plugin,
/// type or database): the relay would read nothing of its outbox from it.
async fn check_slot(db: &DatabaseConnection, slot: &str, database: &str) -> Result<(), SlotError> {
    let Some(row) = slot_row(db, slot).await? else {
        return Err(SlotError::ForeignSlot {
            slot: slot.to_owned(),
            problem: "vanished while being checked".into(),
        });
    };
    let problem = if row.slot_type != "logical" || row.plugin.as_deref() != Some("pgoutput") {
        Some(format!(
            "is a {} slot of plugin {:?}, not a logical pgoutput slot",
            row.slot_type, row.plugin
        ))
    } else if row.database.as_deref() != Some(database) {
        Some(format!(
            "belongs to database {:?}, not {database:?}",
            row.database
        ))
    } else {
        None
    };
    if let Some(problem) = problem {
        return Err(SlotError::ForeignSlot {
            slot: slot.to_owned(),
            problem,
        });
    }
    Ok(())
}

/// Creates the slot's publication when missing. It must exist before the
/// slot does: pgoutput looks it up in the catalog as of each change it
/// decodes, so a change committed between the slot's start and the
/// publication's creation (by any client, on any table) fails to decode
/// with "publication does not exist" every time the slot is read, and the
/// slot never gets past it.
///
/// The publication is empty: logical messages reach the slot whatever it
/// holds, and no table's changes are sent for nothing.
async fn publication(db: &DatabaseConnection, slot: &str) -> Result<(), DbErr> {
    let exists = || async {
        one_text(
            db,
            &format!("SELECT count(*)::text AS value FROM pg_publication WHERE pubname = '{slot}'"),
        )
        .await
        .map(|n| n != "0")
    };
    if exists().await? {
        return Ok(());
    }
    match db
        .execute_unprepared(&format!("CREATE PUBLICATION {slot}"))
        .await
    {
        // Another process may have made it meanwhile.
        Err(err) if !exists().await? => Err(err),
        _ => Ok(()),
    }
}

/// Completes the losses of `slot` not completed yet (this call's, or one
/// whose process died before it got here) with where the new slot starts
/// and when it could take events again; returns the latest.
async fn restarted(db: &DatabaseConnection, slot: &str) -> Result<Option<SlotLoss>, DbErr> {
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "UPDATE wal_slot_loss SET recreated_at = now(), restarted_at = \
               (SELECT pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint \
                  FROM pg_replication_slots WHERE slot_name = $1) \
             WHERE slot = $1 AND restarted_at IS NULL RETURNING relayed_to, restarted_at",
            [slot.into()],
        ))
        .await?;
    let mut latest = None;
    for row in rows {
        latest = latest.max(Some(loss_of(&row)?));
    }
    Ok(latest)
}

/// The loss a `RETURNING relayed_to, restarted_at` row of `wal_slot_loss`
/// names (a missing position reads as 0).
fn loss_of(row: &sea_orm::QueryResult) -> Result<SlotLoss, DbErr> {
    let lsn = |v: Option<i64>| Lsn(v.and_then(|v| u64::try_from(v).ok()).unwrap_or(0));
    Ok(SlotLoss {
        relayed_to: lsn(row.try_get("", "relayed_to")?),
        restarted_at: lsn(row.try_get("", "restarted_at")?),
    })
}

/// Finds a slot that was remade while it existed whenever seawall looked:
/// confirmed past the position its relays recorded, though they record
/// each position before they confirm it. The server would skip the events
/// between, unrecorded: they are a loss, written to `wal_slot_loss`
/// (which the alert reads) and returned, and the position moves to the
/// slot's so the loss is recorded once.
///
/// Only while `recorded_generation` is the row's `generation`: a session
/// of a release that confirms positions it does not record (keepalives)
/// bumped the generation, and its slot is legitimately ahead. A relay
/// recording at this moment is safe: it commits its position before it
/// confirms it, and the row lock makes this statement read that position.
pub(crate) async fn remade<C: ConnectionTrait>(
    db: &C,
    slot: &str,
) -> Result<Option<SlotLoss>, DbErr> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "WITH s AS (SELECT pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint AS confirmed \
                          FROM pg_replication_slots WHERE slot_name = $1), \
                  old AS (SELECT p.slot, p.lsn, s.confirmed FROM wal_relay_position p, s \
                           WHERE p.slot = $1 AND p.recorded_generation = p.generation \
                             AND p.lsn > 0 AND s.confirmed > p.lsn FOR UPDATE OF p), \
                  moved AS (UPDATE wal_relay_position p SET lsn = old.confirmed, \
                              txn_lsn = NULL, txn_messages = 0 FROM old WHERE p.slot = old.slot) \
             INSERT INTO wal_slot_loss (slot, relayed_to, recreated_at, restarted_at) \
             SELECT slot, lsn, now(), confirmed FROM old RETURNING relayed_to, restarted_at",
            [slot.into()],
        ))
        .await?;
    row.as_ref().map(loss_of).transpose()
}

/// How long start-up waits for another process's slot creation to finish.
const SLOT_CREATION_WAIT: Duration = Duration::from_secs(120);

/// Waits until `slot` decodes every transaction that commits from now on.
/// A slot another process is still creating is listed before it is: its
/// creation waits for the transactions running at its start to end, and
/// events committed until then would never reach it. Its confirmed
/// position appears once it is ready.
async fn wait_consistent(db: &DatabaseConnection, slot: &str) -> Result<(), SlotError> {
    let deadline = tokio::time::Instant::now() + SLOT_CREATION_WAIT;
    loop {
        let ready = one_text(
            db,
            &format!(
                "SELECT (count(*) FILTER (WHERE confirmed_flush_lsn IS NOT NULL))::text AS value \
                 FROM pg_replication_slots WHERE slot_name = '{slot}'"
            ),
        )
        .await?;
        if ready != "0" {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(SlotError::ForeignSlot {
                slot: slot.to_owned(),
                problem: format!(
                    "has not become ready in {SLOT_CREATION_WAIT:?} (its creation waits for every transaction running when it began to end)"
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long [`drop_slot`] waits for the slot's holder to let it go.
pub const LET_GO: std::time::Duration = std::time::Duration::from_secs(5);

/// Drops the slot and its publication (`seawall relay --drop-slot`): the
/// WAL it retained is freed, and events not yet relayed from it are gone.
/// Returns whether a slot was dropped.
///
/// A slot held when asked is waited for, up to [`LET_GO`]: a relay that
/// has just stopped holds it until its walsender notices the closed
/// connection, a moment after the process is gone.
///
/// # Errors
/// [`SlotError::SlotActive`] while a relay still streams from it after
/// that; the database error otherwise.
pub async fn drop_slot(db: &DatabaseConnection, slot: &str) -> Result<bool, SlotError> {
    let deadline = std::time::Instant::now() + LET_GO;
    while slot_row(db, slot).await?.is_some_and(|row| row.active) {
        if std::time::Instant::now() >= deadline {
            return Err(SlotError::SlotActive(slot.to_owned()));
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The position first: a position left without its slot (this process
    // stopped halfway) would read as a lost slot at the next start.
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "DELETE FROM wal_relay_position WHERE slot = $1",
        [slot.into()],
    ))
    .await?;
    let dropped = match slot_row(db, slot).await? {
        Some(row) if row.active => return Err(SlotError::SlotActive(slot.to_owned())),
        Some(_) => {
            db.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_drop_replication_slot($1)",
                [slot.into()],
            ))
            .await?;
            true
        }
        None => false,
    };
    drop_own_publication(db, slot).await?;
    Ok(dropped)
}

/// Drops the slot's publication when it is seawall's: empty, as
/// [`prepare`] makes it. One that publishes tables (`FOR ALL TABLES`, or
/// tables added to it) is someone else's use of the name, and is left
/// with a warning: dropping it would break their subscribers.
async fn drop_own_publication(db: &DatabaseConnection, slot: &str) -> Result<(), DbErr> {
    let foreign = one_text(
        db,
        &format!(
            "SELECT count(*)::text AS value FROM pg_publication p WHERE p.pubname = '{slot}' \
               AND (p.puballtables OR EXISTS \
                 (SELECT 1 FROM pg_publication_tables t WHERE t.pubname = p.pubname))"
        ),
    )
    .await?;
    if foreign != "0" {
        tracing::warn!(publication = %slot, "the publication of the slot's name publishes tables, so it is not seawall's (seawall's is empty): left in place");
        return Ok(());
    }
    db.execute_unprepared(&format!("DROP PUBLICATION IF EXISTS {slot}"))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_follow_the_database() {
        assert_eq!(slot_name_for("Orders-Prod"), "seawall_orders_prod");
        assert_eq!(
            legacy_slot_name("postgres://u:p@h:5432/Orders-Prod?sslmode=require"),
            "seawall_orders_prod"
        );
        assert_eq!(legacy_slot_name("postgres://h/?dbname=orders"), "seawall_");
        assert!(valid_slot_name(&slot_name_for(
            "t_0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
        )));
        assert!(!valid_slot_name("Seawall"));
        assert!(!valid_slot_name(&"a".repeat(64)));
        assert!(!valid_slot_name("x; DROP TABLE y"));
    }

    #[test]
    fn servers_older_than_postgresql_14_are_refused_by_name() {
        assert!(check_version("140000").is_ok());
        assert!(check_version("170004").is_ok());
        let refused = check_version("130012").unwrap_err().to_string();
        assert!(refused.contains("PostgreSQL 13.12"), "{refused}");
        assert!(refused.contains("PostgreSQL 14 or newer"), "{refused}");
        assert!(check_version("90624").is_err());
        assert!(check_version("").is_err());
    }
}
