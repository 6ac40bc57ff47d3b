//! The outbox mode is the database's: once a WAL-mode process has made the
//! slot, a table-mode consumer (which would publish a key's new events
//! ahead of those still in the slot) and a WAL-mode process with another
//! slot (which would publish every event a second time) refuse to start,
//! each naming the setting; `seawall relay --drop-slot --drain` relays the
//! slot's backlog, drops it, and table mode may start again.

use std::time::Duration;

use sea_orm::{ConnectionTrait, TransactionTrait};
use service::{Outbox, OutboxError, OutboxMode};

use crate::helpers::{env, stored_on, with_ledger_stream};
use crate::support::domain::RECORDED_SUBJECT;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, pg_count, wait_until};
use crate::wal::{commit_events, recorded, relay_drops_slot, slot_of, wal_env};

/// Starts `seawall args` and asserts it exits unsuccessfully within 60 s,
/// naming `needle` on stderr.
async fn refused(args: &[&str], env: &[(&'static str, String)], needle: &str) {
    let mut process = Seawall::spawn(args, env);
    let exited = tokio::time::timeout(Duration::from_secs(60), process.wait()).await;
    let log = process.log_text();
    let Ok(status) = exited else {
        process.terminate().await;
        panic!("`seawall {args:?}` started instead of refusing:\n{log}");
    };
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(needle),
        "the refusal should name {needle}:\n{log}"
    );
    process.assert_no_panic();
}

/// Waits until `seawall args` says it runs, then stops it.
async fn starts(args: &[&str], env: &[(&'static str, String)]) {
    let mut process = Seawall::spawn(args, env);
    crate::wal_windows::until(&process, "it runs", Duration::from_secs(60), || async {
        process.log_text().contains("seawall is running")
    })
    .await;
    assert!(
        process.terminate().await.success(),
        "{}",
        process.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_outbox_mode_is_the_databases_until_the_slot_is_drained() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    let table = env(&t.url, &nats.url(), &[]);
    // Table mode on a database that never was in WAL mode starts.
    starts(&["consume"], &table).await;
    worker::relay::wal::prepare(&t.db, &slot_of(&t))
        .await
        .unwrap();
    let ids: Vec<String> = (0..50).map(|i| format!("drain-{i}")).collect();
    commit_events(
        &t.db,
        ids.iter().map(|id| recorded(id, Some("k"))).collect(),
    )
    .await;
    refused(&["consume"], &table, "outbox_mode").await;
    // Slot names are the cluster's: one of this test's own.
    let another = format!("{}_2", slot_of(&t));
    let other = wal_env(&t, &nats.url(), &[("SEAWALL_WAL_SLOT", another.as_str())]);
    refused(&["relay"], &other, "wal_slot").await;
    assert!(no_slot(&t, &another).await);

    relay_drops_slot(&["--drain"], &wal_env(&t, &nats.url(), &[]));
    let stored: Vec<String> = stored_on(&js, RECORDED_SUBJECT)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(stored, ids, "the drain relays the slot's backlog, in order");
    starts(&["consume"], &table).await;
}

/// Whether `slot` does not exist.
async fn no_slot(t: &TestDb, slot: &str) -> bool {
    crate::support::pg_count(
        &t.db,
        &format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"),
    )
    .await
        == 0
}

/// A rolling deploy to WAL mode: a table-mode writer still running checks
/// the mode inside its transaction, so the switch (the first WAL-mode
/// process's `prepare`) waits for a table-mode transaction that checked
/// before it, and later ones are refused (a row could otherwise go out
/// ahead of its key's events still in the slot), one queued behind the
/// switch too. Without the lock the switch does not wait; without the
/// check the later row is written; with lock and check in one query the
/// queued writer reads the mode from before the switch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_switch_to_wal_mode_waits_for_table_writers_and_refuses_later_ones() {
    let t = TestDb::new(Backend::Postgres).await;
    let slot = slot_of(&t);
    // The slot made first, the database left in table mode: making a slot
    // waits for running transactions itself, which is not what is tested.
    worker::relay::wal::prepare(&t.db, &slot).await.unwrap();
    t.db.execute_unprepared("DELETE FROM wal_relay_position")
        .await
        .unwrap();
    let table = Outbox::new(OutboxMode::Table);
    let writer = t.db.begin().await.unwrap();
    table
        .enqueue(&writer, recorded("before", Some("k")))
        .await
        .unwrap();
    let switching = {
        let (db, slot) = (t.db.clone(), slot.clone());
        tokio::spawn(async move { worker::relay::wal::prepare(&db, &slot).await })
    };
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
    wait_until(
        "the switch waits for the writer",
        Duration::from_secs(60),
        || async { pg_count(&t.db, waiting).await == 1 },
    )
    .await;
    assert!(!switching.is_finished());
    // A second writer queues behind the switch: it must read the mode
    // after the switch commits, not as it was when its query began.
    let queued = {
        let db = t.db.clone();
        tokio::spawn(async move {
            let txn = db.begin().await.unwrap();
            let result = table.enqueue(&txn, recorded("queued", Some("k"))).await;
            txn.rollback().await.unwrap();
            result
        })
    };
    wait_until(
        "the second writer queues behind the switch",
        Duration::from_secs(60),
        || async { pg_count(&t.db, waiting).await == 2 },
    )
    .await;
    writer.commit().await.unwrap();
    switching.await.unwrap().unwrap();
    let queued = queued.await.unwrap();
    assert!(
        matches!(queued, Err(OutboxError::InWalMode(ref s)) if *s == slot),
        "{queued:?}"
    );
    let later = t.db.begin().await.unwrap();
    let refused = table.enqueue(&later, recorded("after", Some("k"))).await;
    assert!(
        matches!(refused, Err(OutboxError::InWalMode(ref s)) if *s == slot),
        "{refused:?}"
    );
    later.rollback().await.unwrap();
    crate::wal::drop_slot(&t);
}
