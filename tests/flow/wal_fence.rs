//! A relay frozen past `wal_sender_timeout` loses the slot to a standby.
//! Woken, it must not go on publishing the window it held: the standby
//! published that window already, and copies past the duplicate window
//! would be stored twice, and a key's events out of order.

use std::time::Duration;

use crate::helpers::ledger_stream;
use crate::support::TestDb;
use crate::support::nats::NatsServer;
use crate::support::postgres::PrivatePostgres;
use crate::support::process::Seawall;
use crate::wal::{recorded_past, slot_holder, slot_of, until_held, wal_env, wal_position};
use crate::wal_windows::{assert_published_in_order, commit_one_key, stream_messages, until};

/// Long enough for a standby to take over and publish the held window
/// again within it (so what both published before the freeze is one copy),
/// short enough to wait out before the frozen relay wakes.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(10);

/// The holder is frozen (SIGSTOP) in the middle of a window of 3,000 events
/// of one ordering key; PostgreSQL ends its session after 2 s, the standby
/// takes the slot and publishes the window; past the duplicate window the
/// holder is woken (SIGCONT). It finds another session holds the slot and
/// stops before its next round: the stream holds each event in order, and
/// at most the one event the holder had in hand at the freeze twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_woken_after_a_standby_took_over_publishes_no_further_round() {
    let pg = PrivatePostgres::start(&["wal_level=logical", "wal_sender_timeout=2s"]);
    let t = TestDb::on_postgres(&pg.url).await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    worker::ensure_stream(&js, &ledger_stream(DUPLICATE_WINDOW))
        .await
        .unwrap();
    worker::relay::wal::prepare(&t.db, &slot_of(&t))
        .await
        .unwrap();
    let env = wal_env(&t, &nats.url(), &[("SEAWALL_DUPLICATE_WINDOW_MS", "10000")]);
    let mut holder = Seawall::spawn(&["relay"], &env);
    until_held(&holder, &t, Duration::from_secs(60)).await;
    let first = slot_holder(&t).await;
    let mut standby = Seawall::spawn(&["relay"], &env);
    let ids = commit_one_key(&t.db, 1, 3_000).await;
    let committed = wal_position(&t).await;
    until(
        &holder,
        "300 events published",
        Duration::from_secs(60),
        || async { stream_messages(&js).await >= 300 },
    )
    .await;
    holder.freeze();
    assert!(
        stream_messages(&js).await < 3_000,
        "the holder published the whole window before it was frozen"
    );
    until(
        &standby,
        "the standby publishes the window",
        Duration::from_secs(60),
        || async {
            let held = slot_holder(&t).await;
            held.is_some()
                && held != first
                && stream_messages(&js).await >= 3_000
                && recorded_past(&t, committed).await
        },
    )
    .await;
    tokio::time::sleep(DUPLICATE_WINDOW + Duration::from_secs(1)).await;
    holder.thaw();
    until(
        &holder,
        "the woken relay's session ends",
        Duration::from_secs(60),
        || async { holder.log_text().contains("WAL relay session ended") },
    )
    .await;
    // The one event the holder may have handed to its client between its
    // last clock reading and the freeze goes out when it wakes: JetStream
    // cannot tell it from a new one past the duplicate window, and no
    // check the relay makes can call it back (see docs/outbox.md). Its
    // whole window (2,700 events) would go out without the fence.
    assert_published_in_order(&standby, &t, &js, &ids, 1).await;
    for relay in [&mut holder, &mut standby] {
        assert!(relay.terminate().await.success(), "{}", relay.log_text());
        relay.assert_no_panic();
    }
}

/// On a server left at PostgreSQL's default `wal_sender_timeout` (60 s),
/// a frozen holder keeps the slot only as long as the relay's lease (2.5 s
/// here): the relay sets the timeout on its own connection, so a standby
/// takes over well within the duplicate window. Without it the standby
/// waits the server's full minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_holder_loses_the_slot_within_the_relay_lease() {
    let t = TestDb::new(crate::support::Backend::Postgres).await;
    let nats = NatsServer::start().await;
    worker::relay::wal::prepare(&t.db, &slot_of(&t))
        .await
        .unwrap();
    let env = wal_env(&t, &nats.url(), &[]);
    let mut holder = Seawall::spawn(&["relay"], &env);
    until_held(&holder, &t, Duration::from_secs(60)).await;
    let first = slot_holder(&t).await;
    let mut standby = Seawall::spawn(&["relay"], &env);
    holder.freeze();
    // Half the server's default: a standby that waited it out fails here.
    until(
        &standby,
        "the standby takes the slot",
        Duration::from_secs(30),
        || async {
            let held = slot_holder(&t).await;
            held.is_some() && held != first
        },
    )
    .await;
    holder.thaw();
    for relay in [&mut holder, &mut standby] {
        assert!(relay.terminate().await.success(), "{}", relay.log_text());
        relay.assert_no_panic();
    }
    crate::wal::drop_slot(&t);
}
