//! Redeliveries and republished copies reaching two consumer
//! processes at once.

use std::time::Duration;

use crate::support::domain::Entry;
use entity::prelude::*;

use crate::helpers::{
    applied_events_once_each, drain, env, ledger_stream, publish_entries, req, with_ledger_stream,
};
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, wait_until};

async fn credit_consumer(
    js: &async_nats::jetstream::Context,
) -> Option<async_nats::jetstream::consumer::Info> {
    let mut consumer = js
        .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
            "ledger", "LEDGER",
        )
        .await
        .ok()?;
    consumer.info().await.ok().cloned()
}

/// The first process freezes in the middle of its handlers (its
/// in-progress acks stop with it), JetStream redelivers each message to the
/// second process, and the first then carries on: both work on every message
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redelivery_racing_the_first_delivery_is_applied_once() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    let slow = [
        ("TESTBED_WORK_MS", "1500"),
        ("SEAWALL_ACK_WAIT_MS", "400"),
        ("SEAWALL_MAX_DELIVER", "20"),
    ];
    let mut a = Seawall::spawn(&["consume"], &env(&t.url, &nats.url(), &slow));
    let msgs: Vec<_> = (0..10)
        .map(|i| (format!("seed-{i}"), req("acct", 7)))
        .collect();
    publish_entries(&js, &msgs).await;
    wait_until(
        "the first process to hold every message",
        Duration::from_secs(30),
        || async {
            credit_consumer(&js)
                .await
                .is_some_and(|i| i.num_ack_pending == 10)
        },
    )
    .await;
    a.freeze();
    let mut b = Seawall::spawn(&["consume"], &env(&t.url, &nats.url(), &slow));
    wait_until(
        "redeliveries to the second process",
        Duration::from_secs(30),
        || async {
            credit_consumer(&js)
                .await
                .is_some_and(|i| i.num_redelivered > 0)
        },
    )
    .await;
    a.thaw();
    let mut relay = Seawall::spawn(&["relay"], &env(&t.url, &nats.url(), &[]));
    crate::helpers::wait_for_rows::<Entry>(&t.db, 10, Duration::from_secs(60)).await;
    drain(&t.db, &js, Duration::from_secs(60)).await;

    let info = credit_consumer(&js).await.unwrap();
    assert!(
        info.num_redelivered > 0 || info.delivered.consumer_sequence > 10,
        "the race was set up: copies were redelivered"
    );
    assert_eq!(t.count(Entry).await, 10);
    assert_eq!(t.count(InboxMessage).await, 10);
    assert_eq!(t.count(DeadLetter).await, 0);
    assert_eq!(applied_events_once_each(&js).await, 10);
    for p in [&mut a, &mut b, &mut relay] {
        assert!(p.terminate().await.success());
        p.assert_no_panic();
    }
}

/// The same id published three times (0, 500 and 50 ms apart) with a
/// 100 ms dedupe window, so copies get past JetStream to two consumers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_past_the_broker_dedupe_window_are_applied_once() {
    let t = TestDb::new(Backend::Postgres).await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    worker::ensure_stream(&js, &ledger_stream(Duration::from_millis(100)))
        .await
        .unwrap();
    let cfg = [
        ("SEAWALL_DUPLICATE_WINDOW_MS", "100"),
        ("SEAWALL_RELAY_LEASE_MS", "90"),
        ("SEAWALL_RELAY_RETRY_MAX_MS", "10"),
    ];
    let mut a = Seawall::spawn(&["run"], &env(&t.url, &nats.url(), &cfg));
    let mut b = Seawall::spawn(&["consume"], &env(&t.url, &nats.url(), &cfg));
    let msgs: Vec<_> = (0..100)
        .map(|i| (format!("copy-{i}"), req(&format!("acct-{}", i % 7), 3)))
        .collect();
    publish_entries(&js, &msgs).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    publish_entries(&js, &msgs).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    publish_entries(&js, &msgs).await;

    let requested = crate::helpers::stored_on(&js, crate::support::domain::RECORD_SUBJECT).await;
    assert!(
        requested.len() > 100,
        "copies got past the dedupe window ({} stored)",
        requested.len()
    );
    crate::helpers::wait_for_rows::<Entry>(&t.db, 100, Duration::from_secs(60)).await;
    drain(&t.db, &js, Duration::from_secs(60)).await;
    assert_eq!(t.count(Entry).await, 100);
    assert_eq!(t.count(DeadLetter).await, 0);
    assert_eq!(applied_events_once_each(&js).await, 100);
    for p in [&mut a, &mut b] {
        assert!(p.terminate().await.success());
        p.assert_no_panic();
    }
}
