//! The relay at its edges: rows it cannot encode (written by hand, as a
//! buggy service or a manual fix could), and a key whose head keeps failing.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use sea_orm::ActiveValue::Set;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, TransactionTrait};
use tokio::sync::Notify;

use entity::outbox_message;
use service::{EventError, NewEvent, Outbox, OutboxError};
use worker::{Relay, RelayConfig};

use crate::helpers::{env, stored_on, with_ledger_stream};
use crate::on_backends;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, wait_until};

const SUBJECT: &str = "ledger.recorded";

/// Inserts a row directly, bypassing [`NewEvent::validate`].
async fn insert_raw(
    db: &DatabaseConnection,
    message_id: &str,
    subject: &str,
    headers: serde_json::Value,
    ordering_key: Option<&str>,
) {
    let mut event = crate::support::rows::event(message_id.into(), Utc::now());
    event.subject = Set(subject.into());
    event.headers = Set(headers);
    event.ordering_key = Set(ordering_key.map(Into::into));
    outbox_message::Entity::insert(event)
        .exec_without_returning(db)
        .await
        .unwrap();
}

async fn row(db: &DatabaseConnection, message_id: &str) -> outbox_message::Model {
    outbox_message::Entity::find()
        .filter(outbox_message::Column::MessageId.eq(message_id))
        .one(db)
        .await
        .unwrap()
        .unwrap()
}

/// Rows async-nats would panic on are failed attempts of those rows alone:
/// good rows around them are published, the poison ones end dead with the
/// reason, and the relay process stays up.
async fn rows_the_relay_cannot_encode_fail_alone_and_the_relay_stays_up(backend: Backend) {
    let (t, nats, js) = with_ledger_stream(backend).await;
    insert_raw(&t.db, "good-1", SUBJECT, serde_json::json!({}), None).await;
    let poison = [
        ("space-name", serde_json::json!({"bad name": "v"}), None),
        ("colon-name", serde_json::json!({"a:b": "v"}), None),
        (
            "crlf-value",
            serde_json::json!({"x-note": "one\r\ntwo"}),
            None,
        ),
        ("newline-id\nsecond-line", serde_json::json!({}), None),
        ("array-headers", serde_json::json!(["x"]), None),
        (
            "keyed-head",
            serde_json::json!({"x y": "z"}),
            Some("acct-1"),
        ),
    ];
    for (id, headers, key) in &poison {
        insert_raw(&t.db, id, SUBJECT, headers.clone(), *key).await;
    }
    insert_raw(
        &t.db,
        "keyed-next",
        SUBJECT,
        serde_json::json!({}),
        Some("acct-1"),
    )
    .await;
    insert_raw(
        &t.db,
        "good-2",
        SUBJECT,
        serde_json::json!({"x-fine": "yes"}),
        None,
    )
    .await;

    let relay = Seawall::spawn(
        &["relay"],
        &env(&t.url, &nats.url(), &[("SEAWALL_RELAY_MAX_ATTEMPTS", "2")]),
    );
    wait_until(
        "poison rows dead, the rest published",
        Duration::from_secs(30),
        || async { worker::relay::pending_count(&t.db).await.unwrap() == 0 },
    )
    .await;
    for (id, _, _) in &poison {
        let r = row(&t.db, id).await;
        assert!(r.dead_at.is_some() && r.published_at.is_none(), "{id}");
        assert_eq!(r.attempts, 2, "{id}");
        assert!(r.last_error.is_some(), "{id}");
    }
    assert!(
        row(&t.db, "colon-name")
            .await
            .last_error
            .unwrap()
            .contains("header name")
    );
    let mut published: Vec<String> = stored_on(&js, SUBJECT)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    published.sort();
    assert_eq!(published, ["good-1", "good-2", "keyed-next"]);
    relay.assert_no_panic();
    let mut relay = relay;
    assert!(relay.terminate().await.success(), "the relay was still up");
}

on_backends!(rows_the_relay_cannot_encode_fail_alone_and_the_relay_stays_up: sqlite, postgres);

/// An event NATS cannot carry is refused at enqueue, naming the part, and
/// nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_with_a_bad_header_or_id_is_refused_at_enqueue() {
    let t = TestDb::new(Backend::Sqlite).await;
    let cases = [
        (
            NewEvent::new(SUBJECT, "x").with_header("bad name", "v"),
            EventError::HeaderName("bad name".into()),
        ),
        (
            NewEvent::new(SUBJECT, "x").with_header("x-ok", "a\nb"),
            EventError::HeaderValue("x-ok".into()),
        ),
        (
            NewEvent::new(SUBJECT, "x").with_message_id("a\r\nb"),
            EventError::MessageId("a\r\nb".into()),
        ),
        // What a consumer cannot hold, refused where it is written: longer
        // than an envelope's id, or with a tab.
        (
            NewEvent::new(SUBJECT, "x").with_message_id("x".repeat(201)),
            EventError::MessageId("x".repeat(201)),
        ),
        (
            NewEvent::new(SUBJECT, "x").with_message_id("a\tb"),
            EventError::MessageId("a\tb".into()),
        ),
    ];
    for (event, expected) in cases {
        let txn = t.db.begin().await.unwrap();
        match Outbox::default().enqueue(&txn, event).await {
            Err(OutboxError::Invalid(err)) => assert_eq!(err, expected),
            other => panic!("expected {expected:?}, got {other:?}"),
        }
        txn.commit().await.unwrap();
    }
    assert_eq!(t.count(outbox_message::Entity).await, 0);
}

/// A key whose head keeps failing does not take the batch: with batch size
/// 5, a head on an unroutable subject and 10 rows behind it, an unkeyed row
/// and another key's row go out in the rounds right after the head's failure.
async fn a_blocked_key_does_not_starve_other_rows(backend: Backend) {
    let (t, _nats, js) = with_ledger_stream(backend).await;
    let json = serde_json::json!({});
    insert_raw(&t.db, "head", "nowhere.to.go", json.clone(), Some("stuck")).await;
    for i in 0..10 {
        insert_raw(
            &t.db,
            &format!("behind-{i}"),
            SUBJECT,
            json.clone(),
            Some("stuck"),
        )
        .await;
    }
    insert_raw(&t.db, "unkeyed", SUBJECT, json.clone(), None).await;
    insert_raw(&t.db, "other-key", SUBJECT, json.clone(), Some("fine")).await;
    let relay = Relay::new(
        t.db.clone(),
        js.clone(),
        RelayConfig {
            batch_size: 5,
            retry_base: Duration::from_secs(30),
            ..RelayConfig::default()
        },
        Arc::new(Notify::new()),
    );
    let first = relay.relay_once().await.unwrap();
    assert_eq!(first.failed, 1, "the head fails first: {first:?}");
    for _ in 0..2 {
        relay.relay_once().await.unwrap();
    }
    for id in ["unkeyed", "other-key"] {
        assert!(
            row(&t.db, id).await.published_at.is_some(),
            "{id} waits behind the stuck key"
        );
    }
    for i in 0..10 {
        let r = row(&t.db, &format!("behind-{i}")).await;
        assert!(r.published_at.is_none(), "behind-{i} overtook its head");
    }
}

on_backends!(a_blocked_key_does_not_starve_other_rows: sqlite, postgres, mysql);
