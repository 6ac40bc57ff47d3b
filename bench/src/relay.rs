//! Outbox relay throughput against the fastest plain JetStream publisher, on
//! the same machine, stream settings and payloads, in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::future::IntoFuture;

use anyhow::Result;
use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, FromQueryResult, Statement};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use worker::{Relay, RelayConfig, StreamSpec};

use crate::cpu::{CpuSample, PerThousand};
use crate::pg::{self, PgServer};
use crate::report::{Column, Figures, Report};

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

/// Writes `rows` events of `size` bytes on `subject` into the WAL as a
/// handler would in WAL mode: one logical message per transaction, from 8
/// connections at once. `slot` must exist first, or the slot never sees them.
async fn fill_wal(db: &DatabaseConnection, subject: &str, rows: u64, size: usize) -> Result<()> {
    let payload = bytes_of(size);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (db, next, payload, subject) = (
            db.clone(),
            next.clone(),
            payload.clone(),
            subject.to_owned(),
        );
        writers.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= rows {
                    return Ok::<(), anyhow::Error>(());
                }
                let event = service::wal::WalEvent {
                    message_id: format!("w-{i}"),
                    subject: subject.clone(),
                    ordering_key: None,
                    headers: std::collections::BTreeMap::new(),
                    payload: payload.clone().into(),
                    causation_id: None,
                    causation_consumer: None,
                    correlation_id: None,
                    created_at: chrono::Utc::now(),
                };
                db.execute_raw(Statement::from_sql_and_values(
                    DbBackend::Postgres,
                    "SELECT pg_logical_emit_message(true, $1, $2)",
                    [
                        service::wal::PREFIX.into(),
                        service::wal::encode(&[event])?.into(),
                    ],
                ))
                .await?;
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done??;
    }
    Ok(())
}

/// Messages stored in `stream`.
async fn stored(js: &jetstream::Context, stream: &str) -> Result<u64> {
    Ok(js.get_stream(stream).await?.info().await?.state.messages)
}

/// Runs the WAL relay on `slot` until `rows` events are on `stream`; rows
/// per second.
async fn wal_relay(
    db: &DatabaseConnection,
    url: &str,
    slot: &str,
    js: &jetstream::Context,
    stream: &str,
    rows: u64,
) -> Result<f64> {
    let cancel = CancellationToken::new();
    let relay = worker::relay::wal::WalRelay::new(
        db.clone(),
        js.clone(),
        worker::relay::wal::WalRelayConfig {
            database_url: url.to_owned(),
            slot: slot.to_owned(),
            window: 5_000,
            standby_retry: Duration::from_millis(100),
            holder_timeout: Duration::from_secs(30),
            handoff_after: Duration::from_secs(300),
            retry_base: Duration::from_millis(100),
            retry_max: Duration::from_secs(5),
            server_errors: None,
        },
    );
    let started = Instant::now();
    let task = {
        let cancel = cancel.clone();
        tokio::spawn(async move { relay.run(cancel).await })
    };
    while stored(js, stream).await? < rows {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    cancel.cancel();
    task.await?;
    Ok(rows as f64 / elapsed.as_secs_f64())
}

/// The relay tutorials show: poll 100 pending rows, publish each and await
/// its PubAck, mark each published, until none is left; rows per second.
async fn naive_relay(db: &DatabaseConnection, js: &jetstream::Context, rows: u64) -> Result<f64> {
    #[derive(Debug, FromQueryResult)]
    struct Pending {
        id: i64,
        message_id: String,
        subject: String,
        payload: Vec<u8>,
    }
    let started = Instant::now();
    let mut published = 0u64;
    loop {
        let batch = Pending::find_by_statement(Statement::from_string(
            DbBackend::Postgres,
            "SELECT id, message_id, subject, payload FROM outbox_message WHERE published_at IS NULL ORDER BY id LIMIT 100",
        ))
        .all(db)
        .await?;
        if batch.is_empty() {
            break;
        }
        for row in batch {
            let msg = PublishMessage::build()
                .payload(row.payload.into())
                .message_id(&row.message_id);
            js.send_publish(row.subject, msg).await?.await?;
            db.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "UPDATE outbox_message SET published_at = now() WHERE id = $1",
                [row.id.into()],
            ))
            .await?;
            published += 1;
        }
    }
    anyhow::ensure!(
        published == rows,
        "the naive relay published {published} of {rows}"
    );
    Ok(rows as f64 / started.elapsed().as_secs_f64())
}

/// The table: the relay's rate and CPU beside the plain publisher's.
fn columns() -> Vec<Column> {
    vec![
        Column::figure("relay rows/s", "rows_per_s", 0),
        Column::figure("plain publisher msg/s", "plain_messages_per_s", 0),
        Column::figure("relay/plain", "ratio_to_plain_publisher", 2),
        Column::breakdown(
            "relay CPU ms/1k rows (seawall+PG+NATS)",
            &[
                "cpu_ms_per_1k_total",
                "cpu_ms_per_1k_seawall",
                "cpu_ms_per_1k_postgres",
                "cpu_ms_per_1k_nats",
            ],
            1,
        ),
        Column::breakdown(
            "plain CPU ms/1k msgs (client+NATS)",
            &[
                "plain_cpu_ms_per_1k_total",
                "plain_cpu_ms_per_1k_client",
                "plain_cpu_ms_per_1k_postgres",
                "plain_cpu_ms_per_1k_nats",
            ],
            1,
        ),
        Column::figure(
            "relay CPU-bound ceiling rows/s",
            "cpu_bound_ceiling_rows_per_s",
            0,
        ),
    ]
}

/// The plain publisher's rate and CPU at one payload size.
struct Baseline {
    rate: f64,
    cpu: PerThousand,
}

/// Figures of `relays` relays against the baseline. PostgreSQL's share of
/// the baseline is listed only when it is not zero: the plain publisher
/// does no database work, so any is another process's.
fn figures(rate: f64, cpu: PerThousand, base: &Baseline, cores: usize) -> Figures {
    let figures = Figures::new()
        .with("rows_per_s", rate)
        .with("plain_messages_per_s", base.rate)
        .with("ratio_to_plain_publisher", rate / base.rate)
        .with("cpu_ms_per_1k_total", cpu.total())
        .with("cpu_ms_per_1k_seawall", cpu.this)
        .with("cpu_ms_per_1k_postgres", cpu.postgres)
        .with("cpu_ms_per_1k_nats", cpu.nats)
        .with("plain_cpu_ms_per_1k_total", base.cpu.total())
        .with("plain_cpu_ms_per_1k_client", base.cpu.this);
    let figures = if base.cpu.postgres > 0.0 {
        figures.with("plain_cpu_ms_per_1k_postgres", base.cpu.postgres)
    } else {
        figures
    };
    figures
        .with("plain_cpu_ms_per_1k_nats", base.cpu.nats)
        .with(
            "cpu_bound_ceiling_rows_per_s",
            cores as f64 * 1e6 / cpu.total().max(1e-9),
        )
}

/// A fresh stream name ending in part of a new UUID.
fn unique(prefix: &str) -> String {
    let id = uuid::Uuid::now_v7().simple().to_string();
    format!("{prefix}_{}", &id[id.len() - 8..])
}

/// Measures `size`-byte payloads: the plain publisher, then 1 and 3 relays
/// each on a fresh database, adding a row per relay count.
async fn at_size(
    report: &mut Report,
    pg: &mut PgServer,
    js: &jetstream::Context,
    rows: u64,
    size: usize,
) -> Result<()> {
    let subject = stream(js, &unique(&format!("BASE{size}"))).await?;
    let before = CpuSample::now();
    let rate = plain_publisher(js, &subject, rows, size).await?;
    let base = Baseline {
        rate,
        cpu: CpuSample::now().since(&before).per_thousand(rows),
    };
    eprintln!("  {size} B plain publisher: {rate:.0}/s");
    for n in [1usize, 3] {
        let (db, _) = pg.fresh("relay").await?;
        if !report.has_version("PostgreSQL") {
            report.version("PostgreSQL", pg::version(&db).await?);
        }
        let subject = stream(js, &unique(&format!("RELAY{size}_{n}"))).await?;
        fill(&db, &subject, rows, size).await?;
        let before = CpuSample::now();
        let rate = relays(&db, js, n, rows).await?;
        let cpu = CpuSample::now().since(&before).per_thousand(rows);
        eprintln!("  {size} B, {n} relay(s): {rate:.0}/s");
        let figures = figures(rate, cpu, &base, report.cores);
        report.row(format!("{size} B, {n} relay(s)"), figures);
        db.close().await?;
    }
    // The outbox in the WAL: events read from a replication slot.
    let (db, url) = pg.fresh("relaywal").await?;
    let name = unique(&format!("WAL{size}"));
    let subject = stream(js, &name).await?;
    let slot = worker::relay::wal::default_slot_name(&url);
    worker::relay::wal::prepare(&db, &slot).await?;
    fill_wal(&db, &subject, rows, size).await?;
    let before = CpuSample::now();
    let rate = wal_relay(&db, &url, &slot, js, &name, rows).await?;
    let cpu = CpuSample::now().since(&before).per_thousand(rows);
    eprintln!("  {size} B, WAL relay: {rate:.0}/s");
    report.row(
        format!("{size} B, WAL relay (outbox_mode = wal)"),
        figures(rate, cpu, &base, report.cores),
    );
    worker::relay::wal::drop_slot(&db, &slot).await?;
    db.close().await?;
    // What a hand-written relay does with the same table.
    let (db, _) = pg.fresh("relaynaive").await?;
    let subject = stream(js, &unique(&format!("NAIVE{size}"))).await?;
    fill(&db, &subject, rows, size).await?;
    let before = CpuSample::now();
    let rate = naive_relay(&db, js, rows).await?;
    let cpu = CpuSample::now().since(&before).per_thousand(rows);
    eprintln!("  {size} B, naive relay: {rate:.0}/s");
    report.row(
        format!("{size} B, naive relay (poll 100, publish and await each, update each)"),
        figures(rate, cpu, &base, report.cores),
    );
    db.close().await?;
    Ok(())
}

/// Runs the scenario.
pub async fn run(pg: &mut PgServer, nats_url: &str, rows: u64) -> Result<Report> {
    let mut report = Report::new("relay", columns());
    let client = seawall::nats::connect(nats_url).await?;
    report.version("nats-server", client.server_info().version.clone());
    let js = jetstream::new(client);
    report.setup("rows", format!("{rows} per measurement, pre-filled on PostgreSQL, each published with Nats-Msg-Id and its PubAck awaited"));
    report.setup("baseline", format!("plain async-nats publisher, {IN_FLIGHT} PubAcks in flight, no database, same stream settings"));
    report.setup("CPU", "user+system time of this process, all postgres and all nats-server processes over the measurement (/proc), per 1,000 messages; the ceiling is cores / that");
    for size in [256usize, 4096] {
        at_size(&mut report, pg, &js, rows, size).await?;
    }
    Ok(report)
}
