//! The WAL relay's windows have bounds: a transaction with more ordering
//! keys than a statement can bind, one larger than memory should hold, and
//! a relay stopped in the middle of one (by SIGTERM, or during a NATS
//! outage) all end with every event published once, in order.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream;
use entity::outbox_message;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter};

use crate::helpers::{ledger_stream, stored_on, with_ledger_stream};
use crate::support::domain::{LEDGER_STREAM, RECORDED_SUBJECT};
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, pg_count};
use crate::wal::{
    WAL_DUPLICATE_WINDOW as DUPLICATE_WINDOW, commit_events, drop_slot, recorded, recorded_past,
    slot_of, until_held, wal_env, wal_position,
};

/// Messages in the ledger stream.
pub(crate) async fn stream_messages(js: &jetstream::Context) -> u64 {
    match js.get_stream(LEDGER_STREAM).await {
        Ok(mut stream) => stream.info().await.map_or(0, |i| i.state.messages),
        Err(_) => 0,
    }
}

/// Rows of `outbox_message` not yet published.
async fn pending_rows(db: &DatabaseConnection) -> u64 {
    outbox_message::Entity::find()
        .filter(outbox_message::Column::PublishedAt.is_null())
        .count(db)
        .await
        .unwrap()
}

/// Polls `check` until it holds; on timeout fails with the relay's log.
pub(crate) async fn until<F, Fut>(relay: &Seawall, what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; the relay's log:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The ids of `recorded` events in the stream, in stream order.
async fn stored_ids(js: &jetstream::Context) -> Vec<String> {
    stored_on(js, RECORDED_SUBJECT)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// One transaction of 70,000 events with as many ordering keys: the keys
/// waiting behind rows of the table are asked for in statements of bounded
/// size (PostgreSQL binds at most 65,535 values in one).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_with_seventy_thousand_keys_is_relayed() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    worker::relay::wal::prepare(&t.db, &slot_of(&t))
        .await
        .unwrap();
    let mut relay = Seawall::spawn(&["relay"], &wal_env(&t, &nats.url(), &[]));
    let events = (0..70_000)
        .map(|i| recorded(&format!("wide-{i}"), Some(&format!("key-{i}"))))
        .collect();
    commit_events(&t.db, events).await;
    until(
        &relay,
        "70,000 events in the stream",
        Duration::from_secs(120),
        || async { stream_messages(&js).await >= 70_000 },
    )
    .await;
    assert_eq!(pending_rows(&t.db).await, 0);
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
    drop_slot(&t);
}

/// Peak resident memory of a process, in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .unwrap()
        .to_owned();
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024
}

/// Events of [`LARGE_EVENT`] bytes in the large transaction: 384 MiB.
const LARGE_EVENTS: usize = 6144;
const LARGE_EVENT: usize = 64 << 10;
/// What the relay may take while relaying it: the process itself (about
/// 60 MiB in a debug build), three windows of 16 MiB, 8 MiB read ahead,
/// 8 buffered replication messages and a window's publishes in the NATS
/// client, with room for the allocator; well below the transaction
/// (measured 150-164 MiB; 441 MiB without pieces).
const LARGE_RSS_BOUND_MIB: u64 = 256;

/// A transaction of 384 MiB (6,144 events of 64 KiB, each its own
/// `enqueue_all`) goes in pieces: the relay's peak memory stays within
/// [`LARGE_RSS_BOUND_MIB`], and every event is published once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_larger_than_memory_should_hold_goes_in_pieces() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    worker::relay::wal::prepare(&t.db, &slot_of(&t))
        .await
        .unwrap();
    let mut relay = Seawall::spawn(&["relay"], &wal_env(&t, &nats.url(), &[]));
    let txn = sea_orm::TransactionTrait::begin(&t.db).await.unwrap();
    let outbox = service::Outbox::new(service::OutboxMode::Wal);
    for i in 0..LARGE_EVENTS {
        // Incompressible enough: each event's bytes differ.
        let payload: Vec<u8> = (0..LARGE_EVENT)
            .map(|j| (i.wrapping_mul(31) ^ j.wrapping_mul(7)) as u8)
            .collect();
        let event =
            service::NewEvent::new(RECORDED_SUBJECT, payload).with_message_id(format!("large-{i}"));
        outbox.enqueue_all(&txn, [event]).await.unwrap();
    }
    txn.commit().await.unwrap();
    until(
        &relay,
        "every large event in the stream",
        Duration::from_secs(300),
        || async { stream_messages(&js).await >= LARGE_EVENTS as u64 },
    )
    .await;
    let peak = peak_rss_mib(relay.pid());
    println!("relay peak RSS relaying a 384 MiB transaction: {peak} MiB");
    assert!(
        peak <= LARGE_RSS_BOUND_MIB,
        "the relay's peak RSS was {peak} MiB relaying a 384 MiB transaction"
    );
    assert_eq!(stream_messages(&js).await, LARGE_EVENTS as u64);
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
    drop_slot(&t);
}

/// Events of [`SLOT_EVENT`] bytes per `enqueue_all` in the slot test: a
/// 32 MiB call, which the relay once read as one replication message.
const SLOT_EVENTS_PER_CALL: usize = 32;
/// Just under nats-server's default payload limit.
const SLOT_EVENT: usize = 1020 << 10;

/// Megabyte events, 32 to an `enqueue_all` and one call to a transaction,
/// wait in the slot while NATS is down (384 MiB by default;
/// `SEAWALL_TEST_SLOT_MIB` sets more): the relay holds its window, then
/// hands the windows to the table past `WAL_HANDOFF_MS` (3 s;
/// `SEAWALL_TEST_SLOT_HANDOFF_MS` sets it), reading the whole slot through. Its peak memory stays within [`LARGE_RSS_BOUND_MIB`]:
/// each call is written as messages of 1 MiB and the read-ahead is bounded
/// in bytes. Without the split, 8 buffered messages are 256 MiB; with 256
/// buffered messages of 1 MiB, as before, 256 MiB on their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_of_megabyte_events_waits_in_bounded_memory_while_nats_is_down() {
    let mib: usize = std::env::var("SEAWALL_TEST_SLOT_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(384);
    // A hand-over later than the writes take leaves all of them waiting
    // in the slot first (for the figure; the bound holds either way).
    let handoff = std::env::var("SEAWALL_TEST_SLOT_HANDOFF_MS").unwrap_or_else(|_| "3000".into());
    let calls = (mib << 20).div_ceil(SLOT_EVENTS_PER_CALL * SLOT_EVENT);
    let (t, mut nats, _js) = with_ledger_stream(Backend::Postgres).await;
    let env = wal_env(&t, &nats.url(), &[("SEAWALL_WAL_HANDOFF_MS", &handoff)]);
    let mut relay = Seawall::spawn(&["relay"], &env);
    until_held(&relay, &t, Duration::from_secs(60)).await;
    nats.stop();
    let outbox = service::Outbox::new(service::OutboxMode::Wal);
    for c in 0..calls {
        let events = (0..SLOT_EVENTS_PER_CALL).map(|i| {
            let n = c * SLOT_EVENTS_PER_CALL + i;
            service::NewEvent::new(RECORDED_SUBJECT, vec![(n % 251) as u8; SLOT_EVENT])
                .with_message_id(format!("slot-{n}"))
        });
        let txn = sea_orm::TransactionTrait::begin(&t.db).await.unwrap();
        outbox.enqueue_all(&txn, events).await.unwrap();
        txn.commit().await.unwrap();
    }
    let waiting = service::wal::backlog(&t.db, &slot_of(&t))
        .await
        .unwrap()
        .map_or(0, |b| b.behind_bytes >> 20);
    println!("the slot is {waiting} MiB behind once the writes end");
    let all = (calls * SLOT_EVENTS_PER_CALL) as i64;
    until(
        &relay,
        "every event handed to the table",
        Duration::from_secs(900),
        || async { pg_count(&t.db, "SELECT count(*) FROM outbox_message").await == all },
    )
    .await;
    let peak = peak_rss_mib(relay.pid());
    println!("relay peak RSS with {mib} MiB of 1 MiB events in the slot and NATS down: {peak} MiB");
    assert!(
        peak <= LARGE_RSS_BOUND_MIB,
        "the relay's peak RSS was {peak} MiB with {mib} MiB in the slot"
    );
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
    drop_slot(&t);
}

/// Tries of a window during an outage the next test waits for.
const OUTAGE_TRIES: usize = 5;

/// A window waits out a NATS outage shorter than the hand-over (the
/// relay's connection cut by a proxy), tried again every 50 ms: nothing of
/// it goes into the disconnected client, whose buffer would keep each
/// try's publishes and send them all on reconnecting (past the duplicate
/// window, after a long outage, as copies in the stream). The proxy sees
/// each event sent once (with every try sent, [`OUTAGE_TRIES`] copies and
/// more).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_window_waiting_out_an_outage_sends_nothing_into_the_disconnected_client() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    let upstream: std::net::SocketAddr = nats.url().trim_start_matches("nats://").parse().unwrap();
    let proxy = crate::support::proxy::Proxy::start(upstream).await;
    let via_proxy = format!("nats://{}", proxy.addr);
    let env = wal_env(
        &t,
        &via_proxy,
        &[
            ("SEAWALL_WAL_HANDOFF_MS", "3600000"),
            ("SEAWALL_RELAY_RETRY_MAX_MS", "50"),
        ],
    );
    let mut relay = Seawall::spawn(&["relay"], &env);
    until_held(&relay, &t, Duration::from_secs(60)).await;
    proxy.cut();
    until(
        &relay,
        "the relay to see NATS gone",
        Duration::from_secs(60),
        || async { relay.log_text().contains("event=disconnected") },
    )
    .await;
    let tries = || {
        relay
            .log_text()
            .matches("the WAL window's unacknowledged events go again")
            .count()
    };
    let before = tries();
    let ids: Vec<String> = (0..16).map(|i| format!("waiting-{i}")).collect();
    commit_events(&t.db, ids.iter().map(|id| recorded(id, None)).collect()).await;
    let end = wal_position(&t).await;
    until(
        &relay,
        "the window tried again and again",
        Duration::from_secs(600),
        || async { tries() >= before + OUTAGE_TRIES },
    )
    .await;
    proxy.count_sent(b"PUB ledger.recorded ");
    proxy.restore();
    until(
        &relay,
        "the window published and recorded",
        Duration::from_secs(120),
        || async { recorded_past(&t, end).await },
    )
    .await;
    // Everything the relay sent went through the proxy before its PubAcks.
    assert_eq!(proxy.sent(), ids.len(), "each event sent once");
    assert_published_once_in_order(&relay, &t, &js, &ids).await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
    drop_slot(&t);
}

/// NATS down, with a row of key `k` waiting in the table: a window whose
/// events all queue behind it goes to the table at once, as it would with
/// NATS up; only a window with something to publish waits for NATS (here
/// for an hour, the hand-over's delay).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_behind_a_held_key_go_to_the_table_while_nats_is_down() {
    let (t, mut nats, _js) = with_ledger_stream(Backend::Postgres).await;
    let env = wal_env(&t, &nats.url(), &[("SEAWALL_WAL_HANDOFF_MS", "3600000")]);
    let mut relay = Seawall::spawn(&["relay"], &env);
    until_held(&relay, &t, Duration::from_secs(60)).await;
    nats.stop();
    // As a window handed over earlier leaves it.
    let head = service::wal::WalEvent {
        message_id: "head".into(),
        subject: RECORDED_SUBJECT.into(),
        ordering_key: Some("k".into()),
        headers: std::collections::BTreeMap::new(),
        payload: b"{}".to_vec().into(),
        causation_id: None,
        causation_consumer: None,
        correlation_id: None,
        created_at: chrono::Utc::now(),
    };
    outbox_message::Entity::insert(service::outbox::row_of(head).unwrap())
        .exec(&t.db)
        .await
        .unwrap();
    commit_events(&t.db, vec![recorded("behind", Some("k"))]).await;
    until(
        &relay,
        "the event queued behind its key in the table",
        Duration::from_secs(60),
        || async { pending_rows(&t.db).await == 2 },
    )
    .await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
    drop_slot(&t);
}

/// A nats-server with the ledger stream and the WAL tests' duplicate
/// window: a republished event shows up as a second copy once it has
/// passed.
async fn short_window_nats() -> (NatsServer, jetstream::Context) {
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    worker::ensure_stream(&js, &ledger_stream(DUPLICATE_WINDOW))
        .await
        .unwrap();
    (nats, js)
}

/// The duplicate window the stream has, however the relay provisioned it.
async fn duplicate_window(js: &jetstream::Context) -> Duration {
    let mut stream = js.get_stream(LEDGER_STREAM).await.unwrap();
    stream.info().await.unwrap().config.duplicate_window
}

/// Commits `messages` calls of `enqueue_all`, each of `per_message` events
/// of ordering key `k`, in one transaction; returns their ids in order.
pub(crate) async fn commit_one_key(
    db: &DatabaseConnection,
    messages: usize,
    per_message: usize,
) -> Vec<String> {
    let txn = sea_orm::TransactionTrait::begin(db).await.unwrap();
    let outbox = service::Outbox::new(service::OutboxMode::Wal);
    let mut ids = Vec::new();
    for m in 0..messages {
        let events: Vec<_> = (0..per_message)
            .map(|i| recorded(&format!("one-key-{}", m * per_message + i), Some("k")))
            .collect();
        ids.extend(events.iter().map(|e| e.message_id.clone()));
        outbox.enqueue_all(&txn, events).await.unwrap();
    }
    txn.commit().await.unwrap();
    ids
}

/// Waits until `ids.len()` events are in the stream and no row waits in
/// the table, then asserts the stream holds exactly `ids`, in order: an
/// event published twice, missing or out of order fails it.
pub(crate) async fn assert_published_once_in_order(
    relay: &Seawall,
    t: &TestDb,
    js: &jetstream::Context,
    ids: &[String],
) {
    assert_published_in_order(relay, t, js, ids, 0).await;
}

/// As [`assert_published_once_in_order`], but up to `strays` events may
/// also be stored a second time, anywhere after their first copy: what a
/// relay had handed to its NATS client when it was frozen goes out when it
/// wakes (the inbox takes such a copy for the duplicate it is). Every
/// event's first copy must still be there, once and in order.
pub(crate) async fn assert_published_in_order(
    relay: &Seawall,
    t: &TestDb,
    js: &jetstream::Context,
    ids: &[String],
    strays: usize,
) {
    until(
        relay,
        "every event in the stream and no row waiting",
        Duration::from_secs(300),
        || async {
            stream_messages(js).await >= ids.len() as u64 && pending_rows(&t.db).await == 0
        },
    )
    .await;
    let stored = stored_ids(js).await;
    let mut seen = std::collections::HashSet::new();
    let first: Vec<&String> = stored.iter().filter(|id| seen.insert(*id)).collect();
    assert!(
        stored.len() <= ids.len() + strays,
        "events stored: {} of {} ({} copies allowed)",
        stored.len(),
        ids.len(),
        strays
    );
    assert!(
        first.iter().copied().eq(ids.iter()),
        "the stream does not hold the key's events in order ({} distinct of {})",
        first.len(),
        ids.len()
    );
}

/// SIGTERM while a 4,000-event transaction of one ordering key is being
/// published (four messages, windows of 1,000, so the first window is a
/// piece of it): the
/// relay starts no further round, hands what it did not publish to the
/// table with the piece's progress, and exits. Started again after the
/// duplicate window has passed, it skips the piece's messages, and every
/// event is published once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_in_a_large_window_hands_the_rest_to_the_table() {
    let t = TestDb::new(Backend::Postgres).await;
    let (nats, js) = short_window_nats().await;
    worker::relay::wal::prepare(&t.db, &slot_of(&t))
        .await
        .unwrap();
    let env = wal_env(&t, &nats.url(), &[("SEAWALL_WAL_WINDOW", "1000")]);
    let mut relay = Seawall::spawn(&["relay"], &env);
    let ids = commit_one_key(&t.db, 4, 1_000).await;
    until(
        &relay,
        "300 events published",
        Duration::from_secs(120),
        || async { stream_messages(&js).await >= 300 },
    )
    .await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    let at_exit = stream_messages(&js).await;
    assert!(
        at_exit < 1_000,
        "the relay published {at_exit} events after SIGTERM instead of stopping between rounds"
    );
    assert!(
        pending_rows(&t.db).await > 0,
        "nothing was handed to the table"
    );
    // Past the duplicate window, JetStream would store a copy.
    tokio::time::sleep(DUPLICATE_WINDOW + Duration::from_secs(1)).await;
    let mut relay = Seawall::spawn(&["relay"], &env);
    assert_published_once_in_order(&relay, &t, &js, &ids).await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
    drop_slot(&t);
}

/// NATS stops after about 1,000 of a 3,000-event single-key transaction;
/// the relay waits the outage out past the duplicate window, gets SIGTERM,
/// and both start again: the 1,000 acknowledged events are not published
/// a second time, and the key's order holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_events_survive_an_outage_and_a_sigterm() {
    let t = TestDb::new(Backend::Postgres).await;
    let (mut nats, js) = short_window_nats().await;
    worker::relay::wal::prepare(&t.db, &slot_of(&t))
        .await
        .unwrap();
    let env = wal_env(&t, &nats.url(), &[]);
    let mut relay = Seawall::spawn(&["relay"], &env);
    let ids = commit_one_key(&t.db, 1, 3_000).await;
    until(
        &relay,
        "1,000 events published",
        Duration::from_secs(120),
        || async { stream_messages(&js).await >= 1_000 },
    )
    .await;
    assert_eq!(duplicate_window(&js).await, DUPLICATE_WINDOW);
    nats.stop();
    // The relay waits the outage out (or, when the server answered "no
    // stream" as it went down, has handed the rest to the table) past the
    // duplicate window.
    tokio::time::sleep(DUPLICATE_WINDOW * 2).await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    nats.restart().await;
    let js = nats.jetstream().await;
    let mut relay = Seawall::spawn(&["relay"], &env);
    assert_published_once_in_order(&relay, &t, &js, &ids).await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
    drop_slot(&t);
}
