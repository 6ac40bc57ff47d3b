//! Poison inputs end as dead letters with a
//! readable reason while good messages flow; two consumers of one subject each
//! apply a message once.

use std::time::Duration;

use futures::future::BoxFuture;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use tokio_util::sync::CancellationToken;

use crate::support::domain::Entry;
use crate::support::domain::{LEDGER_CONSUMER, LedgerHandler};
use entity::dead_letter;
use entity::prelude::*;
use service::handler;
use service::{ConsumerName, Executor, HandlerError, Inbox, Registry};
use worker::{Consumer, ConsumerConfig};

use crate::helpers::{publish_entries, publish_raw, req, wait_for_rows, with_ledger_stream};
use crate::on_backends;
use crate::support::{Backend, TestDb, wait_until};

async fn start_consumers(
    t: &TestDb,
    js: &async_nats::jetstream::Context,
    registry: Registry,
) -> (CancellationToken, Vec<tokio::task::JoinHandle<()>>) {
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    let config = ConsumerConfig {
        max_deliver: 3,
        ack_wait: Duration::from_secs(5),
        nak_base: Duration::from_millis(10),
        ..ConsumerConfig::new(crate::support::domain::LEDGER_STREAM)
    };
    let cancel = CancellationToken::new();
    let mut tasks = Vec::new();
    for registration in registry.registrations() {
        let consumer = Consumer::new(
            inbox.clone(),
            js.clone(),
            registration.clone(),
            config.clone(),
        );
        consumer.ensure().await.unwrap();
        let cancel = cancel.clone();
        tasks.push(tokio::spawn(
            async move { consumer.run(cancel).await.unwrap() },
        ));
    }
    (cancel, tasks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_messages_are_dead_lettered_with_a_reason_while_good_ones_flow() {
    let (t, _nats, js) = with_ledger_stream(Backend::Sqlite).await;
    let always_fails = handler(|_ctx| -> BoxFuture<'_, Result<(), HandlerError>> {
        Box::pin(async {
            Err(HandlerError::Failed(
                "the downstream service is down".into(),
            ))
        })
    });
    let registry = Registry::new()
        .register_handler(
            ConsumerName::parse(LEDGER_CONSUMER).unwrap(),
            "ledger.record",
            LedgerHandler::default(),
        )
        .register_handler(
            ConsumerName::parse("flaky").unwrap(),
            "ledger.flaky",
            always_fails,
        );
    let (cancel, tasks) = start_consumers(&t, &js, registry).await;

    publish_raw(&js, Some("bad-json"), b"{not json").await;
    publish_raw(&js, None, br#"{"account_id":"a","amount":5}"#).await;
    publish_raw(&js, Some("negative"), br#"{"account_id":"a","amount":-5}"#).await;
    publish_raw(&js, Some("fraction"), br#"{"account_id":"a","amount":1.5}"#).await;
    let msg = async_nats::jetstream::message::PublishMessage::build()
        .payload("{}".into())
        .message_id("flaky-1");
    js.send_publish("ledger.flaky", msg)
        .await
        .unwrap()
        .await
        .unwrap();
    let good: Vec<_> = (0..20)
        .map(|i| (format!("good-{i}"), req("acct", 10)))
        .collect();
    publish_entries(&js, &good).await;

    wait_for_rows::<Entry>(&t.db, 20, Duration::from_secs(30)).await;
    wait_for_rows::<DeadLetter>(&t.db, 5, Duration::from_secs(30)).await;
    let reason = |id: Option<&'static str>| {
        let db = t.db.clone();
        async move {
            let q = DeadLetter::find();
            let q = match id {
                Some(id) => q.filter(dead_letter::Column::MessageId.eq(id)),
                None => q.filter(dead_letter::Column::MessageId.is_null()),
            };
            q.one(&db).await.unwrap().expect("a dead letter")
        }
    };
    assert!(
        reason(Some("bad-json"))
            .await
            .error
            .contains("malformed entry")
    );
    assert!(reason(None).await.error.contains("no id"));
    assert!(
        reason(Some("negative"))
            .await
            .error
            .contains("amount must be positive")
    );
    assert!(
        reason(Some("fraction"))
            .await
            .error
            .contains("malformed entry")
    );
    let flaky = reason(Some("flaky-1")).await;
    assert_eq!(
        flaky.deliveries, 3,
        "dead-lettered only after the configured deliveries"
    );
    assert!(
        flaky.error.contains("gave up after 3 deliveries")
            && flaky.error.contains("downstream service is down"),
        "{}",
        flaky.error
    );
    assert_eq!(flaky.consumer, "flaky");
    assert_eq!(flaky.payload, b"{}");

    cancel.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(t.count(Entry).await, 20);
    assert_eq!(
        t.count(DeadLetter).await,
        5,
        "nothing else was dead-lettered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_consumers_of_one_subject_each_apply_a_message_once() {
    let (t, _nats, js) = with_ledger_stream(Backend::Postgres).await;
    let registry = Registry::new()
        .register_handler(
            ConsumerName::parse(LEDGER_CONSUMER).unwrap(),
            "ledger.record",
            LedgerHandler::default(),
        )
        .register_handler(
            ConsumerName::parse("mirror").unwrap(),
            "ledger.record",
            LedgerHandler::default(),
        );
    let (cancel, tasks) = start_consumers(&t, &js, registry).await;
    let msgs: Vec<_> = (0..50)
        .map(|i| (format!("both-{i}"), req("acct", 1)))
        .collect();
    publish_entries(&js, &msgs).await;
    publish_entries(&js, &msgs[..10]).await; // deduped by JetStream: still 50
    wait_for_rows::<InboxMessage>(&t.db, 100, Duration::from_secs(30)).await;
    // No relay runs here, so the outbox is not drained; wait for the consumers.
    wait_until("both consumers to ack everything", Duration::from_secs(30), || async {
        let mut idle = true;
        for name in ["ledger", "mirror"] {
            let mut c = js.get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(name, "LEDGER").await.unwrap();
            let info = c.info().await.unwrap();
            idle &= info.num_pending == 0 && info.num_ack_pending == 0;
        }
        idle
    })
    .await;
    cancel.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    for consumer in ["ledger", "mirror"] {
        let n = InboxMessage::find()
            .filter(entity::inbox_message::Column::Consumer.eq(consumer))
            .all(&t.db)
            .await
            .unwrap()
            .len();
        assert_eq!(n, 50, "{consumer} applied each message once");
    }
    assert_eq!(t.count(Entry).await, 100);
}

/// A subject longer than 255 bytes (the broker takes subjects up to its
/// control line) is held in full by the dead letter, which keeps the
/// message's id: before the columns were unbounded text, the insert failed
/// with a value-too-long error on PostgreSQL and MariaDB and the message
/// was nak'ed forever with no row.
async fn a_long_subject_is_dead_lettered_whole_with_its_id(backend: Backend) {
    let (t, _nats, js) = with_ledger_stream(backend).await;
    let registry = Registry::new().register_handler(
        ConsumerName::parse(LEDGER_CONSUMER).unwrap(),
        "ledger.>",
        LedgerHandler::default(),
    );
    let (cancel, tasks) = start_consumers(&t, &js, registry).await;
    let subject = format!("ledger.{}", "s".repeat(300));
    let msg = async_nats::jetstream::message::PublishMessage::build()
        .payload("{not json".into())
        .message_id("long-subject");
    js.send_publish(subject.clone(), msg)
        .await
        .unwrap()
        .await
        .unwrap();
    wait_for_rows::<DeadLetter>(&t.db, 1, Duration::from_secs(30)).await;
    cancel.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    let dead = DeadLetter::find().one(&t.db).await.unwrap().unwrap();
    assert_eq!(dead.subject, subject);
    assert_eq!(dead.message_id.as_deref(), Some("long-subject"));
    assert!(dead.error.contains("malformed"), "{}", dead.error);
}

on_backends!(a_long_subject_is_dead_lettered_whole_with_its_id: postgres, mysql);

/// At the default log level (`warn`), a dead letter's line names its
/// message and consumer, in text and in JSON (where the fields of the
/// message's span are merged into the line): an operator can find the
/// message from the log alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_is_logged_with_its_message_id_and_consumer_at_the_default_level() {
    for format in ["text", "json"] {
        let (t, nats, js) = with_ledger_stream(Backend::Sqlite).await;
        let env = crate::helpers::env(
            &t.url,
            &nats.url(),
            &[("SEAWALL_LOG", ""), ("SEAWALL_LOG_FORMAT", format)],
        );
        let mut consume = crate::support::process::Seawall::spawn(&["consume"], &env);
        let id = format!("unparsable-{format}");
        publish_raw(&js, Some(&id), b"{not json").await;
        wait_for_rows::<DeadLetter>(&t.db, 1, Duration::from_secs(60)).await;
        wait_until(
            "the dead letter's log line",
            Duration::from_secs(30),
            || async { consume.log_text().contains("dead-lettered") },
        )
        .await;
        let log = consume.log_text();
        let line = log.lines().find(|l| l.contains("dead-lettered")).unwrap();
        match format {
            "json" => {
                let line: serde_json::Value = serde_json::from_str(line).unwrap();
                assert_eq!(line["message_id"], id.as_str(), "{line}");
                assert_eq!(line["consumer"], LEDGER_CONSUMER, "{line}");
            }
            _ => assert!(
                line.contains(&format!("message_id=\"{id}\""))
                    && line.contains(&format!("consumer={LEDGER_CONSUMER}")),
                "{line}"
            ),
        }
        assert!(consume.terminate().await.success(), "{log}");
    }
}
