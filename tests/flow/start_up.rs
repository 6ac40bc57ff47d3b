//! Start-up steps that meet a database which cannot do them yet wait, as
//! every start-up step does, instead of exiting into a supervisor's restart
//! loop: here a lock on `wal_relay_position` held past the database's
//! `lock_timeout` (in the soak, a PostgreSQL restart).

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, TransactionTrait};

use crate::helpers::{env, with_ledger_stream};
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, wait_until};
use crate::wal::{drop_slot, slot_of, until_held, wal_env};

/// Sets a 200 ms `lock_timeout` on the test's database and locks
/// `wal_relay_position` in a transaction of another pool, returned to be
/// committed when the test lets go.
async fn lock_wal_relay_position(t: &TestDb) -> (DatabaseConnection, DatabaseTransaction) {
    t.db.execute_unprepared(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET lock_timeout = %L', current_database(), '200ms'); END $$",
    )
    .await
    .unwrap();
    let holder = t.second_pool().await;
    let txn = holder.begin().await.unwrap();
    txn.execute_unprepared("LOCK TABLE wal_relay_position IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    (holder, txn)
}

/// Waits until `process` logs that it waits for the database at `step`,
/// lets the lock go, and waits until it runs.
async fn waits_then_runs(process: &Seawall, step: &str, lock: DatabaseTransaction) {
    wait_until(
        "the process waiting for the database",
        Duration::from_secs(60),
        || async {
            let log = process.log_text();
            log.contains("the database cannot do this yet") && log.contains(step)
        },
    )
    .await;
    lock.commit().await.unwrap();
    wait_until("the process running", Duration::from_secs(60), || async {
        process.log_text().contains("seawall is running")
    })
    .await;
}

/// A WAL relay's slot preparation.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_waits_out_a_database_that_cannot_prepare_its_slot_yet() {
    let (t, nats, _js) = with_ledger_stream(Backend::Postgres).await;
    worker::relay::wal::prepare(&t.db, &slot_of(&t))
        .await
        .unwrap();
    let (_holder, lock) = lock_wal_relay_position(&t).await;
    let mut relay = Seawall::spawn(&["relay"], &wal_env(&t, &nats.url(), &[]));
    waits_then_runs(&relay, "preparing the WAL slot", lock).await;
    until_held(&relay, &t, Duration::from_secs(30)).await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    drop_slot(&t);
}

/// A table-mode consumer's check that the database is not in WAL mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_waits_out_a_database_that_cannot_tell_its_outbox_mode_yet() {
    let (t, nats, _js) = with_ledger_stream(Backend::Postgres).await;
    let (_holder, lock) = lock_wal_relay_position(&t).await;
    let mut consume = Seawall::spawn(&["consume"], &env(&t.url, &nats.url(), &[]));
    waits_then_runs(&consume, "checking the outbox mode", lock).await;
    assert!(
        consume.terminate().await.success(),
        "{}",
        consume.log_text()
    );
}
