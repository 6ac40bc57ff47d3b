//! End to end on the test kit's ledger: `ledger.record` published to
//! JetStream, through the consumer, the inbox, the outbox and the relay, to
//! a subscriber of `ledger.recorded`. The scenario deletes and recreates the
//! LEDGER stream, so point it only at a NATS server of its own (the scripts
//! start one).

use std::time::{Duration, Instant};

use std::future::IntoFuture;

use anyhow::{Context, Result};
use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use migration::MigratorTrait;
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use seawall::{Application, Domain, Roles, Settings};
use service::{ConsumerName, Registry};
use testkit::ledger::{
    EntryRequest, LEDGER_CONSUMER, LEDGER_STREAM, LedgerHandler, RECORD_SUBJECT, RECORDED_SUBJECT,
    Recorded,
};

use crate::cpu::CpuSample;
use crate::pg::{self, PgServer};
use crate::report::{Column, Figures, Report, quantile};

/// Messages sent through before measuring (then `ANALYZE` on PostgreSQL).
const WARM_UP: u64 = 2_000;

/// The `commit_delay` (microseconds) of the slow-flush rows: each WAL flush
/// waits this long while holding the WAL write lock, as a commit waits for
/// network block storage, and commits that arrive meanwhile share the next
/// flush, as they would there. A local disk whose cache absorbs flushes
/// (about 0.05 ms here) hides what group commit saves where a flush costs
/// milliseconds.
const SLOW_FLUSH_US: u32 = 2_000;

/// How a row's process runs.
#[derive(Clone, Copy)]
struct Setup<'a> {
    /// The database URL the WAL relay replicates from; `None` for table mode.
    wal_url: Option<&'a str>,
    /// `INBOX_BATCH`; `None` for its default.
    inbox_batch: Option<usize>,
}

/// Starts the same process `seawall run` starts, without the API, on `db`
/// with a fresh LEDGER stream; returns what stops it and its task.
async fn start(
    db: DatabaseConnection,
    nats_url: &str,
    js: &jetstream::Context,
    setup: Setup<'_>,
) -> Result<(CancellationToken, JoinHandle<Result<()>>)> {
    let Setup {
        wal_url,
        inbox_batch,
    } = setup;
    let _ = js.delete_stream(LEDGER_STREAM).await;
    let mut settings = Settings {
        nats_url: nats_url.to_owned(),
        consumer_concurrency: 32,
        inbox_batch,
        // Nothing scrapes the benchmark's process.
        metrics_addr: "off".to_owned(),
        ..Settings::default()
    };
    if let Some(url) = wal_url {
        settings.database_url = url.to_owned();
        settings.outbox_mode = service::OutboxMode::Wal;
    }
    let roles = Roles {
        relay: true,
        consume: true,
        api: false,
    };
    let domain = Domain {
        stream: settings.stream(LEDGER_STREAM, &["ledger.>"]),
        registry: Registry::new().register_handler(
            ConsumerName::parse(LEDGER_CONSUMER)?,
            RECORD_SUBJECT,
            LedgerHandler::default(),
        ),
    };
    let app = Application::build(&settings, roles, domain, db, None).await?;
    let stop = CancellationToken::new();
    let running = tokio::spawn(app.run_until(stop.clone()));
    Ok((stop, running))
}

/// Entry request `i` of `run`, with message id `{run}-{i}`.
fn request(run: &str, i: u64) -> Result<PublishMessage> {
    // Accounts spread over 500 ids so handlers do not all contend on one row.
    let payload = serde_json::to_vec(&EntryRequest {
        account_id: format!("bench-{}", i % 500),
        amount: 1,
        reference: None,
    })?;
    Ok(PublishMessage::build()
        .payload(payload.into())
        .message_id(format!("{run}-{i}")))
}

/// Publishes `messages` entry requests with ids `{run}-{i}`, pipelined, and
/// waits for every PubAck.
async fn publish(js: &jetstream::Context, messages: u64, run: &str) -> Result<()> {
    let mut acks = FuturesUnordered::new();
    for i in 0..messages {
        acks.push(
            js.send_publish(RECORD_SUBJECT, request(run, i)?)
                .await?
                .into_future(),
        );
        // Keep a bounded window of PubAcks in flight: the context caps them,
        // and the relay shares this context.
        while acks.len() >= 1_000 {
            if let Some(ack) = acks.next().await {
                ack?;
            }
        }
    }
    while let Some(ack) = acks.next().await {
        ack?;
    }
    Ok(())
}

/// Starts the process ([`start`]) and subscribes to `ledger.recorded`
/// before anything is sent, so no event can pass unseen.
async fn launch(
    db: DatabaseConnection,
    nats_url: &str,
    js: &jetstream::Context,
    client: &async_nats::Client,
    setup: Setup<'_>,
) -> Result<(
    CancellationToken,
    JoinHandle<Result<()>>,
    async_nats::Subscriber,
)> {
    let (stop, running) = start(db, nats_url, js, setup).await?;
    let applied = client.subscribe(RECORDED_SUBJECT).await?;
    client.flush().await?;
    Ok((stop, running, applied))
}

/// The next `ledger.recorded` event; an error once none came for a minute.
async fn next_event(applied: &mut async_nats::Subscriber) -> Result<async_nats::Message> {
    tokio::time::timeout(Duration::from_secs(60), applied.next())
        .await
        .context("events stopped arriving")?
        .context("subscription closed")
}

/// Sends `messages` requests with ids `{run}-{i}` through a fresh LEDGER
/// stream; returns messages per second.
async fn measure(
    db: DatabaseConnection,
    nats_url: &str,
    js: &jetstream::Context,
    client: &async_nats::Client,
    messages: u64,
    run: &str,
    setup: Setup<'_>,
) -> Result<f64> {
    let (stop, running, mut applied) = launch(db, nats_url, js, client, setup).await?;
    let started = Instant::now();
    publish(js, messages, run).await?;
    for _ in 0..messages {
        next_event(&mut applied).await?;
    }
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    stop.cancel();
    running.await??;
    Ok(rate)
}

/// Requests per second of the paced rows: the load at which group commit
/// must not make a message wait longer than committing it alone does.
const PACED_PER_S: u64 = 1_000;

/// Seconds each paced row sends for.
const PACED_SECONDS: u64 = 10;

/// Sends `messages` requests at [`PACED_PER_S`] a second (ids `{run}-{i}`)
/// through a fresh LEDGER stream; returns the rate achieved
/// and each request's delay in milliseconds, sorted, from just before its
/// publish to the subscriber receiving its `ledger.recorded`: JetStream,
/// the consumer, the inbox commit, the relay and NATS again.
async fn paced(
    db: DatabaseConnection,
    nats_url: &str,
    js: &jetstream::Context,
    client: &async_nats::Client,
    messages: u64,
    run: &str,
    setup: Setup<'_>,
) -> Result<(f64, Vec<f64>)> {
    let (stop, running, mut applied) = launch(db, nats_url, js, client, setup).await?;
    let receiver = tokio::spawn(async move {
        let mut seen = Vec::new();
        while (seen.len() as u64) < messages {
            let msg = next_event(&mut applied).await?;
            let at = Instant::now();
            let recorded: Recorded = serde_json::from_slice(&msg.payload)
                .context("a ledger.recorded event the ledger did not write")?;
            seen.push((recorded.message_id, at));
        }
        anyhow::Ok(seen)
    });
    // PubAcks are awaited in order beside the sending, so a slow one never
    // holds the next request back.
    let (acks_tx, mut acks_rx) = tokio::sync::mpsc::unbounded_channel::<PublishAckFuture>();
    let acks = tokio::spawn(async move {
        while let Some(ack) = acks_rx.recv().await {
            ack.await?;
        }
        anyhow::Ok(())
    });
    let mut sent = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / PACED_PER_S as u32);
    let started = Instant::now();
    for i in 0..messages {
        tick.tick().await;
        let msg = request(run, i)?;
        sent.push(Instant::now());
        acks_tx
            .send(js.send_publish(RECORD_SUBJECT, msg).await?)
            .context("the PubAck task ended early")?;
    }
    drop(acks_tx);
    let seen = receiver.await??;
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    acks.await??;
    stop.cancel();
    running.await??;
    let prefix = format!("{run}-");
    let mut delays = seen
        .iter()
        .map(|(id, at)| {
            let sent_at = id
                .strip_prefix(&prefix)
                .and_then(|i| i.parse::<usize>().ok())
                .and_then(|i| sent.get(i))
                .with_context(|| format!("an event for {id}, which this run did not send"))?;
            Ok(at.duration_since(*sent_at).as_secs_f64() * 1e3)
        })
        .collect::<Result<Vec<f64>>>()?;
    delays.sort_by(f64::total_cmp);
    Ok((rate, delays))
}

/// Mean deliveries per inbox commit and rows per relay round since the last
/// call (`seawall_inbox_batch_size`, `seawall_relay_batch_size`): what
/// group commit and the relay's rounds achieved on this path. The inbox's
/// is `None` without group commit.
fn batch_means(snapshotter: &Snapshotter) -> (Option<f64>, Option<f64>) {
    let (mut inbox, mut relay) = (None, None);
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let DebugValue::Histogram(values) = value else {
            continue;
        };
        let mean = (!values.is_empty())
            .then(|| values.iter().map(|v| v.0).sum::<f64>() / values.len() as f64);
        match key.key().name() {
            "seawall_inbox_batch_size" => inbox = mean,
            "seawall_relay_batch_size" => relay = mean,
            _ => {}
        }
    }
    (inbox, relay)
}

/// Drops the WAL relay's slot once the stopped relay has let it go
/// (`drop_slot` waits for that).
async fn drop_slot(db: &DatabaseConnection, url: &str) -> Result<()> {
    let slot = worker::relay::wal::default_slot_name(url);
    worker::relay::wal::drop_slot(db, &slot).await?;
    Ok(())
}

/// A report with this scenario's columns and setup.
fn report(messages: u64) -> Report {
    let mut report = Report::new(
        "e2e",
        vec![
            Column::figure("messages/s end to end", "messages_per_s", 0),
            Column::breakdown(
                "CPU ms/1k msgs (seawall+PG+NATS)",
                &[
                    "cpu_ms_per_1k_total",
                    "cpu_ms_per_1k_seawall",
                    "cpu_ms_per_1k_postgres",
                    "cpu_ms_per_1k_nats",
                ],
                0,
            ),
            Column::figure("deliveries per inbox commit", "inbox_batch_mean", 1),
            Column::figure("rows per relay round", "relay_batch_mean", 1),
            Column::figure("delay p50 ms", "delay_p50_ms", 2),
            Column::figure("delay p99 ms", "delay_p99_ms", 2),
            Column::figure("delay max ms", "delay_max_ms", 2),
        ],
    );
    report.setup("messages", format!("{messages} ledger.record published pipelined (a backlog); timed until the subscriber saw every ledger.recorded"));
    report.setup(
        "1,000/s",
        format!(
            "rows so named publish one ledger.record every {} us for {PACED_SECONDS} s instead; delay: from just before a request's publish to the subscriber receiving its ledger.recorded",
            1_000_000 / PACED_PER_S
        ),
    );
    report.setup(
        "process",
        "consumer (32 in flight) + inbox + outbox + relay in one process, like `seawall run`; INBOX_BATCH at its default (16 on PostgreSQL and SQLite) unless the row says otherwise",
    );
    report.setup(
        "warm-up",
        format!("{WARM_UP} messages through the same path first, then ANALYZE (PostgreSQL)"),
    );
    report.setup(
        "CPU",
        "user+system time of this process, all postgres and all nats-server processes, per 1,000 messages",
    );
    report
}

/// Runs the scenario on SQLite and PostgreSQL.
pub async fn run(pg: &mut PgServer, nats_url: &str, messages: u64) -> Result<Report> {
    let mut report = report(messages);
    let recorder = DebuggingRecorder::new();
    let batches = recorder.snapshotter();
    recorder
        .install()
        .context("installing the recorder the batch sizes are read from")?;
    let client = seawall::nats::connect(nats_url).await?;
    report.version("nats-server", client.server_info().version.clone());
    let js = jetstream::new(client.clone());
    let dir = tempfile::tempdir()?;
    let sqlite = service::db::connect(
        &format!("sqlite://{}?mode=rwc", dir.path().join("e2e.db").display()),
        16,
    )
    .await?;
    migration::Migrator::up(&sqlite, None).await?;
    testkit::ledger::create_tables(&sqlite).await?;
    let (pg_db, _) = pg.fresh("e2e").await?;
    let (wal_db, wal_url) = pg.fresh("e2ewal").await?;
    report.version("PostgreSQL", pg::version(&pg_db).await?);
    // `commit_siblings = 0`: every flush waits, not only those with five
    // other transactions open.
    let (_, slow_url) = pg.fresh("e2eslow").await?;
    let slow_db = service::db::connect(
        &format!(
            "{slow_url}?options%5Bcommit_delay%5D={SLOW_FLUSH_US}&options%5Bcommit_siblings%5D=0"
        ),
        32,
    )
    .await
    .context("connecting with commit_delay set (the slow-flush rows need a superuser)")?;
    let slow_wait = pg::flush_wait_ms(&slow_db).await?;
    report.setup(
        "slow flush",
        format!(
            "rows so named run on a database whose sessions set commit_delay = {SLOW_FLUSH_US} us and commit_siblings = 0, as on storage where a flush takes {} ms: a commit's WAL flush {slow_wait:.3} ms, measured as on the versions line; commits that arrive during a flush share the next one",
            f64::from(SLOW_FLUSH_US) / 1_000.0
        ),
    );
    let backlog = [
        (
            "SQLite, one commit per message (INBOX_BATCH = 1)",
            sqlite.clone(),
            None,
            Some(1),
        ),
        ("SQLite", sqlite.clone(), None, None),
        (
            "PostgreSQL, one commit per message (INBOX_BATCH = 1)",
            pg_db.clone(),
            None,
            Some(1),
        ),
        ("PostgreSQL", pg_db.clone(), None, None),
        (
            "PostgreSQL, batches of up to 4 (INBOX_BATCH = 4)",
            pg_db.clone(),
            None,
            Some(4),
        ),
        (
            "PostgreSQL, batches of up to 8 (INBOX_BATCH = 8)",
            pg_db.clone(),
            None,
            Some(8),
        ),
        (
            "PostgreSQL, WAL outbox (outbox_mode = wal)",
            wal_db,
            Some(wal_url.as_str()),
            None,
        ),
        (
            "PostgreSQL, slow flush, one commit per message (INBOX_BATCH = 1)",
            slow_db.clone(),
            None,
            Some(1),
        ),
        ("PostgreSQL, slow flush", slow_db.clone(), None, None),
        (
            "PostgreSQL, slow flush, batches of up to 4 (INBOX_BATCH = 4)",
            slow_db.clone(),
            None,
            Some(4),
        ),
        (
            "PostgreSQL, slow flush, batches of up to 8 (INBOX_BATCH = 8)",
            slow_db,
            None,
            Some(8),
        ),
    ];
    // The same paths at a steady 1,000 requests a second, far below what
    // they drain: what group commit costs a message's delay when there is
    // little to batch.
    let steady = [
        (
            "SQLite, 1,000/s, one commit per message (INBOX_BATCH = 1)",
            sqlite.clone(),
            None,
            Some(1),
        ),
        ("SQLite, 1,000/s", sqlite, None, None),
        (
            "PostgreSQL, 1,000/s, one commit per message (INBOX_BATCH = 1)",
            pg_db.clone(),
            None,
            Some(1),
        ),
        ("PostgreSQL, 1,000/s", pg_db, None, None),
    ];
    let rows = backlog
        .into_iter()
        .map(|row| (row, false))
        .chain(steady.into_iter().map(|row| (row, true)));
    for ((label, db, wal, batch), steady) in rows {
        let warm = WARM_UP.min(messages);
        let load = if steady { "steady" } else { "backlog" };
        let run = format!("e2e-{load}-{batch:?}");
        let warm_run = format!("e2e-warm-{load}-{batch:?}");
        let setup = Setup {
            wal_url: wal,
            inbox_batch: batch,
        };
        measure(db.clone(), nats_url, &js, &client, warm, &warm_run, setup).await?;
        if db.get_database_backend() == sea_orm::DbBackend::Postgres {
            db.execute_unprepared("ANALYZE").await?;
        }
        batch_means(&batches);
        let before = CpuSample::now();
        let (rate, delays, sent) = if steady {
            let sent = (PACED_PER_S * PACED_SECONDS).min(messages);
            let (rate, delays) =
                paced(db.clone(), nats_url, &js, &client, sent, &run, setup).await?;
            (rate, delays, sent)
        } else {
            let rate = measure(db.clone(), nats_url, &js, &client, messages, &run, setup).await?;
            (rate, Vec::new(), messages)
        };
        if let Some(url) = wal {
            drop_slot(&db, url).await?;
        }
        let cpu = CpuSample::now().since(&before).per_thousand(sent);
        let (inbox_batch, relay_batch) = batch_means(&batches);
        let delay = if delays.is_empty() {
            String::new()
        } else {
            format!(", delay p99 {:.2} ms", quantile(&delays, 0.99))
        };
        eprintln!(
            "  {label}: {rate:.0} messages/s, {:.1} deliveries per inbox commit, {:.1} rows per relay round{delay}",
            inbox_batch.unwrap_or(1.0),
            relay_batch.unwrap_or(f64::NAN)
        );
        let mut figures = Figures::new();
        if !delays.is_empty() {
            figures = figures
                .with("delay_p50_ms", quantile(&delays, 0.5))
                .with("delay_p99_ms", quantile(&delays, 0.99))
                .with("delay_max_ms", quantile(&delays, 1.0));
        }
        report.row(
            label,
            figures
                .with("messages_per_s", rate)
                .with("cpu_ms_per_1k_total", cpu.total())
                .with("cpu_ms_per_1k_seawall", cpu.this)
                .with("cpu_ms_per_1k_postgres", cpu.postgres)
                .with("cpu_ms_per_1k_nats", cpu.nats)
                .with("inbox_batch_mean", inbox_batch.unwrap_or(1.0))
                .with("relay_batch_mean", relay_batch.unwrap_or(f64::NAN)),
        );
    }
    Ok(report)
}
