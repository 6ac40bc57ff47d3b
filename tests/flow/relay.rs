//! The outbox relay under crashes, competition,
//! ordering keys and out-of-order commits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use sea_orm::{DatabaseConnection, TransactionTrait};
use tokio::sync::Notify;

use service::{NewEvent, Outbox};
use worker::{Relay, RelayConfig};

use crate::helpers::{env, stored_on, with_ledger_stream};
use crate::on_backends;
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, charted, wait_until};

const SUBJECT: &str = "ledger.recorded";

async fn enqueue_many(db: &DatabaseConnection, n: usize, prefix: &str) -> Vec<String> {
    let txn = db.begin().await.unwrap();
    let mut ids = Vec::new();
    for i in 0..n {
        let event = NewEvent::new(SUBJECT, format!("{{\"n\":{i}}}"))
            .with_message_id(format!("{prefix}-{i}"));
        ids.push(event.message_id.clone());
        Outbox::default().enqueue(&txn, event).await.unwrap();
    }
    txn.commit().await.unwrap();
    ids
}

async fn wait_drained(db: &DatabaseConnection, timeout: Duration) {
    wait_until("the outbox to drain", timeout, || async {
        worker::relay::pending_count(db).await.unwrap() == 0
    })
    .await;
}

fn unique_count(events: &[(String, Vec<u8>)]) -> usize {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (id, _) in events {
        *seen.entry(id.as_str()).or_default() += 1;
    }
    assert!(seen.values().all(|n| *n == 1), "an event is stored twice");
    seen.len()
}

/// A relay dies after JetStream acknowledged a batch but before it
/// recorded that; its replacement republishes after the lease, and JetStream's
/// duplicate window drops every copy.
async fn a_relay_crash_after_the_puback_loses_nothing_and_duplicates_nothing(backend: Backend) {
    let (t, nats, js) = with_ledger_stream(backend).await;
    enqueue_many(&t.db, 200, "crash").await;
    let lease = [("SEAWALL_RELAY_LEASE_MS", "1000")];
    // One lane, so that one round claims all 200 rows: with two, the other
    // lane may hold some of them, still unpublished when the fault aborts.
    let mut crashing = Seawall::spawn(
        &["relay"],
        &env(
            &t.url,
            &nats.url(),
            &[
                lease[0],
                ("SEAWALL_RELAY_CONCURRENCY", "1"),
                ("TESTBED_FAULT", "relay-after-puback"),
            ],
        ),
    );
    let status = crashing.wait().await;
    assert!(!status.success(), "the fault point aborted the relay");
    assert_eq!(
        worker::relay::pending_count(&t.db).await.unwrap(),
        200,
        "nothing was marked published"
    );
    assert_eq!(
        stored_on(&js, SUBJECT).await.len(),
        200,
        "but JetStream had them"
    );

    let mut relay = Seawall::spawn(&["relay"], &env(&t.url, &nats.url(), &lease));
    wait_drained(&t.db, Duration::from_secs(30)).await;
    assert_eq!(unique_count(&stored_on(&js, SUBJECT).await), 200);
    assert_eq!(
        charted(&t.db).await.0,
        200,
        "the chart counts what was marked published, not the crashed relay's round"
    );
    assert!(relay.terminate().await.success());
    relay.assert_no_panic();
}

/// The window must also cover the retry backoff: a row whose PubAck was lost
/// although the stream stored it is published again after its backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_window_shorter_than_lease_plus_retry_backoff_stops_startup() {
    let t = TestDb::new(Backend::Sqlite).await;
    let nats = NatsServer::start().await;
    let cfg = [
        ("SEAWALL_DUPLICATE_WINDOW_MS", "30000"),
        ("SEAWALL_RELAY_LEASE_MS", "5000"),
        ("SEAWALL_RELAY_RETRY_MAX_MS", "60000"),
    ];
    let mut relay = Seawall::spawn(&["relay"], &env(&t.url, &nats.url(), &cfg));
    let exited = tokio::time::timeout(Duration::from_secs(20), relay.wait()).await;
    let status = exited.expect("start-up accepted a window shorter than lease + retry backoff");
    assert!(!status.success());
    let log = relay.log_text();
    assert!(log.contains("SEAWALL_RELAY_RETRY_MAX_MS"), "{log}");
}
on_backends!(a_relay_crash_after_the_puback_loses_nothing_and_duplicates_nothing: sqlite, postgres);

/// On PostgreSQL a batch is held by row locks in the relay's open
/// transaction, not by a lease: when the relay dies its rows are free as soon
/// as its connection drops, long before a (here one-minute) lease would run
/// out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_relays_rows_are_free_at_once_on_postgres() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    enqueue_many(&t.db, 50, "locked").await;
    let lease = ("SEAWALL_RELAY_LEASE_MS", "60000");
    let mut crashing = Seawall::spawn(
        &["relay"],
        &env(
            &t.url,
            &nats.url(),
            &[lease, ("TESTBED_FAULT", "relay-after-puback")],
        ),
    );
    assert!(
        !crashing.wait().await.success(),
        "the fault point aborted the relay"
    );
    assert_eq!(worker::relay::pending_count(&t.db).await.unwrap(), 50);
    let mut relay = Seawall::spawn(&["relay"], &env(&t.url, &nats.url(), &[lease]));
    // Inside the lease: under a lease these rows would still be held.
    wait_drained(&t.db, Duration::from_secs(50)).await;
    assert_eq!(unique_count(&stored_on(&js, SUBJECT).await), 50);
    assert!(relay.terminate().await.success());
    relay.assert_no_panic();
}

/// Three relays on PostgreSQL share 5,000 rows; each row is published
/// by one relay, and when one is killed the others finish its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_share_the_outbox_and_survive_a_kill() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    // A plain subscriber sees every publish, including copies JetStream drops.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut sub = client.subscribe(SUBJECT).await.unwrap();
    let publishes = Arc::new(std::sync::Mutex::new(HashMap::<String, usize>::new()));
    let counter = publishes.clone();
    let counting = tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            let id = msg
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .map(|v| v.to_string())
                .unwrap_or_default();
            *counter.lock().unwrap().entry(id).or_default() += 1;
        }
    });
    client.flush().await.unwrap();

    enqueue_many(&t.db, 5_000, "multi").await;
    const BATCH: usize = 100;
    const ROUNDS_IN_FLIGHT: usize = 2;
    let (batch, rounds) = (BATCH.to_string(), ROUNDS_IN_FLIGHT.to_string());
    let cfg = [
        ("SEAWALL_RELAY_LEASE_MS", "1000"),
        ("SEAWALL_RELAY_BATCH_SIZE", batch.as_str()),
        ("SEAWALL_RELAY_CONCURRENCY", rounds.as_str()),
    ];
    let mut relays: Vec<Seawall> = (0..3)
        .map(|_| Seawall::spawn(&["relay"], &env(&t.url, &nats.url(), &cfg)))
        .collect();
    wait_until(
        "a fifth of the rows to be published",
        Duration::from_secs(60),
        || async { worker::relay::pending_count(&t.db).await.unwrap() <= 4_000 },
    )
    .await;
    relays[0].kill9().await;
    wait_drained(&t.db, Duration::from_secs(60)).await;
    assert_eq!(unique_count(&stored_on(&js, SUBJECT).await), 5_000);

    wait_until(
        "the subscriber to see every row",
        Duration::from_secs(10),
        || async { publishes.lock().unwrap().len() == 5_000 },
    )
    .await;
    let repeated = publishes
        .lock()
        .unwrap()
        .values()
        .filter(|n| **n > 1)
        .count();
    // Only the killed relay's unfinished batches (one per round in flight)
    // may be published twice.
    assert!(
        repeated <= BATCH * ROUNDS_IN_FLIGHT,
        "{repeated} rows were published more than once"
    );
    eprintln!("three relays, one killed: {repeated} of 5000 rows republished after the kill");
    counting.abort();
    for relay in &mut relays[1..] {
        assert!(relay.terminate().await.success());
        relay.assert_no_panic();
    }
}

/// 200 events on 5 keys through 3 relays arrive in per-key commit order.
async fn events_with_an_ordering_key_arrive_in_commit_order(backend: Backend) {
    let (t, _nats, js) = with_ledger_stream(backend).await;
    let relays: Vec<Relay> = (0..3)
        .map(|i| {
            let config = RelayConfig {
                instance: format!("relay-{i}"),
                batch_size: 7,
                ..RelayConfig::default()
            };
            Relay::new(t.db.clone(), js.clone(), config, Arc::new(Notify::new()))
        })
        .collect();
    let cancel = tokio_util::sync::CancellationToken::new();
    let tasks: Vec<_> = relays
        .into_iter()
        .map(|r| {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                while !cancel.is_cancelled() {
                    r.relay_once().await.unwrap();
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for n in 0..200 {
        let key = format!("key-{}", n % 5);
        let txn = t.db.begin().await.unwrap();
        let event = NewEvent::new("ledger.ordered", format!("{key}:{n}")).with_ordering_key(key);
        Outbox::default().enqueue(&txn, event).await.unwrap();
        txn.commit().await.unwrap();
    }
    wait_drained(&t.db, Duration::from_secs(60)).await;
    cancel.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    let mut last: HashMap<String, i64> = HashMap::new();
    let events = stored_on(&js, "ledger.ordered").await;
    assert_eq!(events.len(), 200);
    for (_, payload) in events {
        let text = String::from_utf8(payload).unwrap();
        let (key, n) = text.split_once(':').unwrap();
        let n: i64 = n.parse().unwrap();
        let prev = last.insert(key.to_owned(), n).unwrap_or(-1);
        assert!(n > prev, "{key}: {n} arrived after {prev}");
    }
}
on_backends!(events_with_an_ordering_key_arrive_in_commit_order: sqlite, postgres);

/// Rows committed out of id order, and one rolled back, while the
/// relay runs. A relay that only reads "id > last seen" would skip the late
/// commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_committed_late_are_published_and_rolled_back_rows_never() {
    let (t, _nats, js) = with_ledger_stream(Backend::Postgres).await;
    let wake = Arc::new(Notify::new());
    let relay = Relay::new(
        t.db.clone(),
        js.clone(),
        RelayConfig {
            poll_interval: Duration::from_millis(50),
            ..RelayConfig::default()
        },
        wake,
    );
    let cancel = tokio_util::sync::CancellationToken::new();
    let running = {
        let cancel = cancel.clone();
        tokio::spawn(async move { relay.run(cancel).await })
    };
    let mut txns = Vec::new();
    for name in ["t1", "t2", "t3", "t4"] {
        let txn = t.db.begin().await.unwrap();
        Outbox::default()
            .enqueue(&txn, NewEvent::new(SUBJECT, name).with_message_id(name))
            .await
            .unwrap();
        txns.push(txn);
    }
    let mut txns = txns.into_iter();
    let (t1, t2, t3, t4) = (
        txns.next().unwrap(),
        txns.next().unwrap(),
        txns.next().unwrap(),
        txns.next().unwrap(),
    );
    let published = |n: usize| {
        let js = js.clone();
        async move { stored_on(&js, SUBJECT).await.len() >= n }
    };
    t3.commit().await.unwrap();
    wait_until("t3 to be published", Duration::from_secs(10), || {
        published(1)
    })
    .await;
    t1.commit().await.unwrap();
    wait_until("t1 to be published", Duration::from_secs(10), || {
        published(2)
    })
    .await;
    t2.rollback().await.unwrap();
    t4.commit().await.unwrap();
    wait_until("t4 to be published", Duration::from_secs(10), || {
        published(3)
    })
    .await;
    wait_drained(&t.db, Duration::from_secs(10)).await;
    cancel.cancel();
    running.await.unwrap();
    let mut ids: Vec<String> = stored_on(&js, SUBJECT)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["t1", "t3", "t4"]);
}

/// A row whose subject no stream captures keeps failing: each attempt is
/// recorded with the error and a backoff, and the attempt limit marks it dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_row_without_a_stream_is_retried_then_marked_dead() {
    let (t, _nats, js) = with_ledger_stream(Backend::Sqlite).await;
    let txn = t.db.begin().await.unwrap();
    Outbox::default()
        .enqueue(
            &txn,
            NewEvent::new("nowhere.to.go", "x").with_message_id("lost-1"),
        )
        .await
        .unwrap();
    Outbox::default()
        .enqueue(&txn, NewEvent::new(SUBJECT, "y").with_message_id("fine-1"))
        .await
        .unwrap();
    txn.commit().await.unwrap();
    let relay = Relay::new(
        t.db.clone(),
        js.clone(),
        RelayConfig {
            max_attempts: 3,
            retry_base: Duration::from_millis(1),
            retry_max: Duration::from_millis(5),
            ..RelayConfig::default()
        },
        Arc::new(Notify::new()),
    );
    let mut dead = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while dead == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the row was never marked dead"
        );
        dead += relay.relay_once().await.unwrap().dead;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    use sea_orm::EntityTrait;
    let rows = entity::outbox_message::Entity::find()
        .all(&t.db)
        .await
        .unwrap();
    let lost = rows.iter().find(|r| r.message_id == "lost-1").unwrap();
    assert_eq!(lost.attempts, 3);
    assert!(lost.dead_at.is_some() && lost.published_at.is_none());
    assert!(
        lost.last_error
            .as_deref()
            .unwrap_or("")
            .contains("nowhere.to.go"),
        "{:?}",
        lost.last_error
    );
    let fine = rows.iter().find(|r| r.message_id == "fine-1").unwrap();
    assert!(fine.published_at.is_some(), "other rows keep flowing");
    assert_eq!(
        worker::relay::pending_count(&t.db).await.unwrap(),
        0,
        "dead rows are not pending"
    );
}

/// NATS down: a round takes no row while the client is disconnected, so
/// nothing is published into the client's buffer (which holds such
/// publishes, unbounded, until it reconnects) and no row spends an attempt
/// or dies of an outage, however long (in WAL mode, rows the relay handed
/// to the table during a long outage would die of it too); once NATS is
/// back the row is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_takes_no_row_and_kills_none() {
    let (t, mut nats, js) = with_ledger_stream(Backend::Sqlite).await;
    enqueue_many(&t.db, 1, "outage").await;
    nats.stop();
    let connected = || js.client().connection_state() == async_nats::connection::State::Connected;
    wait_until(
        "the client sees NATS gone",
        Duration::from_secs(30),
        || async { !connected() },
    )
    .await;
    let relay = Relay::new(
        t.db.clone(),
        js.clone(),
        RelayConfig {
            max_attempts: 1,
            retry_base: Duration::from_millis(1),
            retry_max: Duration::from_millis(5),
            ..RelayConfig::default()
        },
        Arc::new(Notify::new()),
    );
    for _ in 0..3 {
        let report = relay.relay_once().await.unwrap();
        assert_eq!(report, worker::RelayReport::default());
    }
    use sea_orm::EntityTrait;
    let row = entity::outbox_message::Entity::find()
        .one(&t.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((row.attempts, row.dead_at, row.last_error), (0, None, None));
    nats.restart().await;
    wait_until("the client is back", Duration::from_secs(60), || async {
        connected()
    })
    .await;
    wait_until("the row is published", Duration::from_secs(60), || async {
        relay.relay_once().await.unwrap();
        worker::relay::pending_count(&t.db).await.unwrap() == 0
    })
    .await;
}

/// Payloads of this size, 18 to a batch of at most 16 MiB.
const LARGE_ROW: usize = 900 << 10;

/// Rows of 900 KiB: a round takes at most
/// `service::relay::store::BATCH_BYTES` of them (500 would be 440 MiB in
/// the relay's memory) and says it was cut, so the next round is due at
/// once (`RelayReport::more_waiting`, unit-tested in the worker); rounds
/// publish all 40.
async fn large_rows_go_in_batches_bounded_in_bytes_back_to_back(backend: Backend) {
    let (t, _nats, js) = with_ledger_stream(backend).await;
    let txn = t.db.begin().await.unwrap();
    let events = (0..40).map(|i| {
        NewEvent::new(SUBJECT, vec![b'x'; LARGE_ROW]).with_message_id(format!("large-row-{i}"))
    });
    Outbox::default().enqueue_all(&txn, events).await.unwrap();
    txn.commit().await.unwrap();
    let batch = service::relay::Batch::take(&t.db, "probe".into(), Duration::from_secs(30), 500)
        .await
        .unwrap();
    assert_eq!((batch.rows.len(), batch.cut), (18, true));
    let ids = batch.rows.iter().map(|r| r.id).collect();
    batch.finish(ids).await.unwrap();
    let relay = Relay::new(
        t.db.clone(),
        js,
        RelayConfig::default(),
        Arc::new(Notify::new()),
    );
    let first = relay.relay_once().await.unwrap();
    assert_eq!((first.claimed, first.cut), (18, true));
    assert!(first.more_waiting(RelayConfig::default().batch_size));
    wait_until("every row published", Duration::from_secs(120), || async {
        relay.relay_once().await.unwrap();
        worker::relay::pending_count(&t.db).await.unwrap() == 0
    })
    .await;
}
on_backends!(large_rows_go_in_batches_bounded_in_bytes_back_to_back: sqlite, postgres, mysql);

/// Start-up refuses a duplicate window shorter than the relay lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_window_shorter_than_the_lease_stops_startup() {
    let t = TestDb::new(Backend::Sqlite).await;
    let nats = NatsServer::start().await;
    let cfg = [
        ("SEAWALL_DUPLICATE_WINDOW_MS", "1000"),
        ("SEAWALL_RELAY_LEASE_MS", "5000"),
    ];
    let mut relay = Seawall::spawn(&["relay"], &env(&t.url, &nats.url(), &cfg));
    assert!(!relay.wait().await.success());
    let log = relay.log_text();
    assert!(
        log.contains("duplicate window") && log.contains("SEAWALL_DUPLICATE_WINDOW_MS"),
        "{log}"
    );
    relay.assert_no_panic();
}
