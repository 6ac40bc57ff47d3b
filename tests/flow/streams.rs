//! The stream seawall owns: created with seawall's fields, and on an
//! existing stream only those fields are set, so what an operator changed
//! (limits, storage, a description) survives every start. A stream another
//! service owns, which a consumer only reads, is never created or changed.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::pull, message::PublishMessage, stream};
use sea_orm::{EntityTrait, PaginatorTrait};

use crate::helpers::{env, ledger_stream, req, with_ledger_stream};
use crate::support::domain::{Entry, LEDGER_STREAM};
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::{Backend, wait_until};

/// The stream of another service the testbed's `ledger_foreign` consumer
/// reads in these tests (`TESTBED_FOREIGN`).
const PAYMENTS: &str = "PAYMENTS";
const PAYMENT_SUBJECT: &str = "payments.credit";
const FOREIGN_CONSUMER: &str = "ledger_foreign";

/// The replay subjects seawall adds to the stream it owns.
fn replay_subjects() -> String {
    service::dead_letter::replay_subjects(&ledger_stream(Duration::ZERO).name)
}

/// A stream an operator made (or changed after seawall made it) keeps every
/// field seawall does not own; seawall's own (subjects, duplicate window,
/// maximum age, replicas) are set, and a second start changes nothing.
#[tokio::test]
async fn an_existing_stream_keeps_the_fields_seawall_does_not_own() {
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    let spec = ledger_stream(Duration::from_secs(120));
    js.create_stream(stream::Config {
        name: spec.name.clone(),
        subjects: vec!["ledger.>".into()],
        description: Some("kept by operations".into()),
        max_messages: 100_000,
        max_bytes: 64 << 20,
        duplicate_window: Duration::from_secs(1),
        ..Default::default()
    })
    .await
    .unwrap();

    let set = worker::ensure_stream(&js, &spec).await.unwrap();
    let again = worker::ensure_stream(&js, &spec).await.unwrap();
    let stored = js
        .get_stream(&spec.name)
        .await
        .unwrap()
        .cached_info()
        .clone();
    for config in [&set.config, &again.config, &stored.config] {
        assert_eq!(config.description.as_deref(), Some("kept by operations"));
        assert_eq!(config.max_messages, 100_000);
        assert_eq!(config.max_bytes, 64 << 20);
        assert_eq!(config.duplicate_window, Duration::from_secs(120));
        assert_eq!(config.max_age, spec.max_age);
        assert_eq!(
            config.subjects,
            vec!["ledger.>".to_owned(), replay_subjects()]
        );
    }
}

/// With no stream yet, seawall makes one with its fields and JetStream's
/// defaults for the rest.
#[tokio::test]
async fn a_missing_stream_is_created_with_seawalls_fields() {
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    let spec = ledger_stream(Duration::from_secs(90));
    let made = worker::ensure_stream(&js, &spec).await.unwrap();
    assert_eq!(made.config.duplicate_window, Duration::from_secs(90));
    assert_eq!(made.config.max_age, spec.max_age);
    assert_eq!(made.config.max_messages, -1);
    assert_eq!(
        made.config.subjects,
        vec!["ledger.>".to_owned(), replay_subjects()]
    );
}

/// What another service's stream looks like: its own subjects, window,
/// limits and description, none of them seawall's.
async fn payments_stream(js: &jetstream::Context) -> stream::Config {
    let stream = js
        .create_stream(stream::Config {
            name: PAYMENTS.into(),
            subjects: vec!["payments.>".into()],
            description: Some("owned by the payments team".into()),
            max_messages: 50_000,
            duplicate_window: Duration::from_secs(7),
            max_age: Duration::from_secs(3600),
            ..Default::default()
        })
        .await
        .unwrap();
    stream.cached_info().config.clone()
}

/// Publishes `n` credits on `subject`, a header map each (`headers`).
async fn publish_credits(
    js: &jetstream::Context,
    subject: &str,
    prefix: &str,
    n: usize,
    headers: HeaderMap,
) {
    for i in 0..n {
        let payload = serde_json::to_vec(&req("acct", 1)).unwrap();
        let msg = PublishMessage::build()
            .payload(payload.into())
            .headers(headers.clone())
            .message_id(format!("{prefix}-{i}"));
        js.send_publish(subject.to_owned(), msg)
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

/// A consumer of another service's stream: start-up leaves that stream as
/// its owner made it (every field), the consumer handles what is published
/// there, and a dead letter replayed to it (as the admin API does, onto its
/// replay subject on the domain's own stream) reaches it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_another_service_owns_is_read_and_never_changed() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    let before = payments_stream(&js).await;
    // One of the owner's own consumers, with the name seawall's consumer has.
    let theirs = pull::Config {
        durable_name: Some(FOREIGN_CONSUMER.into()),
        description: Some("the payments team's".into()),
        filter_subject: "payments.refund".into(),
        ..Default::default()
    };
    js.get_stream(PAYMENTS)
        .await
        .unwrap()
        .create_consumer(theirs)
        .await
        .unwrap();
    let foreign = format!("{PAYMENTS}:{PAYMENT_SUBJECT}");
    let mut consume = Seawall::spawn(
        &["consume"],
        &env(&t.url, &nats.url(), &[("TESTBED_FOREIGN", &foreign)]),
    );
    wait_until("the consumer running", Duration::from_secs(60), || async {
        consume.log_text().contains("seawall is running")
    })
    .await;
    publish_credits(&js, PAYMENT_SUBJECT, "pay", 20, HeaderMap::new()).await;
    let replay = service::dead_letter::replay_subject(LEDGER_STREAM, FOREIGN_CONSUMER);
    let mut headers = HeaderMap::new();
    headers.insert(service::dead_letter::REPLAY_OF_HEADER, PAYMENT_SUBJECT);
    publish_credits(&js, &replay, "replayed", 1, headers).await;
    wait_until("21 credits", Duration::from_secs(60), || async {
        Entry::find().count(&t.db).await.unwrap() == 21
    })
    .await;
    let stream = js.get_stream(PAYMENTS).await.unwrap();
    let after = stream.cached_info().config.clone();
    assert_eq!(
        after, before,
        "the other service's stream is as its owner made it"
    );
    let mut kept = stream
        .get_consumer::<pull::Config>(FOREIGN_CONSUMER)
        .await
        .unwrap();
    let kept = kept.info().await.unwrap().config.clone();
    assert_eq!(
        kept.filter_subject, "payments.refund",
        "the owner's consumer is untouched"
    );
    assert_eq!(kept.description.as_deref(), Some("the payments team's"));
    let ours = format!("{LEDGER_STREAM}-{FOREIGN_CONSUMER}");
    let mut ours = stream.get_consumer::<pull::Config>(&ours).await.unwrap();
    assert_eq!(ours.info().await.unwrap().num_pending, 0);
    assert!(
        consume.terminate().await.success(),
        "{}",
        consume.log_text()
    );
}

/// A stream another service owns that does not exist stops start-up,
/// naming it and the consumer; seawall does not make it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_stream_another_service_owns_stops_start_up_and_is_not_made() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    let foreign = format!("{PAYMENTS}:{PAYMENT_SUBJECT}");
    let mut consume = Seawall::spawn(
        &["consume"],
        &env(&t.url, &nats.url(), &[("TESTBED_FOREIGN", &foreign)]),
    );
    let status = tokio::time::timeout(Duration::from_secs(60), consume.wait()).await;
    let log = consume.log_text();
    let status = status.unwrap_or_else(|_| panic!("start-up did not stop:\n{log}"));
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("stream PAYMENTS, which consumer ledger_foreign reads")
            && log.contains("does not exist"),
        "{log}"
    );
    assert!(
        !worker::stream_exists(&js, PAYMENTS).await.unwrap(),
        "seawall made another service's stream"
    );
}
