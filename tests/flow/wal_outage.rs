//! An hours-long NATS outage in WAL mode: a window retried in place holds
//! the slot, which retains every table's WAL meanwhile; under
//! `max_slot_wal_keep_size` the slot would be lost while the relay is
//! healthy. Past `WAL_HANDOFF_MS` the relay hands its windows to the outbox
//! table instead, and the table relay publishes them once NATS is back.

use std::time::Duration;

use sea_orm::ConnectionTrait;

use crate::helpers::stored_on;
use crate::support::domain::RECORDED_SUBJECT;
use crate::support::postgres::PrivatePostgres;
use crate::support::process::Seawall;
use crate::support::{TestDb, pg_count};
use crate::wal::{commit_events, recorded, slot_of, until_held, wal_env, wal_position};
use crate::wal_windows::until;

/// NATS stops with events of one key committed behind it; a writer then
/// writes 100 MB of other tables, past the server's 64 MB
/// `max_slot_wal_keep_size`. The relay hands the stuck window to the table
/// after 2 s, so the slot keeps moving past the writer's WAL and a
/// checkpoint leaves it intact; NATS back, every event is published once,
/// in order. Without the hand-over the slot never gets past the stuck
/// window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_nats_outage_hands_windows_to_the_table_and_keeps_the_slot() {
    let pg = PrivatePostgres::start(&["wal_level=logical", "max_slot_wal_keep_size=64MB"]);
    let t = TestDb::on_postgres(&pg.url).await;
    let (mut nats, _js) = crate::helpers::ledger_nats().await;
    let env = wal_env(&t, &nats.url(), &[("SEAWALL_WAL_HANDOFF_MS", "2000")]);
    let mut relay = Seawall::spawn(&["relay"], &env);
    until_held(&relay, &t, Duration::from_secs(60)).await;
    nats.stop();
    let ids: Vec<String> = (0..20).map(|i| format!("stuck-{i}")).collect();
    commit_events(
        &t.db,
        ids.iter().map(|id| recorded(id, Some("k"))).collect(),
    )
    .await;
    until(
        &relay,
        "the window handed to the table",
        Duration::from_secs(120),
        || async { pg_count(&t.db, "SELECT count(*) FROM outbox_message").await == 20 },
    )
    .await;
    t.db.execute_unprepared(
        "CREATE TABLE ballast AS SELECT repeat('x', 1000) AS b FROM generate_series(1, 100000)",
    )
    .await
    .unwrap();
    let written = wal_position(&t).await;
    // The slot's restart position, which is what a checkpoint measures
    // against `max_slot_wal_keep_size`, moves once the relay confirms a
    // position past a snapshot of running transactions logged after the
    // writer's (the background writer logs one every 15 s).
    let restart = format!(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}' \
           AND pg_wal_lsn_diff(restart_lsn, '0/0') >= {written}",
        slot_of(&t)
    );
    until(
        &relay,
        "the slot moved past the writer's WAL",
        Duration::from_secs(120),
        || async { pg_count(&t.db, &restart).await == 1 },
    )
    .await;
    t.db.execute_unprepared("CHECKPOINT").await.unwrap();
    let lost = format!(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}' AND wal_status = 'lost'",
        slot_of(&t)
    );
    assert_eq!(pg_count(&t.db, &lost).await, 0);

    nats.restart().await;
    let js = nats.jetstream().await;
    until(
        &relay,
        "the table relay publishes the rows",
        Duration::from_secs(120),
        || async { stored_on(&js, RECORDED_SUBJECT).await.len() == ids.len() },
    )
    .await;
    let stored: Vec<String> = stored_on(&js, RECORDED_SUBJECT)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(stored, ids, "once each, in the key's order");
    assert_eq!(
        pg_count(&t.db, "SELECT count(*) FROM wal_slot_loss").await,
        0
    );
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
}
