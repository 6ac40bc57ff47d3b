//! The WAL slot's name and its publication across releases: a default that
//! now follows the database the connection opens must not leave a running
//! deployment's slot behind, and `--drop-slot` removes only what seawall
//! made.

use std::time::Duration;

use sea_orm::ConnectionTrait;

use crate::helpers::stored_on;
use crate::support::domain::RECORDED_SUBJECT;
use crate::support::postgres::PrivatePostgres;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, pg_count};
use crate::wal::{commit_events, drop_slot, recorded, slot_of, wal_env_on};
use crate::wal_windows::until;

/// A URL that names its database in `dbname` (its path empty): releases
/// before this one named the slot `seawall_` from the path alone, this one
/// names a new slot after the database. A deployment whose slot was made
/// under the old name keeps it (and its position) when `wal_slot` is
/// unset: the relay holds `seawall_`, relays, and makes no second slot
/// (which start-up would refuse: two slots would each publish every
/// event). On a server of the test's own, since slot names are the
/// cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_an_earlier_release_named_keeps_its_name() {
    let pg = PrivatePostgres::start(&["wal_level=logical"]);
    let t = TestDb::on_postgres(&pg.url).await;
    let database = t.url.rsplit('/').next().unwrap().to_owned();
    let url = format!("{}/?dbname={database}", pg.url);
    worker::relay::wal::prepare(&t.db, "seawall_")
        .await
        .unwrap();
    let (nats, js) = crate::helpers::ledger_nats().await;
    let cfg = wal_env_on(&url, &nats.url(), &[]);
    let mut relay = Seawall::spawn(&["relay"], &cfg);
    let held = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'seawall_' AND active";
    until(
        &relay,
        "the relay holds seawall_",
        Duration::from_secs(60),
        || async { pg_count(&t.db, held).await == 1 },
    )
    .await;
    commit_events(
        &t.db,
        (0..10)
            .map(|i| recorded(&format!("kept-{i}"), None))
            .collect(),
    )
    .await;
    until(
        &relay,
        "the events relayed",
        Duration::from_secs(60),
        || async { stored_on(&js, RECORDED_SUBJECT).await.len() == 10 },
    )
    .await;
    let slots = pg_count(&t.db, "SELECT count(*) FROM pg_replication_slots").await;
    assert_eq!(slots, 1, "{}", relay.log_text());
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
}

/// `--drop-slot` drops the slot's publication when it is seawall's (empty,
/// as the relay makes it), and leaves one that publishes tables: that is
/// someone else's use of the name, and their subscribers would break.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_the_slot_leaves_a_publication_that_is_not_seawalls() {
    let t = TestDb::new(Backend::Postgres).await;
    let slot = slot_of(&t);
    let publications = format!("SELECT count(*) FROM pg_publication WHERE pubname = '{slot}'");
    worker::relay::wal::prepare(&t.db, &slot).await.unwrap();
    drop_slot(&t);
    assert_eq!(
        pg_count(&t.db, &publications).await,
        0,
        "seawall's own is dropped"
    );
    worker::relay::wal::prepare(&t.db, &slot).await.unwrap();
    t.db.execute_unprepared(&format!(
        "ALTER PUBLICATION {slot} ADD TABLE outbox_message"
    ))
    .await
    .unwrap();
    drop_slot(&t);
    assert_eq!(
        pg_count(&t.db, &publications).await,
        1,
        "one with tables is left"
    );
    let slots = format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'");
    assert_eq!(
        pg_count(&t.db, &slots).await,
        0,
        "the slot itself is dropped"
    );
}
