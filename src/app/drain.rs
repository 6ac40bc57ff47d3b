//! Switching a database in WAL mode back to table mode: the slot's backlog
//! is relayed first, then the slot is dropped (`seawall relay --drop-slot
//! --drain`).

use std::time::Duration;

use anyhow::{Context, Result};
use sea_orm::{ConnectionTrait, DbBackend, Statement};

use super::{Application, Domain, Roles, connect_db_waiting};
use crate::config::Settings;
use tokio_util::sync::CancellationToken;

/// How often the drain checks how far the slot is confirmed.
const POLL: Duration = Duration::from_millis(200);

/// Relays what the WAL slot holds up to now, then drops the slot, its
/// publication and position, which ends WAL mode for the database: a
/// table-mode consumer may start after. Every WAL-mode process must have
/// stopped first: what one writes after the drain began is lost with the
/// slot. Events the relay hands to the table (refused ones, and those
/// queued behind them) are published by the table relays afterwards.
///
/// # Errors
/// `outbox_mode` is not `wal`, the drain was interrupted (the slot is left
/// as it was), or the database, broker or slot failed.
pub async fn drain_wal_slot(
    settings: &Settings,
    domain: Domain,
    stop: CancellationToken,
) -> Result<()> {
    anyhow::ensure!(
        settings.outbox_mode == service::OutboxMode::Wal,
        "--drain relays the WAL slot before dropping it: run it with outbox_mode = \"wal\""
    );
    let pool = settings.pool_size(&Roles::RELAY, super::consumers::consumer_count(&domain))?;
    let db = connect_db_waiting(&settings.database_url, pool, settings.sqlite()).await?;
    settings.settle_wal_slot(&db).await?;
    let slot = settings.wal_slot();
    let target = insert_position(&db).await?;
    let build = Application::build(settings, Roles::RELAY, domain, db.clone(), None);
    let Some(app) = super::until_stopped(&stop, build).await? else {
        anyhow::bail!("stopped before slot {slot} was drained; it is left as it was");
    };
    let drained = stop.child_token();
    let watch = tokio::spawn(until_caught_up(
        db.clone(),
        slot.clone(),
        target.clone(),
        drained.clone(),
    ));
    eprintln!("relaying WAL slot {slot} up to {target} before dropping it");
    // The relay's run ends on the drain's cancel (a child of the signal's).
    let stopped = app.run_until(drained.clone()).await;
    watch.abort();
    stopped?;
    anyhow::ensure!(
        drained.is_cancelled() && !stop.is_cancelled(),
        "stopped before slot {slot} was drained; it is left as it was"
    );
    // The relay's replication connection ends a moment after the relay.
    let active = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT count(*) AS n FROM pg_replication_slots WHERE slot_name = $1 AND active",
        [slot.clone().into()],
    );
    for _ in 0..150 {
        if count(&db, &active).await? == 0 {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let dropped = worker::relay::wal::drop_slot(&db, &slot).await?;
    println!(
        "drained up to {target} and {} replication slot {slot}",
        if dropped { "dropped" } else { "there was no" }
    );
    Ok(())
}

/// Where the WAL is inserted now: everything committed before now is
/// before it, and nothing should come after. The insert position, since
/// with synchronous_commit = off a commit may not be written yet, and the
/// write position would leave it out.
async fn insert_position(db: &sea_orm::DatabaseConnection) -> Result<String> {
    Ok(db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT pg_current_wal_insert_lsn()::text AS lsn",
        ))
        .await?
        .context("reading the current WAL position")?
        .try_get::<String>("", "lsn")?)
}

/// Cancels `done` once `slot` is confirmed up to `target`, asking every
/// poll; a failed reading is logged and asked again.
async fn until_caught_up(
    db: sea_orm::DatabaseConnection,
    slot: String,
    target: String,
    done: CancellationToken,
) {
    let caught_up = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT count(*) AS n FROM pg_replication_slots \
         WHERE slot_name = $1 AND confirmed_flush_lsn >= $2::pg_lsn",
        [slot.into(), target.into()],
    );
    loop {
        match count(&db, &caught_up).await {
            Ok(1) => {
                done.cancel();
                return;
            }
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(error = %err, "could not read how far the slot is confirmed")
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The `n` a `SELECT count(*) AS n` statement answers.
async fn count(
    db: &sea_orm::DatabaseConnection,
    statement: &Statement,
) -> Result<i64, sea_orm::DbErr> {
    let row = db.query_one_raw(statement.clone()).await?;
    row.map_or(Ok(0), |r| r.try_get::<i64>("", "n"))
}
