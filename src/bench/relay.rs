//! Outbox relay throughput against the fastest plain JetStream publisher, on
//! the same machine, stream settings and payloads, in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::future::IntoFuture;

use anyhow::Result;
use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use worker::{Relay, RelayConfig, StreamSpec};

use super::cpu::{self, CpuSample};
use super::report::Report;

/// Publishes in flight at once in the baseline (the client's default limit).
const IN_FLIGHT: usize = 4_096;

/// A fresh stream with the relay's settings.
async fn stream(js: &jetstream::Context, name: &str) -> Result<String> {
    let subject = format!("bench.{}", name.to_lowercase());
    worker::ensure_stream(
        js,
        &StreamSpec {
            name: name.to_owned(),
            subjects: vec![format!("{subject}.>")],
            duplicate_window: Duration::from_secs(120),
            max_age: Duration::from_secs(3600),
            replicas: 1,
        },
    )
    .await?;
    Ok(format!("{subject}.e"))
}

/// The baseline: a plain pipelined publisher awaiting every PubAck.
async fn plain_publisher(
    js: &jetstream::Context,
    subject: &str,
    rows: u64,
    size: usize,
) -> Result<f64> {
    let payload = bytes_of(size);
    let started = Instant::now();
    let mut acks = FuturesUnordered::new();
    for i in 0..rows {
        let msg = PublishMessage::build()
            .payload(payload.clone().into())
            .message_id(format!("p-{i}"));
        let ack: PublishAckFuture = js.send_publish(subject.to_owned(), msg).await?;
        acks.push(ack.into_future());
        while acks.len() >= IN_FLIGHT {
            if let Some(ack) = acks.next().await {
                ack?;
            }
        }
    }
    while let Some(ack) = acks.next().await {
        ack?;
    }
    Ok(rows as f64 / started.elapsed().as_secs_f64())
}

/// "total (this + PostgreSQL + NATS)" in ms of CPU per 1,000 messages.
fn cpu_cell([this, pg, nats, total]: [f64; 4]) -> String {
    if pg > 0.0 {
        cpu::breakdown(total, &[this, pg, nats], 1)
    } else {
        cpu::breakdown(total, &[this, nats], 1)
    }
}

fn bytes_of(size: usize) -> Vec<u8> {
    vec![b'x'; size]
}

/// Writes `rows` outbox rows of `size` bytes on `subject`.
pub async fn fill(db: &DatabaseConnection, subject: &str, rows: u64, size: usize) -> Result<()> {
    let sql = format!(
        "INSERT INTO outbox_message (message_id, subject, payload, headers, created_at, attempts, next_attempt_at)
         SELECT 'r-' || g, '{subject}', convert_to(repeat('x', {size}), 'UTF8'), '{{}}'::json, now(), 0, now()
         FROM generate_series(1, {rows}) AS g"
    );
    db.execute_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await?;
    db.execute_raw(Statement::from_string(
        DbBackend::Postgres,
        "VACUUM ANALYZE outbox_message",
    ))
    .await?;
    Ok(())
}

/// Runs `relays` relays until the outbox is empty; rows per second.
async fn relays(
    db: &DatabaseConnection,
    js: &jetstream::Context,
    relays: usize,
    rows: u64,
) -> Result<f64> {
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..relays {
        let relay = Relay::new(
            db.clone(),
            js.clone(),
            RelayConfig {
                instance: format!("bench-relay-{i}"),
                batch_size: 1_000,
                poll_interval: Duration::from_millis(20),
                ..RelayConfig::default()
            },
            Arc::new(Notify::new()),
        );
        let cancel = cancel.clone();
        tasks.push(tokio::spawn(async move { relay.run(cancel).await }));
    }
    loop {
        if worker::relay::pending_count(db).await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    cancel.cancel();
    for t in tasks {
        t.await?;
    }
    Ok(rows as f64 / elapsed.as_secs_f64())
}

/// Runs the scenario.
pub async fn run(pg: &str, nats_url: &str, rows: u64) -> Result<Report> {
    let mut report = Report::new("relay");
    let client = seawall::nats::connect(nats_url).await?;
    report
        .versions
        .push(("nats-server".into(), client.server_info().version.clone()));
    let js = jetstream::new(client);
    let mut pg_version = None;
    report.setup.push(("rows".into(), format!("{rows} per measurement, pre-filled on PostgreSQL, each published with Nats-Msg-Id and its PubAck awaited")));
    report.setup.push(("baseline".into(), format!("plain async-nats publisher, {IN_FLIGHT} PubAcks in flight, no database, same stream settings")));
    report.setup.push(("CPU".into(), "user+system time of this process, all postgres and all nats-server processes over the measurement (/proc), per 1,000 messages; the ceiling is cores / that".into()));
    for size in [256usize, 4096] {
        let id = uuid::Uuid::now_v7().simple().to_string();
        let subject = stream(&js, &format!("BASE{size}_{}", &id[id.len() - 8..])).await?;
        let before = CpuSample::now();
        let base = plain_publisher(&js, &subject, rows, size).await?;
        let base_cpu = CpuSample::now().since(&before).per_thousand(rows);
        eprintln!("  {size} B plain publisher: {base:.0}/s");
        for n in [1usize, 3] {
            let (db, _) = super::fresh_pg(pg, "relay").await?;
            if pg_version.is_none() {
                pg_version = Some(super::pg_version(&db).await?);
            }
            let id = uuid::Uuid::now_v7().simple().to_string();
            let subject = stream(&js, &format!("RELAY{size}_{n}_{}", &id[id.len() - 8..])).await?;
            fill(&db, &subject, rows, size).await?;
            let before = CpuSample::now();
            let rate = relays(&db, &js, n, rows).await?;
            let cpu = CpuSample::now().since(&before).per_thousand(rows);
            eprintln!("  {size} B, {n} relay(s): {rate:.0}/s");
            report.row(
                format!("{size} B, {n} relay(s)"),
                vec![
                    ("relay rows/s", format!("{rate:.0}")),
                    ("plain publisher msg/s", format!("{base:.0}")),
                    ("relay/plain", format!("{:.2}", rate / base)),
                    ("relay CPU ms/1k rows (seawall+PG+NATS)", cpu_cell(cpu)),
                    ("plain CPU ms/1k msgs (client+NATS)", cpu_cell(base_cpu)),
                    (
                        "relay CPU-bound ceiling rows/s",
                        format!("{:.0}", report.cores as f64 * 1e6 / cpu[3].max(1e-9)),
                    ),
                ],
            );
            db.close().await?;
        }
    }
    if let Some(v) = pg_version {
        report.versions.push(("PostgreSQL".into(), v));
    }
    Ok(report)
}
