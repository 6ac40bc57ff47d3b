//! The stream seawall owns: created with seawall's fields, and on an
//! existing stream only those fields are set, so what an operator changed
//! (limits, storage, a description) survives every start.

use std::time::Duration;

use async_nats::jetstream::stream;

use crate::helpers::ledger_stream;
use crate::support::nats::NatsServer;

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
