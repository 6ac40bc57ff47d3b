//! The WAL outbox mode on PostgreSQL: handlers write events into the
//! write-ahead log, and the WAL relay publishes them from a replication slot.

use std::time::Duration;

use entity::{dead_letter, outbox_message};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, EntityTrait,
    FromQueryResult, PaginatorTrait, QueryFilter, Statement, TransactionTrait,
};
use service::{NewEvent, Outbox, OutboxMode};

use crate::helpers::{
    applied_events_once_each, env, publish_entries, req, stored_on, with_ledger_stream,
};
use crate::support::domain::{Entry, RECORDED_SUBJECT};
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, rows, wait_until};

/// JetStream's duplicate window in the WAL tests: shorter than the tests,
/// so an event published again a few seconds later is stored twice and
/// seen (the default two minutes would hide it).
pub(crate) const WAL_DUPLICATE_WINDOW: Duration = Duration::from_secs(5);

/// `extra` plus WAL mode and a [`WAL_DUPLICATE_WINDOW`] (with the relay
/// lease and backoff it requires), for a process on `t` and `nats_url`.
pub(crate) fn wal_env(
    t: &TestDb,
    nats_url: &str,
    extra: &[(&str, &str)],
) -> Vec<(&'static str, String)> {
    wal_env_on(&t.url, nats_url, extra)
}

/// [`wal_env`] for a process reaching the test's database through `url`
/// (a proxy, another spelling of the URL).
pub(crate) fn wal_env_on(
    url: &str,
    nats_url: &str,
    extra: &[(&str, &str)],
) -> Vec<(&'static str, String)> {
    let mut all = vec![
        ("SEAWALL_OUTBOX_MODE", "wal"),
        ("SEAWALL_DUPLICATE_WINDOW_MS", "5000"),
        ("SEAWALL_RELAY_LEASE_MS", "2500"),
        ("SEAWALL_RELAY_RETRY_MAX_MS", "2500"),
    ];
    all.extend_from_slice(extra);
    env(url, nats_url, &all)
}

/// The slot seawall names after the test's database.
pub(crate) fn slot_of(t: &TestDb) -> String {
    worker::relay::wal::default_slot_name(&t.url)
}

/// Drops the test's slot with `seawall relay --drop-slot`, so the shared
/// server does not keep its WAL.
pub(crate) fn drop_slot(t: &TestDb) {
    let env = [
        ("SEAWALL_DATABASE_URL", t.url.clone()),
        ("SEAWALL_OUTBOX_MODE", "wal".to_owned()),
    ];
    relay_drops_slot(&[], &env);
}

/// Runs `seawall relay --drop-slot` with `extra` arguments and `env`, and
/// asserts it dropped the slot.
pub(crate) fn relay_drops_slot(extra: &[&str], env: &[(&str, String)]) {
    let mut args = vec!["relay", "--drop-slot"];
    args.extend_from_slice(extra);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = crate::support::testbed_output(&args, &env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("dropped replication slot"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes `events` in one transaction, in WAL mode.
pub(crate) async fn commit_events(db: &DatabaseConnection, events: Vec<NewEvent>) {
    let txn = db.begin().await.unwrap();
    Outbox::new(OutboxMode::Wal)
        .enqueue_all(&txn, events)
        .await
        .unwrap();
    txn.commit().await.unwrap();
}

pub(crate) fn recorded(id: &str, key: Option<&str>) -> NewEvent {
    let event = NewEvent::new(RECORDED_SUBJECT, format!("{{\"id\":\"{id}\"}}")).with_message_id(id);
    match key {
        Some(key) => event.with_ordering_key(key),
        None => event,
    }
}

/// `seawall run` in WAL mode: requests become credits and events, the
/// events reach JetStream once each, and no outbox row is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wal_mode_relays_events_end_to_end_without_outbox_rows() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    let mut run = Seawall::spawn(&["run"], &wal_env(&t, &nats.url(), &[]));
    let msgs: Vec<_> = (0..300)
        .map(|i| (format!("wal-{i}"), req(&format!("acct-{}", i % 7), 5)))
        .collect();
    publish_entries(&js, &msgs).await;
    crate::helpers::wait_for_rows::<Entry>(&t.db, 300, Duration::from_secs(60)).await;
    wait_until(
        "300 events on the stream",
        Duration::from_secs(60),
        || async { stored_on(&js, RECORDED_SUBJECT).await.len() >= 300 },
    )
    .await;
    assert_eq!(applied_events_once_each(&js).await, 300);
    assert_eq!(
        outbox_message::Entity::find().count(&t.db).await.unwrap(),
        0,
        "WAL mode writes no outbox rows"
    );
    wait_until("the chart counts them", Duration::from_secs(10), || async {
        crate::support::charted(&t.db).await.0 >= 300
    })
    .await;
    let slot = slot_of(&t);
    let stats = service::stats::stats(&t.db, chrono::Utc::now(), Some(&slot))
        .await
        .unwrap();
    let backlog = stats.wal.expect("the slot's backlog is in the stats");
    assert!(backlog.active && backlog.slot == slot, "{backlog:?}");
    assert!(run.terminate().await.success(), "{}", run.log_text());
    run.assert_no_panic();
    drop_slot(&t);
}

/// What must not be published is not, and what the broker refuses does
/// not stop the rest: a rolled-back transaction's event never appears; an
/// event on a subject no stream binds ends as a dead row with the server's
/// error; a later event of a refused event's key waits behind it in the
/// table, as in table mode; a seawall message that cannot be decoded is
/// kept as a dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_and_rolled_back_events_do_not_stop_the_rest() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    worker::relay::wal::prepare(&t.db, &slot_of(&t))
        .await
        .unwrap();

    let txn = t.db.begin().await.unwrap();
    Outbox::new(OutboxMode::Wal)
        .enqueue(&txn, recorded("rolled-back", None))
        .await
        .unwrap();
    txn.rollback().await.unwrap();
    commit_events(
        &t.db,
        vec![
            recorded("a", Some("k1")),
            NewEvent::new("nowhere.x", "{}").with_message_id("refused-x"),
            recorded("b", None),
        ],
    )
    .await;
    commit_events(
        &t.db,
        vec![
            NewEvent::new("nowhere.y", "{}")
                .with_message_id("refused-y")
                .with_ordering_key("k2"),
            recorded("c", Some("k2")),
        ],
    )
    .await;
    t.db.execute_raw(Statement::from_string(
        DbBackend::Postgres,
        "SELECT pg_logical_emit_message(true, 'seawall.outbox', '\\x09'::bytea)",
    ))
    .await
    .unwrap();
    commit_events(&t.db, vec![recorded("d", Some("k1"))]).await;
    // Another writer's row of key k3, backing off, and a published row
    // whose id a WAL event reuses.
    let mut waiting = rows::event("table-k3".into(), chrono::Utc::now());
    waiting.ordering_key = Set(Some("k3".into()));
    waiting.next_attempt_at = Set(chrono::Utc::now() + chrono::Duration::hours(1));
    let mut old = rows::event("clash".into(), chrono::Utc::now());
    old.published_at = Set(Some(chrono::Utc::now()));
    outbox_message::Entity::insert_many([waiting, old])
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    commit_events(
        &t.db,
        vec![
            recorded("e", Some("k3")),
            NewEvent::new("nowhere.z", "{\"new\":1}").with_message_id("clash"),
        ],
    )
    .await;
    // A hand-written message whose event no outbox row could hold.
    let long = service::wal::WalEvent {
        message_id: "long-subject".into(),
        subject: "s".repeat(300),
        ordering_key: None,
        headers: Default::default(),
        payload: Default::default(),
        causation_id: None,
        causation_consumer: None,
        correlation_id: None,
        created_at: chrono::Utc::now(),
    };
    t.db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT pg_logical_emit_message(true, 'seawall.outbox', $1)",
        [service::wal::encode(&[long]).unwrap().into()],
    ))
    .await
    .unwrap();

    let mut relay = Seawall::spawn(
        &["relay"],
        &wal_env(&t, &nats.url(), &[("SEAWALL_RELAY_MAX_ATTEMPTS", "2")]),
    );
    // Whether row `id` has `column` (dead_at, published_at) set.
    let marked = |id: &'static str, column: outbox_message::Column| {
        let db = t.db.clone();
        async move {
            outbox_message::Entity::find()
                .filter(outbox_message::Column::MessageId.eq(id))
                .filter(column.is_not_null())
                .count(&db)
                .await
                .unwrap()
                == 1
        }
    };
    wait_until(
        "both refused events are dead rows",
        Duration::from_secs(60),
        || async {
            let dead = outbox_message::Column::DeadAt;
            marked("refused-x", dead).await && marked("refused-y", dead).await
        },
    )
    .await;
    wait_until(
        "a, b, c and d are published",
        Duration::from_secs(30),
        || async { stored_on(&js, RECORDED_SUBJECT).await.len() >= 4 },
    )
    .await;
    // c went out from the table: its row is marked once its PubAck is in,
    // a moment after the stream holds it.
    wait_until("c's row marked published", Duration::from_secs(30), || {
        marked("c", outbox_message::Column::PublishedAt)
    })
    .await;
    let ids: Vec<String> = stored_on(&js, RECORDED_SUBJECT)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let position = |id: &str| ids.iter().position(|x| x == id);
    assert_eq!(ids.len(), 4, "e stays behind its key's row: {ids:?}");
    assert!(position("b").is_some(), "{ids:?}");
    assert!(position("a") < position("d"), "k1 in commit order: {ids:?}");
    let rows = outbox_message::Entity::find().all(&t.db).await.unwrap();
    let row = |id: &str| rows.iter().find(|r| r.message_id == id).unwrap();
    assert!(
        row("refused-x")
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("no stream")),
        "{:?}",
        row("refused-x")
    );
    // c followed its key's refused event into the table and went out only
    // once that one was given up on, as table mode orders a key.
    let (c, refused_y) = (row("c"), row("refused-y"));
    assert!(
        c.published_at.is_some() && c.published_at >= refused_y.dead_at,
        "c after its key's refused event: {c:?} {refused_y:?}"
    );
    let e = row("e");
    assert!(
        e.published_at.is_none() && e.dead_at.is_none(),
        "e waits behind another writer's row of its key: {e:?}"
    );
    assert_eq!(
        rows.len(),
        6,
        "the refused events, c, e and the two rows written by hand"
    );
    let letters = dead_letter::Entity::find()
        .filter(dead_letter::Column::Consumer.eq(worker::relay::wal::UNDECODABLE_CONSUMER))
        .all(&t.db)
        .await
        .unwrap();
    let letter = |needle: &str| {
        letters
            .iter()
            .find(|l| l.error.contains(needle))
            .unwrap_or_else(|| panic!("a dead letter for {needle:?}: {letters:?}"))
    };
    assert_eq!(letter("version 9").payload, vec![9]);
    let clash = letter("already used by another outbox event");
    assert_eq!(
        clash.payload,
        b"{\"new\":1}".to_vec(),
        "the new event is kept"
    );
    letter("subject must be 1 to 255 bytes");
    assert_eq!(letters.len(), 3, "{letters:?}");
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
    drop_slot(&t);
}

#[derive(Debug, FromQueryResult)]
struct ActivePid {
    pid: Option<i32>,
}

/// The backend pid streaming the test's slot, if a relay holds it. A slot
/// still being made is held too, by the backend making it, and has no
/// confirmed position until it decodes what commits: that one is not a
/// relay's.
pub(crate) async fn slot_holder(t: &TestDb) -> Option<i32> {
    ActivePid::find_by_statement(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT active_pid AS pid FROM pg_replication_slots \
         WHERE slot_name = $1 AND confirmed_flush_lsn IS NOT NULL",
        [slot_of(t).into()],
    ))
    .one(&t.db)
    .await
    .unwrap()
    .and_then(|r| r.pid)
}

/// The server's WAL position now: a relay that recorded a position at or
/// past it has recorded every window committed before.
pub(crate) async fn wal_position(t: &TestDb) -> i64 {
    // The insert position: the write position lags it on the suite's
    // server (`synchronous_commit = off`), before a commit just returned.
    crate::support::pg_count(
        &t.db,
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint",
    )
    .await
}

/// Whether the relays of the test's slot recorded a position at or past
/// `position` (every position is recorded, the slot's start included, so
/// `lsn > 0` says nothing).
pub(crate) async fn recorded_past(t: &TestDb, position: i64) -> bool {
    crate::support::pg_count(
        &t.db,
        &format!("SELECT count(*) FROM wal_relay_position WHERE lsn >= {position}"),
    )
    .await
        == 1
}

/// Waits up to `within` for a relay to hold the test's slot; on a timeout
/// the failure shows `relay`'s log.
pub(crate) async fn until_held(relay: &Seawall, t: &TestDb, within: Duration) {
    crate::wal_windows::until(relay, "a relay to hold the slot", within, || async {
        slot_holder(t).await.is_some()
    })
    .await;
}

/// `--drop-slot` refuses a slot a running relay holds, and drops one its
/// relay lets go while the drop waits: a relay just stopped holds its slot
/// until its walsender notices, a moment after the process is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drop_refuses_a_held_slot_and_waits_for_one_being_let_go() {
    let (t, nats, _js) = with_ledger_stream(Backend::Postgres).await;
    let slot = slot_of(&t);
    worker::relay::wal::prepare(&t.db, &slot).await.unwrap();
    let mut relay = Seawall::spawn(&["relay"], &wal_env(&t, &nats.url(), &[]));
    until_held(&relay, &t, Duration::from_secs(30)).await;
    let refused = worker::relay::wal::drop_slot(&t.db, &slot).await;
    assert!(
        matches!(refused, Err(worker::relay::wal::SlotError::SlotActive(_))),
        "a held slot is not dropped: {refused:?}"
    );
    let dropping = {
        let (db, slot) = (t.db.clone(), slot.clone());
        tokio::spawn(async move { worker::relay::wal::drop_slot(&db, &slot).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !dropping.is_finished(),
        "the drop waits while the slot is held"
    );
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    assert!(
        dropping.await.unwrap().unwrap(),
        "the slot let go is dropped"
    );
    assert_eq!(slot_holder(&t).await, None);
}

/// Two relays on one slot: the first holds it, the second waits. The first
/// is killed with SIGKILL while events flow; the second takes over, and
/// every event is on the stream exactly once (the copies it republished
/// from the unconfirmed part were dropped by JetStream's duplicate window).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_takes_over_from_a_killed_relay_and_nothing_is_lost() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    worker::relay::wal::prepare(&t.db, &slot_of(&t))
        .await
        .unwrap();
    let cfg = wal_env(&t, &nats.url(), &[("SEAWALL_WAL_WINDOW", "50")]);
    let mut first = Seawall::spawn(&["relay"], &cfg);
    until_held(&first, &t, Duration::from_secs(30)).await;
    let mut second = Seawall::spawn(&["relay"], &cfg);
    let total = 2_000;
    let writer = {
        let db = t.db.clone();
        tokio::spawn(async move {
            for batch in 0..total / 10 {
                let events = (0..10)
                    .map(|i| recorded(&format!("t-{batch}-{i}"), Some(&format!("k{}", i % 3))))
                    .collect();
                commit_events(&db, events).await;
            }
        })
    };
    wait_until(
        "some events are published",
        Duration::from_secs(30),
        || async { stored_on(&js, RECORDED_SUBJECT).await.len() >= 300 },
    )
    .await;
    first.kill9().await;
    writer.await.unwrap();
    wait_until(
        "every event is published",
        Duration::from_secs(90),
        || async { stored_on(&js, RECORDED_SUBJECT).await.len() >= total },
    )
    .await;
    assert_eq!(applied_events_once_each(&js).await, total);
    assert!(
        second.log_text().contains("WAL relay holds the slot"),
        "{}",
        second.log_text()
    );
    assert!(second.terminate().await.success(), "{}", second.log_text());
    second.assert_no_panic();
    drop_slot(&t);
}

/// nats-server restarts while events are written: the WAL relay's windows
/// wait and go again, and every event arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_wal_relay_survives_a_nats_restart() {
    let (t, mut nats, _) = with_ledger_stream(Backend::Postgres).await;
    worker::relay::wal::prepare(&t.db, &slot_of(&t))
        .await
        .unwrap();
    let mut relay = Seawall::spawn(&["relay"], &wal_env(&t, &nats.url(), &[]));
    commit_events(
        &t.db,
        (0..50)
            .map(|i| recorded(&format!("before-{i}"), None))
            .collect(),
    )
    .await;
    let js = nats.jetstream().await;
    wait_until(
        "the first events are published",
        Duration::from_secs(30),
        || async { stored_on(&js, RECORDED_SUBJECT).await.len() >= 50 },
    )
    .await;
    nats.stop();
    commit_events(
        &t.db,
        (0..50)
            .map(|i| recorded(&format!("during-{i}"), Some("k")))
            .collect(),
    )
    .await;
    wait_until(
        "the relay meets the outage",
        Duration::from_secs(60),
        || async { relay.log_text().contains("NATS is unreachable") },
    )
    .await;
    nats.restart().await;
    let js = nats.jetstream().await;
    commit_events(
        &t.db,
        (0..50)
            .map(|i| recorded(&format!("after-{i}"), None))
            .collect(),
    )
    .await;
    wait_until(
        "every event is published",
        Duration::from_secs(90),
        || async { stored_on(&js, RECORDED_SUBJECT).await.len() >= 150 },
    )
    .await;
    assert_eq!(applied_events_once_each(&js).await, 150);
    // The key's events, in order, none missing.
    let during: Vec<String> = stored_on(&js, RECORDED_SUBJECT)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| id.starts_with("during-"))
        .collect();
    let expected: Vec<String> = (0..50).map(|i| format!("during-{i}")).collect();
    assert_eq!(during, expected);
    // A publish that failed just as the connection came back counts as a
    // refusal and takes the table's path; it is published all the same.
    wait_until(
        "every handed-over row is published",
        Duration::from_secs(30),
        || async {
            outbox_message::Entity::find()
                .filter(outbox_message::Column::PublishedAt.is_null())
                .count(&t.db)
                .await
                .unwrap()
                == 0
        },
    )
    .await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
    drop_slot(&t);
}

/// A slot being created is listed before it decodes anything: it waits for
/// the transactions running when its creation began. A second process
/// finding it must wait too, or the events it writes meanwhile are lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_waits_for_a_slot_another_is_still_creating() {
    let t = TestDb::new(Backend::Postgres).await;
    let slot = slot_of(&t);
    // A transaction with an id, open: the slot's creation waits for it.
    let open = t.second_pool().await;
    let txn = open.begin().await.unwrap();
    txn.execute_raw(Statement::from_string(
        DbBackend::Postgres,
        "INSERT INTO throughput_minute (minute, tally, shard, n) VALUES (now(), 'x', 1, 1)",
    ))
    .await
    .unwrap();
    let creating = {
        let (db, slot) = (t.db.clone(), slot.clone());
        tokio::spawn(async move { worker::relay::wal::prepare(&db, &slot).await })
    };
    wait_until("the slot is listed", Duration::from_secs(30), || async {
        ActivePid::find_by_statement(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT active_pid AS pid FROM pg_replication_slots WHERE slot_name = $1",
            [slot.clone().into()],
        ))
        .one(&t.db)
        .await
        .unwrap()
        .is_some()
    })
    .await;
    let finding = {
        let (db, slot) = (t.db.clone(), slot.clone());
        tokio::spawn(async move { worker::relay::wal::prepare(&db, &slot).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !finding.is_finished() && !creating.is_finished(),
        "neither may go on while the slot cannot decode yet"
    );
    txn.commit().await.unwrap();
    creating.await.unwrap().unwrap();
    finding.await.unwrap().unwrap();
    assert!(worker::relay::wal::drop_slot(&t.db, &slot).await.unwrap());
}
