//! A WAL slot's life: made by the first WAL-mode process while other
//! clients write, and lost under seawall (dropped, or invalidated by
//! `max_slot_wal_keep_size`, after which PostgreSQL refuses to decode from
//! it for good; run on a PostgreSQL server of the test's own, since the
//! setting would invalidate every lagging slot on the shared one).

use std::time::Duration;

use async_nats::jetstream;
use sea_orm::ConnectionTrait;

use crate::helpers::stored_on;
use crate::support::domain::RECORDED_SUBJECT;
use crate::support::postgres::{BIN, PrivatePostgres};
use crate::support::process::Seawall;
use crate::support::proxy::{Proxy, upstream_of};
use crate::support::{Backend, TestDb, pg_count, wait_until};
use crate::wal::{
    commit_events, drop_slot, recorded, recorded_past, slot_holder, slot_of, until_held, wal_env,
    wal_env_on, wal_position,
};
use crate::wal_windows::until;

/// The first WAL-mode process makes the slot while four `pgbench` clients
/// commit single-row inserts as fast as they can. A change committed after
/// the slot's start is decoded against the publication as it was then: a
/// slot made before its publication meets a change it cannot decode ("the
/// publication does not exist") and never gets past it. Every event
/// committed once the relay holds the slot is relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_first_relay_starts_under_busy_writers() {
    let t = TestDb::new(Backend::Postgres).await;
    let (nats, js) = crate::helpers::ledger_nats().await;
    t.db.execute_unprepared("CREATE TABLE busy (id bigserial PRIMARY KEY, v int)")
        .await
        .unwrap();
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), "INSERT INTO busy (v) VALUES (1);\n").unwrap();
    let writers = Writers(
        std::process::Command::new(format!("{BIN}/pgbench"))
            .args(["-n", "-c", "4", "-j", "2", "-T", "600", "-f"])
            .arg(script.path())
            .arg(&t.url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("the writers commit", Duration::from_secs(30), || async {
        pg_count(&t.db, "SELECT count(*) FROM busy").await > 1000
    })
    .await;
    let mut relay = Seawall::spawn(&["relay"], &wal_env(&t, &nats.url(), &[]));
    // The slot's creation waits for the writers' transactions running at
    // its start, which takes a few of PostgreSQL's 15 s snapshots.
    until_held(&relay, &t, Duration::from_secs(120)).await;
    for batch in 0..20 {
        let events = (0..10)
            .map(|i| recorded(&format!("busy-{batch}-{i}"), None))
            .collect();
        commit_events(&t.db, events).await;
    }
    let relayed = || async {
        stored_on(&js, RECORDED_SUBJECT)
            .await
            .iter()
            .filter(|(id, _)| id.starts_with("busy-"))
            .count()
    };
    let all = tokio::time::timeout(Duration::from_secs(120), async {
        while relayed().await < 200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        all.is_ok(),
        "{} of 200 events relayed; the relay's log:\n{}",
        relayed().await,
        relay.log_text()
    );
    drop(writers);
    let log = relay.log_text();
    assert!(relay.terminate().await.success(), "{log}");
    relay.assert_no_panic();
    drop_slot(&t);
}

/// `pgbench`, stopped when the test ends however it ends.
struct Writers(std::process::Child);

impl Drop for Writers {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Losses recorded with both positions, the new slot after the old.
const LOSSES: &str =
    "SELECT count(*) FROM wal_slot_loss WHERE relayed_to > 0 AND restarted_at > relayed_to";

/// PostgreSQL invalidates the slot while its relay is stopped: the relay
/// started again drops and makes it again, records the loss from the
/// position it had relayed to, and relays every event written after. Then
/// the same while a relay runs but lags.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_invalidated_slot_is_made_again_and_its_loss_recorded() {
    let pg = PrivatePostgres::start(&[
        "wal_level=logical",
        "max_slot_wal_keep_size=1MB",
        "max_wal_size=64MB",
    ]);
    let t = TestDb::on_postgres(&pg.url).await;
    let (nats, js) = crate::helpers::ledger_nats().await;
    let cfg = wal_env(&t, &nats.url(), &[]);
    let mut relay = Seawall::spawn(&["relay"], &cfg);
    relays_after_its_slot(&t, &js, "before").await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    invalidate(&t).await;
    let mut relay = Seawall::spawn(&["relay"], &cfg);
    relays_after_its_slot(&t, &js, "after").await;
    assert_eq!(pg_count(&t.db, LOSSES).await, 1);
    assert!(
        relay.log_text().contains("relayed_to="),
        "{}",
        relay.log_text()
    );

    // The same under a running relay that has fallen behind (frozen here):
    // PostgreSQL ends its session to invalidate the slot, and the relay,
    // going on, finds it lost and makes it again.
    relay.freeze();
    invalidate(&t).await;
    relay.thaw();
    wait_until(
        "the loss under the relay recorded",
        Duration::from_secs(60),
        || async { pg_count(&t.db, LOSSES).await == 2 },
    )
    .await;
    relays_after_its_slot(&t, &js, "later").await;
    let log = relay.log_text();
    assert!(relay.terminate().await.success(), "{log}");
    relay.assert_no_panic();
}

/// A slot dropped by hand while a relay starts streaming from it:
/// `START_REPLICATION` fails with `undefined_object`, the code a
/// publication missing at decoding time has too. The relay says the slot
/// is gone (not that it can never be read, nor to drop it), makes it
/// again, and relays what is written after. The proxy holds the relay's
/// `START_REPLICATION` back while the test drops the slot, so the order is
/// certain.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_dropped_under_the_relay_is_not_taken_for_a_missing_publication() {
    let t = TestDb::new(Backend::Postgres).await;
    let (nats, js) = crate::helpers::ledger_nats().await;
    let upstream = upstream_of(&t.url);
    let proxy = Proxy::start(upstream).await;
    let cfg = wal_env_on(&proxy.url_for(&t.url, upstream), &nats.url(), &[]);
    proxy.hold_next(b"START_REPLICATION");
    let mut relay = Seawall::spawn(&["relay"], &cfg);
    proxy.until_held().await;
    let slot = slot_of(&t);
    t.db.execute_unprepared(&format!("SELECT pg_drop_replication_slot('{slot}')"))
        .await
        .unwrap();
    proxy.release();
    until(
        &relay,
        "the relay meets its slot missing",
        Duration::from_secs(60),
        || async {
            relay
                .log_text()
                .contains("dropped while the relay reconnected")
        },
    )
    .await;
    relays_after_its_slot(&t, &js, "after").await;
    let log = relay.log_text();
    assert!(!log.contains("--drop-slot` and start again"), "{log}");
    assert!(relay.terminate().await.success(), "{log}");
    relay.assert_no_panic();
    drop_slot(&t);
}

/// The slot's confirmed position, as a number.
async fn confirmed(t: &TestDb) -> i64 {
    pg_count(
        &t.db,
        &format!(
            "SELECT COALESCE(pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint, 0) \
               FROM pg_replication_slots WHERE slot_name = '{}'",
            slot_of(t)
        ),
    )
    .await
}

/// Moves the slot's confirmed position past WAL written now, as a relay
/// confirming a keepalive does.
async fn advance(t: &TestDb) {
    for sql in [
        // Flushed at once: the slot is not advanced past the flush position.
        "BEGIN; SET LOCAL synchronous_commit = on; \
         SELECT pg_logical_emit_message(true, 'test', 'x'); COMMIT"
            .to_owned(),
        format!(
            "SELECT pg_replication_slot_advance('{}', pg_current_wal_lsn())",
            slot_of(t)
        ),
    ] {
        t.db.execute_unprepared(&sql).await.unwrap();
    }
}

/// A slot confirmed past the position its relays recorded was remade (they
/// record each position before confirming it): a loss, recorded from the
/// recorded position to the slot's. But not while the last session to take
/// the slot was of a release that confirms positions it never records
/// (keepalives), as a previous release's relay does: its `generation` bump
/// leaves `recorded_generation` behind. Without the generation check the
/// first `prepare` records a false loss; without the check in a session's
/// take-over, the loss is not found there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_confirmed_past_its_record_is_a_loss_unless_an_older_release_confirmed_it() {
    let t = TestDb::new(Backend::Postgres).await;
    let slot = slot_of(&t);
    worker::relay::wal::prepare(&t.db, &slot).await.unwrap();
    let start = confirmed(&t).await;
    // A previous release's relay takes the slot over and confirms a
    // keepalive it does not record.
    t.db.execute_unprepared("UPDATE wal_relay_position SET generation = generation + 1")
        .await
        .unwrap();
    advance(&t).await;
    assert!(confirmed(&t).await > start);
    worker::relay::wal::prepare(&t.db, &slot).await.unwrap();
    assert_eq!(
        pg_count(&t.db, "SELECT count(*) FROM wal_slot_loss").await,
        0
    );
    // A session of this release caught up and recorded; then the slot moves
    // past the record behind its back.
    t.db.execute_unprepared(&format!(
        "UPDATE wal_relay_position SET recorded_generation = generation, \
           lsn = {}",
        confirmed(&t).await
    ))
    .await
    .unwrap();
    let recorded_at = confirmed(&t).await;
    advance(&t).await;
    let ahead = confirmed(&t).await;
    // Found by the next session as it takes the slot, whether or not a
    // `prepare` ran before it.
    let (_, found) = service::wal::relay::take_over(&t.db, &slot).await.unwrap();
    assert!(found.is_some());
    let loss = format!(
        "SELECT count(*) FROM wal_slot_loss WHERE relayed_to = {recorded_at} AND restarted_at = {ahead}"
    );
    assert_eq!(pg_count(&t.db, &loss).await, 1);
    // Recorded once: the position moved to the slot's.
    worker::relay::wal::prepare(&t.db, &slot).await.unwrap();
    assert_eq!(
        pg_count(&t.db, "SELECT count(*) FROM wal_slot_loss").await,
        1
    );
    drop_slot(&t);
}

/// The slot dropped while its relay is stopped and made again by hand
/// (`pg_create_logical_replication_slot`), as an operator or Patroni
/// would: the events committed in between are lost, and the relay started
/// again records the loss, then relays what came after. Before that, a
/// relay stopped and prepared again after confirming keepalives finds no
/// loss: it recorded each position before it confirmed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_remade_by_hand_is_a_recorded_loss() {
    let t = TestDb::new(Backend::Postgres).await;
    let (nats, js) = crate::helpers::ledger_nats().await;
    let slot = slot_of(&t);
    let cfg = wal_env(&t, &nats.url(), &[]);
    let mut relay = Seawall::spawn(&["relay"], &cfg);
    relays_after_its_slot(&t, &js, "first").await;
    let committed = wal_position(&t).await;
    wait_until(
        "a keepalive confirmed past the events",
        Duration::from_secs(60),
        || async { confirmed(&t).await > committed },
    )
    .await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    worker::relay::wal::prepare(&t.db, &slot).await.unwrap();
    assert_eq!(
        pg_count(&t.db, "SELECT count(*) FROM wal_slot_loss").await,
        0
    );

    t.db.execute_unprepared(&format!("SELECT pg_drop_replication_slot('{slot}')"))
        .await
        .unwrap();
    let lost = (0..10)
        .map(|i| recorded(&format!("lost-{i}"), None))
        .collect();
    commit_events(&t.db, lost).await;
    t.db.execute_unprepared(&format!(
        "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
    ))
    .await
    .unwrap();
    let mut relay = Seawall::spawn(&["relay"], &cfg);
    relays_after_its_slot(&t, &js, "after").await;
    assert_eq!(pg_count(&t.db, LOSSES).await, 1, "{}", relay.log_text());
    assert!(
        relay.log_text().contains("were not relayed"),
        "{}",
        relay.log_text()
    );
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
    drop_slot(&t);
}

/// Once a relay holds a slot, ten events committed with ids `prefix-N`
/// reach the stream and the relay records its position.
async fn relays_after_its_slot(t: &TestDb, js: &jetstream::Context, prefix: &str) {
    wait_until(
        "a relay holds the slot",
        Duration::from_secs(30),
        || async { slot_holder(t).await.is_some() },
    )
    .await;
    let events = (0..10)
        .map(|i| recorded(&format!("{prefix}-{i}"), None))
        .collect();
    commit_events(&t.db, events).await;
    let committed = wal_position(t).await;
    wait_until(
        &format!("the {prefix} events relayed"),
        Duration::from_secs(60),
        || async {
            stored_on(js, RECORDED_SUBJECT)
                .await
                .iter()
                .filter(|(id, _)| id.starts_with(&format!("{prefix}-")))
                .count()
                == 10
        },
    )
    .await;
    wait_until("its position recorded", Duration::from_secs(30), || async {
        recorded_past(t, committed).await
    })
    .await;
}

/// Writes WAL far past what the slot may keep, and checkpoints until the
/// server has removed WAL the slot needs (its `wal_status` is `lost`).
async fn invalidate(t: &TestDb) {
    t.db.execute_unprepared(
        "DROP TABLE IF EXISTS ballast; \
         CREATE TABLE ballast AS SELECT repeat('x', 1000) AS b FROM generate_series(1, 60000)",
    )
    .await
    .unwrap();
    // Before a checkpoint removes the WAL, the slot reads as at risk
    // (`unreserved`, or `lost` if one already ran): what the alert and the
    // relay's warning go by.
    let backlog = service::wal::backlog(&t.db, &slot_of(t))
        .await
        .unwrap()
        .unwrap();
    assert!(backlog.at_risk(), "{backlog:?}");
    wait_until("the slot invalidated", Duration::from_secs(60), || async {
        t.db.execute_unprepared("SELECT pg_switch_wal(); CHECKPOINT")
            .await
            .unwrap();
        pg_count(
            &t.db,
            "SELECT count(*) FROM pg_replication_slots WHERE wal_status = 'lost'",
        )
        .await
            == 1
    })
    .await;
}
