//! Messages flow end to end through `seawall run`.

use std::time::{Duration, Instant};

use crate::support::domain::Entry;
use entity::prelude::*;

use crate::helpers::{
    applied_events_once_each, drain, env, ledger_stream, publish_entries, req, with_ledger_stream,
};
use crate::on_backends;
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb};

const MESSAGES: usize = 1_000;

/// 1,000 requests -> 1,000 credits -> 1,000 events, each id once.
async fn a_thousand_requests_become_a_thousand_credits_and_events(backend: Backend) {
    let (t, nats, js) = with_ledger_stream(backend).await;
    let mut run = Seawall::spawn(&["run"], &env(&t.url, &nats.url(), &[]));
    let msgs: Vec<_> = (0..MESSAGES)
        .map(|i| (format!("e2e-{i}"), req(&format!("acct-{}", i % 10), 100)))
        .collect();
    let started = Instant::now();
    publish_entries(&js, &msgs).await;
    crate::helpers::wait_for_rows::<Entry>(&t.db, MESSAGES as u64, Duration::from_secs(120)).await;
    drain(&t.db, &js, Duration::from_secs(60)).await;
    let elapsed = started.elapsed();
    eprintln!(
        "e2e on {backend:?}: {MESSAGES} messages in {elapsed:?} = {:.0} messages/s (publish -> credit -> event published)",
        MESSAGES as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(t.count(Entry).await, MESSAGES as u64);
    assert_eq!(t.count(InboxMessage).await, MESSAGES as u64);
    assert_eq!(t.count(DeadLetter).await, 0);
    assert_eq!(applied_events_once_each(&js).await, MESSAGES);
    assert!(run.terminate().await.success(), "{}", run.log_text());
    run.assert_no_panic();
}
on_backends!(a_thousand_requests_become_a_thousand_credits_and_events: sqlite, postgres);

/// Nats-server stopped and restarted mid-run; both loops recover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relay_and_consumer_survive_a_nats_restart() {
    let t = TestDb::new(Backend::Sqlite).await;
    let mut nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    worker::ensure_stream(&js, &ledger_stream(Duration::from_secs(120)))
        .await
        .unwrap();
    let mut run = Seawall::spawn(&["run"], &env(&t.url, &nats.url(), &[]));
    let first: Vec<_> = (0..100)
        .map(|i| (format!("a-{i}"), req("acct", 1)))
        .collect();
    publish_entries(&js, &first).await;
    crate::helpers::wait_for_rows::<Entry>(&t.db, 100, Duration::from_secs(60)).await;

    nats.stop();
    // While the broker is down, a producer keeps writing outbox rows: the
    // relay's publishes fail and are retried, nothing is lost.
    let inbox = service::Inbox::new(service::Executor::new(t.db.clone()));
    let consumer = service::ConsumerName::parse("ledger").unwrap();
    for i in 0..50 {
        let env = crate::support::entry_envelope(&format!("offline-{i}"), "acct", 1, None);
        inbox
            .process(
                &env,
                &consumer,
                &crate::support::domain::LedgerHandler::default(),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // let the relay hit the outage
    nats.restart().await;
    let js = nats.jetstream().await;
    let second: Vec<_> = (0..100)
        .map(|i| (format!("b-{i}"), req("acct", 1)))
        .collect();
    publish_entries(&js, &second).await;
    crate::helpers::wait_for_rows::<Entry>(&t.db, 250, Duration::from_secs(90)).await;
    drain(&t.db, &js, Duration::from_secs(90)).await;
    assert_eq!(t.count(Entry).await, 250);
    assert_eq!(applied_events_once_each(&js).await, 250);
    assert!(run.terminate().await.success(), "{}", run.log_text());
    run.assert_no_panic();
}

/// The W3C trace context of a request travels through the inbox, the outbox
/// and the relay onto the event it caused, with its baggage, also in a
/// process that traces nothing itself (no OTLP endpoint): the context
/// passes through unchanged. `otel.rs` covers a process that exports.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_trace_context_travels_from_request_to_event() {
    let (t, nats, js) = with_ledger_stream(Backend::Sqlite).await;
    let mut run = Seawall::spawn(&["run"], &env(&t.url, &nats.url(), &[]));
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let payload = serde_json::to_vec(&req("acct", 5)).unwrap();
    let msg = async_nats::jetstream::message::PublishMessage::build()
        .payload(payload.into())
        .message_id("traced-1")
        .header("traceparent", parent)
        .header("baggage", "tenant=acme");
    js.send_publish("ledger.record", msg)
        .await
        .unwrap()
        .await
        .unwrap();
    crate::helpers::wait_for_rows::<Entry>(&t.db, 1, Duration::from_secs(30)).await;
    drain(&t.db, &js, Duration::from_secs(30)).await;
    let mut stream = js.get_stream("LEDGER").await.unwrap();
    let last = stream.info().await.unwrap().state.last_sequence;
    let event = stream.get_raw_message(last).await.unwrap();
    assert_eq!(event.subject.as_str(), "ledger.recorded");
    let header = |name: &str| event.headers.get(name).map(|v| v.to_string());
    let traceparent = header("traceparent").expect("the event carries a trace context");
    assert_eq!(traceparent, parent, "passed through unchanged");
    assert_eq!(header("baggage").as_deref(), Some("tenant=acme"));
    assert!(run.terminate().await.success());
}
