//! Micro-benchmarks of the pure functions on every message's path:
//! duplicate classification and envelope parsing.

use std::collections::BTreeMap;

use criterion::{Criterion, criterion_group, criterion_main};
use service::classify::{Engine, ErrorShape, INBOX_INDEX, classify_shape};
use service::envelope::{Envelope, message_id_from_headers};

fn classification(c: &mut Criterion) {
    let shapes = [
        ("postgres duplicate", ErrorShape::Database {
            backend: Engine::Postgres,
            code: Some("23505".into()),
            number: None,
            constraint: Some(INBOX_INDEX.into()),
            message: "duplicate key value violates unique constraint".into(),
        }),
        ("sqlite duplicate", ErrorShape::Database {
            backend: Engine::Sqlite,
            code: Some("2067".into()),
            number: None,
            constraint: None,
            message: "UNIQUE constraint failed: inbox_message.message_id, inbox_message.consumer".into(),
        }),
        ("mysql duplicate", ErrorShape::Database {
            backend: Engine::MySql,
            code: Some("23000".into()),
            number: Some(1062),
            constraint: None,
            message: "Duplicate entry 'a-credit' for key 'inbox_message.ix_inbox_message_id_consumer'".into(),
        }),
        ("postgres serialization", ErrorShape::Database {
            backend: Engine::Postgres,
            code: Some("40001".into()),
            number: None,
            constraint: None,
            message: "could not serialize access".into(),
        }),
    ];
    let mut group = c.benchmark_group("classify");
    for (name, shape) in &shapes {
        group.bench_function(*name, |b| {
            b.iter(|| classify_shape(std::hint::black_box(shape)))
        });
    }
    group.finish();
}

fn envelopes(c: &mut Criterion) {
    let nats: BTreeMap<String, String> = [(
        "Nats-Msg-Id".to_owned(),
        "01a22cc3-3b8c-7739-9ec3-f8f8128b6dc1".to_owned(),
    )]
    .into();
    let cloudevents: BTreeMap<String, String> = [
        ("ce-source".to_owned(), "/orders".to_owned()),
        ("ce-id".to_owned(), "42".to_owned()),
    ]
    .into();
    let payload = br#"{"account_id":"acct-1","amount":250}"#.to_vec();
    let mut group = c.benchmark_group("envelope");
    group.bench_function("id from Nats-Msg-Id", |b| {
        b.iter(|| message_id_from_headers(std::hint::black_box(&nats)))
    });
    group.bench_function("id from CloudEvents", |b| {
        b.iter(|| message_id_from_headers(std::hint::black_box(&cloudevents)))
    });
    group.bench_function("from_delivery", |b| {
        b.iter(|| Envelope::from_delivery("orders.placed", nats.clone(), payload.clone()))
    });
    group.finish();
}

criterion_group!(benches, classification, envelopes);
criterion_main!(benches);
