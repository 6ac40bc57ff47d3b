//! Deliveries at the edges: the last allowed one interrupted, a dead letter
//! that cannot be written, a database outage (also at start-up), a handler
//! longer than the ack wait. Each ends with every message credited or dead-lettered, never
//! neither.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use sea_orm::{ConnectionTrait, DatabaseConnection, EntityTrait, PaginatorTrait};
use tokio_util::sync::CancellationToken;

use crate::support::domain::Entry;
use crate::support::domain::{LEDGER_CONSUMER, LEDGER_STREAM, LedgerHandler, RECORD_SUBJECT};
use entity::prelude::*;
use service::{ConsumerName, Executor, Inbox, Registry};
use worker::{Consumer, ConsumerConfig};

use crate::helpers::{env, publish_entries, publish_raw, req, with_ledger_stream};
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::proxy::{Proxy, upstream_of};
use crate::support::{Backend, TestDb, connect, wait_until};

/// The `credit` durable consumer's state, once a process has created it.
async fn consumer_info(js: &jetstream::Context) -> Option<jetstream::consumer::Info> {
    let stream = js.get_stream(LEDGER_STREAM).await.ok()?;
    let mut consumer: jetstream::consumer::Consumer<pull::Config> =
        stream.get_consumer(LEDGER_CONSUMER).await.ok()?;
    consumer.info().await.ok().cloned()
}

async fn ack_pending(js: &jetstream::Context) -> Option<usize> {
    consumer_info(js).await.map(|i| i.num_ack_pending)
}

async fn count<E: EntityTrait>(db: &DatabaseConnection) -> u64
where
    E::Model: Send + Sync,
{
    E::find().count(db).await.unwrap()
}

fn credits(n: usize, prefix: &str) -> Vec<(String, crate::support::domain::EntryRequest)> {
    (0..n)
        .map(|i| (format!("{prefix}-{i}"), req(&format!("acct-{}", i % 7), 1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_killed_during_the_last_allowed_delivery_loses_nothing() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    let settings = env(
        &t.url,
        &nats.url(),
        &[
            ("SEAWALL_MAX_DELIVER", "1"),
            ("TESTBED_WORK_MS", "1500"),
            ("SEAWALL_ACK_WAIT_MS", "2000"),
            ("SEAWALL_CONSUMER_CONCURRENCY", "16"),
        ],
    );
    let mut first = Seawall::spawn(&["consume"], &settings);
    publish_entries(&js, &credits(16, "last")).await;
    wait_until(
        "16 messages in the handler",
        Duration::from_secs(30),
        || async { ack_pending(&js).await == Some(16) },
    )
    .await;
    first.kill9().await;

    let second = Seawall::spawn(&["consume"], &settings);
    wait_until(
        "every message credited or dead-lettered",
        Duration::from_secs(20),
        || async { count::<Entry>(&t.db).await + count::<DeadLetter>(&t.db).await >= 16 },
    )
    .await;
    assert_eq!(
        count::<Entry>(&t.db).await,
        16,
        "valid messages are credited"
    );
    assert_eq!(count::<DeadLetter>(&t.db).await, 0);
    second.assert_no_panic();
}

/// Two processes whose handlers outlast the ack wait (3 s against 2 s),
/// with 4 malformed messages among 100. Each message is delivered once: a
/// process pulls no more messages than it has room for and marks in
/// progress the ones it queues, so none waits while its ack wait runs out
/// (with a streaming pull a batch
/// ahead, buffered messages were handed to the other process as copies,
/// which raced their originals; a malformed one was dead-lettered by both,
/// 9 or 10 rows for 8 messages, before the unique index over open dead
/// letters). Each malformed message ends with one dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_consumers_with_handlers_longer_than_the_ack_wait_get_each_message_once() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    let settings = env(
        &t.url,
        &nats.url(),
        &[("TESTBED_WORK_MS", "3000"), ("SEAWALL_ACK_WAIT_MS", "2000")],
    );
    let processes = [
        Seawall::spawn(&["consume"], &settings),
        Seawall::spawn(&["consume"], &settings),
    ];
    // An account each: handlers of one account wait for each other's
    // row lock.
    let good: Vec<_> = (0..96)
        .map(|i| (format!("race-{i}"), req(&format!("race-{i}"), 1)))
        .collect();
    for (i, chunk) in good.chunks(24).enumerate() {
        publish_raw(&js, Some(&format!("bad-{i}")), b"{not json").await;
        publish_entries(&js, chunk).await;
    }
    wait_until(
        "every message settled",
        Duration::from_secs(120),
        || async {
            count::<Entry>(&t.db).await == 96
                && consumer_info(&js)
                    .await
                    .is_some_and(|i| i.num_pending == 0 && i.num_ack_pending == 0)
        },
    )
    .await;
    let info = consumer_info(&js).await.unwrap();
    assert_eq!(
        info.delivered.consumer_sequence, 100,
        "deliveries of 100 messages: none was handed out twice"
    );
    let letters: Vec<Option<String>> = DeadLetter::find()
        .all(&t.db)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.message_id)
        .collect();
    assert_eq!(letters.len(), 4, "one per malformed message: {letters:?}");
    for process in processes {
        process.assert_no_panic();
    }
}

/// A message's last delivery whose handling deadline (1 s) passes while its
/// batch's `COMMIT` is under way (a deferred trigger makes the commit take
/// 2 s) is acknowledged: its work committed. Without asking the marker
/// once that `COMMIT` ended, it was dead-lettered with its work done.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_last_delivery_whose_deadline_passes_during_its_commit_is_acked() {
    let (t, _nats, js) = with_ledger_stream(Backend::Postgres).await;
    t.db.execute_unprepared(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON ledger_entry
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();",
    )
    .await
    .unwrap();
    let registry = Registry::new().register_handler(
        ConsumerName::parse(LEDGER_CONSUMER).unwrap(),
        RECORD_SUBJECT,
        LedgerHandler::default(),
    );
    let consumer = Consumer::new(
        Inbox::new(Executor::new(t.db.clone())).with_batching(8, 16),
        js.clone(),
        registry.registrations()[0].clone(),
        ConsumerConfig {
            max_deliver: 1,
            max_handling: Duration::from_secs(1),
            ack_wait: Duration::from_secs(10),
            ..ConsumerConfig::new(LEDGER_STREAM)
        },
    );
    consumer.ensure().await.unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move { consumer.run(cancel).await.unwrap() }
    });
    publish_entries(&js, &credits(1, "slow-commit")).await;
    wait_until("the delivery settled", Duration::from_secs(30), || async {
        count::<Entry>(&t.db).await + count::<DeadLetter>(&t.db).await >= 1
            && consumer_info(&js)
                .await
                .is_some_and(|i| i.num_pending == 0 && i.num_ack_pending == 0)
    })
    .await;
    cancel.cancel();
    task.await.unwrap();
    assert_eq!(count::<Entry>(&t.db).await, 1, "the work committed");
    let letters = DeadLetter::find().all(&t.db).await.unwrap();
    assert!(
        letters.is_empty(),
        "a message whose work committed is not dead-lettered: {letters:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_durable_consumer_with_a_broker_delivery_limit_is_updated_at_start_up() {
    let (t, _nats, js) = with_ledger_stream(Backend::Sqlite).await;
    let stream = js.get_stream(LEDGER_STREAM).await.unwrap();
    stream
        .create_consumer(pull::Config {
            durable_name: Some(LEDGER_CONSUMER.into()),
            filter_subject: RECORD_SUBJECT.into(),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            max_deliver: 5,
            ..Default::default()
        })
        .await
        .unwrap();
    let registry = Registry::new().register_handler(
        ConsumerName::parse(LEDGER_CONSUMER).unwrap(),
        RECORD_SUBJECT,
        LedgerHandler::default(),
    );
    let consumer = Consumer::new(
        Inbox::new(Executor::new(t.db.clone())),
        js.clone(),
        registry.registrations()[0].clone(),
        ConsumerConfig::new(crate::support::domain::LEDGER_STREAM),
    );
    consumer.ensure().await.unwrap();
    assert_eq!(consumer_info(&js).await.unwrap().config.max_deliver, -1);
}

/// A role that may do everything the consumer does except insert dead letters.
async fn role_without_dead_letter_insert(admin: &DatabaseConnection, url: &str) -> String {
    let role = format!("r_{}", uuid::Uuid::new_v4().simple());
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}"),
        format!("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}"),
        format!("REVOKE INSERT ON dead_letter FROM {role}"),
    ] {
        admin.execute_unprepared(&sql).await.unwrap();
    }
    url.replacen("postgres@", &format!("{role}@"), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_refused_on_the_last_delivery_is_recorded_once_the_insert_succeeds() {
    let (t, _nats, js) = with_ledger_stream(Backend::Postgres).await;
    let limited_url = role_without_dead_letter_insert(&t.db, &t.url).await;
    let role = limited_url
        .split("://")
        .nth(1)
        .unwrap()
        .split('@')
        .next()
        .unwrap()
        .to_owned();
    let limited = connect(&limited_url, 8).await;
    let registry = Registry::new().register_handler(
        ConsumerName::parse(LEDGER_CONSUMER).unwrap(),
        RECORD_SUBJECT,
        LedgerHandler::default(),
    );
    let consumer = Consumer::new(
        Inbox::new(Executor::new(limited)),
        js.clone(),
        registry.registrations()[0].clone(),
        ConsumerConfig {
            max_deliver: 1,
            nak_base: Duration::from_millis(20),
            nak_max: Duration::from_millis(200),
            ..ConsumerConfig::new(crate::support::domain::LEDGER_STREAM)
        },
    );
    consumer.ensure().await.unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move { consumer.run(cancel).await.unwrap() }
    });

    publish_raw(&js, Some("malformed-1"), b"{not json").await;
    wait_until(
        "the message redelivered after refused dead-letter inserts",
        Duration::from_secs(20),
        || async {
            consumer_info(&js)
                .await
                .is_some_and(|i| i.delivered.consumer_sequence >= 3)
        },
    )
    .await;
    assert_eq!(count::<DeadLetter>(&t.db).await, 0);

    t.db.execute_unprepared(&format!("GRANT INSERT ON dead_letter TO {role}"))
        .await
        .unwrap();
    wait_until(
        "the dead letter recorded",
        Duration::from_secs(20),
        || async { count::<DeadLetter>(&t.db).await == 1 },
    )
    .await;
    wait_until("the message settled", Duration::from_secs(10), || async {
        ack_pending(&js).await == Some(0)
    })
    .await;
    assert_eq!(count::<DeadLetter>(&t.db).await, 1);
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_outage_spends_no_deliveries_and_dead_letters_nothing() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    let upstream = upstream_of(&t.url);
    let proxy = Proxy::start(upstream).await;
    let settings = env(
        &proxy.url_for(&t.url, upstream),
        &nats.url(),
        &[("TESTBED_WORK_MS", "20")],
    );
    let consume = Seawall::spawn(&["consume"], &settings);
    publish_entries(&js, &credits(2000, "outage")).await;
    wait_until("the first credits", Duration::from_secs(60), || async {
        count::<Entry>(&t.db).await >= 300
    })
    .await;
    proxy.cut();
    // The fault itself lasts a fixed time: long enough for every in-flight
    // message to use up its deliveries if outages counted against them.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(count::<Entry>(&t.db).await < 2000, "the outage hit traffic");
    proxy.restore();
    wait_until("all 2,000 credited", Duration::from_secs(90), || async {
        count::<Entry>(&t.db).await >= 2000
    })
    .await;
    assert_eq!(count::<Entry>(&t.db).await, 2000);
    assert_eq!(count::<DeadLetter>(&t.db).await, 0);
    // The deliveries themselves were not spent: held with in-progress acks,
    // the messages in flight were delivered once (a batch buffered in the
    // client when the pause began may come once more after the ack wait).
    let info = consumer_info(&js).await.unwrap();
    assert!(
        info.delivered.consumer_sequence <= 2000 + 16,
        "{} deliveries for 2,000 messages",
        info.delivered.consumer_sequence
    );
    consume.assert_no_panic();
}

/// The testbed without its ledger tables, whose own wait for the database
/// would hide whether `serve` waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_started_while_the_database_is_down_waits_for_it() {
    let t = TestDb::empty(Backend::Postgres).await;
    let nats = NatsServer::start().await;
    let upstream = upstream_of(&t.url);
    let proxy = Proxy::start(upstream).await;
    // As HAProxy while no leader is elected: connections are accepted and
    // closed at once.
    proxy.cut();
    let consume = Seawall::spawn(
        &["consume"],
        &env(
            &proxy.url_for(&t.url, upstream),
            &nats.url(),
            &[("TESTBED_TABLES", "skip")],
        ),
    );
    wait_until(
        "the process waiting for the database",
        Duration::from_secs(30),
        || async {
            consume
                .log_text()
                .contains("the database cannot do this yet; waiting for it before starting")
        },
    )
    .await;
    proxy.restore();
    wait_until("the process running", Duration::from_secs(60), || async {
        consume.log_text().contains("seawall is running")
    })
    .await;
    consume.assert_no_panic();
}

/// A message failing for a reason of its own is redelivered on the
/// configured nak schedule, not at once: with `NAK_BASE_MS` = `NAK_MAX_MS` =
/// 1 s and three deliveries, its two naks take at least 0.5 s each (the
/// jitter keeps half), and it is dead-lettered well before the default
/// schedule (10 s, then 20 s) would allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_message_is_redelivered_on_the_configured_nak_schedule() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    for sql in [
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'account closed'; END $$",
        "CREATE TRIGGER refuse BEFORE INSERT ON ledger_entry FOR EACH ROW EXECUTE FUNCTION refuse()",
    ] {
        t.db.execute_unprepared(sql).await.unwrap();
    }
    let consume = Seawall::spawn(
        &["consume"],
        &env(
            &t.url,
            &nats.url(),
            &[
                ("SEAWALL_NAK_BASE_MS", "1s"),
                ("SEAWALL_NAK_MAX_MS", "1s"),
                ("SEAWALL_MAX_DELIVER", "3"),
            ],
        ),
    );
    wait_until("the consumer running", Duration::from_secs(60), || async {
        consume.log_text().contains("consumer started")
    })
    .await;
    let published = tokio::time::Instant::now();
    publish_entries(&js, &[("doomed".to_owned(), req("acct", 1))]).await;
    wait_until("the dead letter", Duration::from_secs(12), || async {
        count::<DeadLetter>(&t.db).await == 1
    })
    .await;
    let waited = published.elapsed();
    let dead = DeadLetter::find().one(&t.db).await.unwrap().unwrap();
    assert_eq!(dead.deliveries, 3);
    assert!(dead.error.contains("account closed"), "{}", dead.error);
    assert!(
        waited >= Duration::from_secs(1),
        "two naks of at least 0.5 s each, dead-lettered after {waited:?}"
    );
    assert_eq!(count::<Entry>(&t.db).await, 0);
    consume.assert_no_panic();
}

/// A supervisor restarting a process while the database is read-only (a
/// disk filling up, an operator's `default_transaction_read_only`) must not
/// see it exit at its migrations: it waits until the database takes writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_started_while_the_database_is_read_only_waits_for_it() {
    let t = TestDb::empty(Backend::Postgres).await;
    let nats = NatsServer::start().await;
    let database: String =
        t.db.query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT current_database()::text AS name",
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get("", "name")
        .unwrap();
    t.db.execute_unprepared(&format!(
        "ALTER DATABASE {database} SET default_transaction_read_only = on"
    ))
    .await
    .unwrap();
    let consume = Seawall::spawn(
        &["consume"],
        &env(&t.url, &nats.url(), &[("TESTBED_TABLES", "skip")]),
    );
    wait_until(
        "the process waiting for the database",
        Duration::from_secs(30),
        || async {
            let log = consume.log_text();
            log.contains("the database cannot do this yet; waiting for it before starting")
                && log.contains("read-only transaction")
        },
    )
    .await;
    // Writable again: sessions opened while it was not keep their setting,
    // so they are ended, as a restart of the server would.
    t.db.execute_unprepared(&format!(
        "ALTER DATABASE {database} RESET default_transaction_read_only"
    ))
    .await
    .unwrap();
    t.db.execute_unprepared(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = '{database}' AND pid <> pg_backend_pid()"
    ))
    .await
    .unwrap();
    wait_until("the process running", Duration::from_secs(60), || async {
        consume.log_text().contains("seawall is running")
    })
    .await;
    let applied: Option<sea_orm::QueryResult> =
        t.db.query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT 1 AS one FROM seaql_migrations LIMIT 1",
        ))
        .await
        .unwrap();
    assert!(applied.is_some(), "the migrations were applied");
    consume.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_longer_than_the_ack_wait_is_delivered_once() {
    let (t, nats, js) = with_ledger_stream(Backend::Sqlite).await;
    let settings = env(
        &t.url,
        &nats.url(),
        &[
            ("SEAWALL_ACK_WAIT_MS", "1000"),
            ("TESTBED_WORK_MS", "3000"),
            ("SEAWALL_MAX_DELIVER", "2"),
        ],
    );
    let consume = Seawall::spawn(&["consume"], &settings);
    publish_entries(&js, &credits(1, "slow")).await;
    wait_until("the credit", Duration::from_secs(30), || async {
        count::<Entry>(&t.db).await == 1
    })
    .await;
    wait_until("the ack", Duration::from_secs(10), || async {
        ack_pending(&js).await == Some(0)
    })
    .await;
    let info = consumer_info(&js).await.unwrap();
    assert_eq!(info.delivered.consumer_sequence, 1, "delivered once");
    assert_eq!(info.num_redelivered, 0);
    assert_eq!(count::<DeadLetter>(&t.db).await, 0);
    assert_eq!(count::<Entry>(&t.db).await, 1);
    consume.assert_no_panic();
}
