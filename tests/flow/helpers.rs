//! Helpers shared by the flow tests.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};
use sea_orm::{DatabaseConnection, EntityTrait, PaginatorTrait};

use crate::support::domain::{EntryRequest, LEDGER_STREAM, RECORD_SUBJECT, RECORDED_SUBJECT};
use worker::StreamSpec;

use crate::support::nats::NatsServer;
use crate::support::{Backend, TestDb};

/// The test domain's stream with a given duplicate window.
pub fn ledger_stream(window: Duration) -> StreamSpec {
    StreamSpec {
        name: LEDGER_STREAM.into(),
        subjects: vec!["ledger.>".into()],
        duplicate_window: window,
        max_age: Duration::from_secs(3600),
        replicas: 1,
    }
}

/// What most flow tests start from: a fresh database on `backend`, a fresh
/// nats-server, and the LEDGER stream with a two-minute duplicate window.
pub async fn with_ledger_stream(backend: Backend) -> (TestDb, NatsServer, jetstream::Context) {
    let t = TestDb::new(backend).await;
    let (nats, js) = ledger_nats().await;
    (t, nats, js)
}

/// A nats-server of the test's own with the ledger stream (a 120 s
/// duplicate window), for a database the test makes itself.
pub async fn ledger_nats() -> (NatsServer, jetstream::Context) {
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    worker::ensure_stream(&js, &ledger_stream(Duration::from_secs(120)))
        .await
        .unwrap();
    (nats, js)
}

/// Environment for a `seawall` process.
pub fn env(db_url: &str, nats_url: &str, extra: &[(&str, &str)]) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("SEAWALL_DATABASE_URL", db_url.to_owned()),
        ("SEAWALL_NATS_URL", nats_url.to_owned()),
        ("SEAWALL_RELAY_POLL_MS", "200".to_owned()),
        // `run` serves the admin API too; tests run in parallel, so each
        // takes a free port.
        ("SEAWALL_API_ADDR", "127.0.0.1:0".to_owned()),
    ];
    for (k, v) in extra {
        let key: &'static str = Box::leak(k.to_string().into_boxed_str());
        env.push((key, (*v).to_owned()));
    }
    env
}

/// Publishes `ledger.record` messages, each with its own `Nats-Msg-Id`.
pub async fn publish_entries(js: &jetstream::Context, msgs: &[(String, EntryRequest)]) {
    let mut acks = Vec::new();
    for (id, req) in msgs {
        let payload = serde_json::to_vec(req).unwrap();
        let msg = PublishMessage::build()
            .payload(payload.into())
            .message_id(id);
        acks.push(js.send_publish(RECORD_SUBJECT, msg).await.unwrap());
    }
    for ack in acks {
        ack.await.unwrap();
    }
}

/// Publishes a raw message on `ledger.record`.
pub async fn publish_raw(js: &jetstream::Context, id: Option<&str>, payload: &[u8]) {
    let mut msg = PublishMessage::build().payload(payload.to_vec().into());
    if let Some(id) = id {
        msg = msg.message_id(id);
    }
    js.send_publish(RECORD_SUBJECT, msg)
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Every message stored on `subject`, as (Nats-Msg-Id, payload), in stream order.
pub async fn stored_on(js: &jetstream::Context, subject: &str) -> Vec<(String, Vec<u8>)> {
    let mut stream = js.get_stream(LEDGER_STREAM).await.unwrap();
    let last = stream.info().await.unwrap().state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let Ok(msg) = stream.get_raw_message(seq).await else {
            continue;
        };
        if msg.subject.as_str() == subject {
            let id = msg
                .headers
                .get("Nats-Msg-Id")
                .map(|v| v.to_string())
                .unwrap_or_default();
            out.push((id, msg.payload.to_vec()));
        }
    }
    out
}

/// `ledger.recorded` events: asserts each id is there once and returns the count.
pub async fn applied_events_once_each(js: &jetstream::Context) -> usize {
    let events = stored_on(js, RECORDED_SUBJECT).await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (id, _) in &events {
        *seen.entry(id.clone()).or_default() += 1;
    }
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "events stored more than once: {repeated:?}"
    );
    events.len()
}

/// Waits until `count(E)` reaches `n`.
pub async fn wait_for_rows<E>(db: &DatabaseConnection, n: u64, timeout: Duration)
where
    E: EntityTrait + Default,
    E::Model: Send + Sync,
{
    let what = format!("{n} rows in {}", E::default().table_name());
    crate::support::wait_until(&what, timeout, || async {
        E::find().count(db).await.unwrap_or(0) >= n
    })
    .await;
}

/// Drains the outbox and the `ledger` consumer.
pub async fn drain(db: &DatabaseConnection, js: &jetstream::Context, timeout: Duration) {
    worker::drain(db, js, LEDGER_STREAM, &["ledger"], timeout)
        .await
        .unwrap();
}

pub fn req(account: &str, amount: i64) -> EntryRequest {
    EntryRequest {
        account_id: account.into(),
        amount,
        reference: None,
    }
}
