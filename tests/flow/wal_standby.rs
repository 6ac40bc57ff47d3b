//! The WAL relay publishes only what every synchronous standby has: the
//! walsender decodes a commit once it is flushed locally, while the client
//! that committed still waits for the standby; a failover then would
//! promote a standby without the transaction whose events went out.

use std::process::Command;
use std::time::Duration;

use async_nats::jetstream;
use sea_orm::ConnectionTrait;

use crate::helpers::ledger_stream;
use crate::support::nats::NatsServer;
use crate::support::postgres::PrivatePostgres;
use crate::support::process::Seawall;
use crate::support::{TestDb, connect, free_port, pg_count};
use crate::wal::{commit_events, recorded, slot_of, until_held, wal_env};
use crate::wal_windows::{commit_one_key, stream_messages, until};

/// A process stopped with SIGSTOP, continued on drop whatever the test
/// did: a stopped WAL receiver would hold its server's shutdown.
struct Stopped(i32);

impl Stopped {
    fn stop(pid: i32) -> Self {
        signal(pid, "-STOP");
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(pid: i32, which: &str) {
    let status = Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {which} {pid}");
}

/// A primary with a synchronous standby. The standby's WAL receiver is
/// stopped (SIGSTOP) and a transaction of one event commits on the primary:
/// flushed there, it waits for the standby, and the relay, which received
/// it, holds it back until the standby is continued; then it is published,
/// and the client's commit returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_waits_until_the_synchronous_standby_has_its_transaction() {
    held_until_the_standby_has_it("standby1", &[], 1).await;
}

/// The same with `synchronous_standby_names = 'ANY 1 (*)'`, where the
/// relay's own walsender is a quorum member too: the gate counts physical
/// standbys only (waiting on its own confirmation, it would wait for good).
/// The transaction held is larger than the window (10 messages, windows of
/// 3 events): its pieces wait for the standby as a whole window does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pieces_of_a_transaction_wait_for_a_standby_of_an_any_quorum() {
    held_until_the_standby_has_it("ANY 1 (*)", &[("SEAWALL_WAL_WINDOW", "3")], 10).await;
}

/// A relay (`extra` settings) on a primary whose `synchronous_standby_names`
/// is `names`, with one standby: an event committed while the standby
/// streams is published; a transaction of `messages` events committed while
/// its WAL receiver is stopped is published only once it is continued.
async fn held_until_the_standby_has_it(names: &str, extra: &[(&str, &str)], messages: usize) {
    let primary = PrivatePostgres::start(&["wal_level=logical", "synchronous_commit=on"]);
    let standby = PrivatePostgres::standby(&primary, "standby1", &[]);
    let t = TestDb::on_postgres(&primary.url).await;
    for sql in [
        format!("ALTER SYSTEM SET synchronous_standby_names = '{names}'"),
        "SELECT pg_reload_conf()".to_owned(),
    ] {
        t.db.execute_unprepared(&sql).await.unwrap();
    }
    let sync = "SELECT count(*) FROM pg_stat_replication \
                WHERE sync_state IN ('sync', 'quorum') AND application_name = 'standby1'";
    crate::support::wait_until(
        "the standby is synchronous",
        Duration::from_secs(30),
        || async { pg_count(&t.db, sync).await == 1 },
    )
    .await;

    let (_nats, js, mut relay) = holding_relay(&t, extra).await;
    commit_events(&t.db, vec![recorded("before-stop", Some("k"))]).await;
    let committed = crate::wal::wal_position(&t).await;
    // Published and recorded: the record, a commit too, must not be what
    // waits for the stopped standby below.
    until(
        &relay,
        "an event committed with the standby streaming is published",
        Duration::from_secs(60),
        || async {
            stream_messages(&js).await == 1 && crate::wal::recorded_past(&t, committed).await
        },
    )
    .await;

    let name = t.url.rsplit('/').next().unwrap().to_owned();
    let on_standby = connect(&format!("{}/{name}", standby.url), 1).await;
    let receiver = pg_count(&on_standby, "SELECT pid::bigint FROM pg_stat_wal_receiver").await;
    let stopped = Stopped::stop(i32::try_from(receiver).unwrap());
    let writer = connect(&format!("{}?application_name=sync_writer", t.url), 1).await;
    let committing = tokio::spawn(async move { commit_one_key(&writer, messages, 1).await });
    until(
        &relay,
        "the commit waits for the standby",
        Duration::from_secs(30),
        || async {
            pg_count(
                &t.db,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND application_name = 'sync_writer'",
            )
            .await
                == 1
        },
    )
    .await;
    // The transaction is flushed locally now: the relay's walsender sends
    // it on, and the relay either publishes it (wrongly) or says why not.
    until(
        &relay,
        "the relay holds the event back, or publishes it",
        Duration::from_secs(60),
        || async {
            stream_messages(&js).await > 1
                || relay
                    .log_text()
                    .contains("until the synchronous standbys have flushed it")
        },
    )
    .await;
    assert_eq!(
        stream_messages(&js).await,
        1,
        "an event whose transaction the standby does not have was published"
    );
    assert!(!committing.is_finished());

    drop(stopped);
    committing.await.unwrap();
    until(
        &relay,
        "the transaction is published once the standby has it",
        Duration::from_secs(60),
        || async { stream_messages(&js).await == 1 + messages as u64 },
    )
    .await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
}

/// A relay holding a window it may not publish yet (`synchronous_standby_names`
/// names a standby that is not connected) while PostgreSQL is stopped fast,
/// as a restart or a switchover's demotion does: the server waits for the
/// relay to confirm what it was sent, and the relay, which can no longer
/// reach the database, lets the slot go within seconds instead of waiting
/// out the 30 s its main pool would.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_that_cannot_reach_its_database_does_not_hold_its_shutdown() {
    let pg = PrivatePostgres::start(&["wal_level=logical"]);
    let t = TestDb::on_postgres(&pg.url).await;
    for sql in [
        "ALTER SYSTEM SET synchronous_standby_names = 'absent'",
        "SELECT pg_reload_conf()",
    ] {
        t.db.execute_unprepared(sql).await.unwrap();
    }
    let (_nats, js, mut relay) = holding_relay(&t, &[]).await;
    // The server runs with synchronous_commit = off: the commit returns.
    commit_events(&t.db, vec![recorded("held", Some("k"))]).await;
    until(
        &relay,
        "the relay holds the event back",
        Duration::from_secs(60),
        || async {
            relay
                .log_text()
                .contains("until the synchronous standbys have flushed it")
        },
    )
    .await;
    t.db.clone().close().await.unwrap();
    assert!(
        pg.stop_fast(15),
        "PostgreSQL's fast shutdown still waits for the relay after 15 s; its log:\n{}",
        relay.log_text()
    );
    assert_eq!(stream_messages(&js).await, 0);
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
}

/// `synchronous_standby_names = '*'`, and the relay connected before the
/// only physical standby, as after a primary's restart: the relay's
/// walsender is the synchronous standby, so commits wait for the relay,
/// which waits for a physical standby at its gate (or for its own records'
/// commits). The relay steps aside: it disconnects, says why naming the
/// setting, and is not ready; the physical standby, once there, is the
/// synchronous one and an event's commit returns. The relay then comes
/// back by itself (the standby, in the lower walsender slot now, wins the
/// tie of priorities) and publishes the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_chosen_as_the_synchronous_standby_steps_aside() {
    let primary = PrivatePostgres::start(&["wal_level=logical", "synchronous_commit=on"]);
    let t = TestDb::on_postgres(&primary.url).await;
    let probes = format!("127.0.0.1:{}", free_port());
    let (_nats, js, mut relay) = holding_relay(&t, &[("SEAWALL_METRICS_ADDR", &probes)]).await;
    // Alone, the relay's walsender is now the synchronous standby: it
    // steps aside.
    set_standby_names(&t, "*").await;
    until(
        &relay,
        "the relay steps aside",
        Duration::from_secs(60),
        || async {
            relay
                .log_text()
                .contains("stays off until synchronous_standby_names changes")
        },
    )
    .await;
    let readyz = format!("http://{probes}/readyz");
    let (status, body) = crate::probes::get(&readyz).await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("synchronous standby"), "{body}");
    let _standby = PrivatePostgres::standby(&primary, "standby1", &[]);
    let commit = tokio::time::timeout(
        Duration::from_secs(60),
        commit_events(&t.db, vec![recorded("while-aside", Some("k"))]),
    )
    .await;
    assert!(
        commit.is_ok(),
        "the commit still waits for the relay after 60 s; its log:\n{}",
        relay.log_text()
    );
    until(
        &relay,
        "the relay comes back and publishes the event",
        Duration::from_secs(60),
        || async { stream_messages(&js).await == 1 },
    )
    .await;
    until(
        &relay,
        "the relay ready again",
        Duration::from_secs(30),
        || async {
            crate::probes::get(&readyz)
                .await
                .is_some_and(|(s, _)| s == 200)
        },
    )
    .await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
}

async fn set_standby_names(t: &TestDb, names: &str) {
    for sql in [
        format!("ALTER SYSTEM SET synchronous_standby_names = '{names}'"),
        "SELECT pg_reload_conf()".to_owned(),
    ] {
        t.db.execute_unprepared(&sql).await.unwrap();
    }
}

/// A nats-server with the ledger's stream, the slot prepared, and a relay
/// (`extra` settings) that holds it.
async fn holding_relay(
    t: &TestDb,
    extra: &[(&str, &str)],
) -> (NatsServer, jetstream::Context, Seawall) {
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    worker::ensure_stream(&js, &ledger_stream(Duration::from_secs(5)))
        .await
        .unwrap();
    worker::relay::wal::prepare(&t.db, &slot_of(t))
        .await
        .unwrap();
    let relay = Seawall::spawn(&["relay"], &wal_env(t, &nats.url(), extra));
    until_held(&relay, t, Duration::from_secs(60)).await;
    (nats, js, relay)
}
