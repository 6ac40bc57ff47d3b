//! Micro-benchmark of building the NATS message for an outbox row (headers
//! from JSON plus `Nats-Msg-Id`), done once per published row.

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use entity::outbox_message;

fn rows() -> Vec<(&'static str, outbox_message::Model)> {
    let now = chrono::Utc::now();
    let row = |headers: serde_json::Value, size: usize| outbox_message::Model {
        id: 1,
        message_id: "01a22cc3-3b8c-7739-9ec3-f8f8128b6dc1".into(),
        subject: "credits.applied".into(),
        payload: vec![b'x'; size],
        headers,
        ordering_key: Some("acct-1".into()),
        created_at: now,
        published_at: None,
        attempts: 0,
        last_error: None,
        next_attempt_at: now,
        locked_by: None,
        locked_until: None,
        dead_at: None,
        causation_id: None,
        causation_consumer: None,
        correlation_id: None,
    };
    vec![
        ("no headers, 256 B", row(serde_json::json!({}), 256)),
        (
            "traceparent, 256 B",
            row(
                serde_json::json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}),
                256,
            ),
        ),
        (
            "traceparent, 4 KiB",
            row(
                serde_json::json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}),
                4096,
            ),
        ),
    ]
}

fn build(c: &mut Criterion) {
    let mut group = c.benchmark_group("publish_message");
    for (name, row) in rows() {
        group.bench_function(name, |b| {
            b.iter_batched(
                || row.payload.clone(),
                |payload| worker::relay::publish_message(std::hint::black_box(&row), payload),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, build);
criterion_main!(benches);
