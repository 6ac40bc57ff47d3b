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
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use seawall::{Application, Domain, Roles, Settings};
use service::{ConsumerName, Registry};
use testkit::ledger::{
    EntryRequest, LEDGER_CONSUMER, LEDGER_STREAM, LedgerHandler, RECORD_SUBJECT, RECORDED_SUBJECT,
    Recorded,
};

use crate::cpu::{CpuSample, PerThousand};
use crate::pg::{self, PgServer};
use crate::report::{Column, Figures, Report, quantile};

mod rows;

use rows::{backlog_rows, open_slow_flush, open_sqlite, steady_rows};

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

/// Installs the recorder the batch sizes are read from ([`batch_means`]):
/// the process records into whichever recorder is global, so it goes in
/// before the first row starts one.
fn install_recorder() -> Result<Snapshotter> {
    let recorder = DebuggingRecorder::new();
    let batches = recorder.snapshotter();
    recorder
        .install()
        .context("installing the recorder the batch sizes are read from")?;
    Ok(batches)
}

/// What every row shares: the NATS server and this process's connections
/// to it, the recorder's snapshotter and the number of messages a row sends.
struct Bench<'a> {
    nats_url: &'a str,
    js: &'a jetstream::Context,
    client: &'a async_nats::Client,
    batches: &'a Snapshotter,
    messages: u64,
}

/// What one row measured.
struct Measured {
    /// Messages per second.
    rate: f64,
    /// Each message's delay in milliseconds, sorted; empty for a backlog row.
    delays: Vec<f64>,
    /// CPU per 1,000 messages, by party.
    cpu: PerThousand,
    /// Mean deliveries per inbox commit; `None` without group commit.
    inbox_batch: Option<f64>,
    /// Mean rows per relay round.
    relay_batch: Option<f64>,
}

impl Bench<'_> {
    /// Sends up to [`WARM_UP`] messages through the row's path (ids
    /// `warm_run`), then `ANALYZE`s on PostgreSQL, so the measured run meets
    /// warm caches and planner statistics of filled tables.
    async fn warm_up(
        &self,
        db: &DatabaseConnection,
        setup: Setup<'_>,
        warm_run: &str,
    ) -> Result<()> {
        let warm = WARM_UP.min(self.messages);
        measure(
            db.clone(),
            self.nats_url,
            self.js,
            self.client,
            warm,
            warm_run,
            setup,
        )
        .await?;
        if db.get_database_backend() == sea_orm::DbBackend::Postgres {
            db.execute_unprepared("ANALYZE").await?;
        }
        Ok(())
    }

    /// Warms the row's path up and measures it, as a backlog or `steady`
    /// (paced); the CPU and the batch sizes are taken around the measured
    /// run alone, so the warm-up does not count.
    async fn measure_row(
        &self,
        db: &DatabaseConnection,
        setup: Setup<'_>,
        steady: bool,
    ) -> Result<Measured> {
        let load = if steady { "steady" } else { "backlog" };
        let batch = setup.inbox_batch;
        let run = format!("e2e-{load}-{batch:?}");
        let warm_run = format!("e2e-warm-{load}-{batch:?}");
        self.warm_up(db, setup, &warm_run).await?;
        batch_means(self.batches);
        let before = CpuSample::now();
        let (rate, delays, sent) = if steady {
            let sent = (PACED_PER_S * PACED_SECONDS).min(self.messages);
            let (rate, delays) = paced(
                db.clone(),
                self.nats_url,
                self.js,
                self.client,
                sent,
                &run,
                setup,
            )
            .await?;
            (rate, delays, sent)
        } else {
            let rate = measure(
                db.clone(),
                self.nats_url,
                self.js,
                self.client,
                self.messages,
                &run,
                setup,
            )
            .await?;
            (rate, Vec::new(), self.messages)
        };
        if let Some(url) = setup.wal_url {
            drop_slot(db, url).await?;
        }
        let cpu = CpuSample::now().since(&before).per_thousand(sent);
        let (inbox_batch, relay_batch) = batch_means(self.batches);
        Ok(Measured {
            rate,
            delays,
            cpu,
            inbox_batch,
            relay_batch,
        })
    }
}

impl Measured {
    /// The row's line on stderr, so a run of many minutes shows each row as
    /// it ends.
    fn print(&self, label: &str) {
        let rate = self.rate;
        let delay = if self.delays.is_empty() {
            String::new()
        } else {
            format!(", delay p99 {:.2} ms", quantile(&self.delays, 0.99))
        };
        eprintln!(
            "  {label}: {rate:.0} messages/s, {:.1} deliveries per inbox commit, {:.1} rows per relay round{delay}",
            self.inbox_batch.unwrap_or(1.0),
            self.relay_batch.unwrap_or(f64::NAN)
        );
    }

    /// The row's figures; the delays only where they were measured (the
    /// paced rows), so a backlog row shows `-` rather than zero.
    fn figures(&self) -> Figures {
        let mut figures = Figures::new();
        if !self.delays.is_empty() {
            figures = figures
                .with("delay_p50_ms", quantile(&self.delays, 0.5))
                .with("delay_p99_ms", quantile(&self.delays, 0.99))
                .with("delay_max_ms", quantile(&self.delays, 1.0));
        }
        figures
            .with("messages_per_s", self.rate)
            .with("cpu_ms_per_1k_total", self.cpu.total())
            .with("cpu_ms_per_1k_seawall", self.cpu.this)
            .with("cpu_ms_per_1k_postgres", self.cpu.postgres)
            .with("cpu_ms_per_1k_nats", self.cpu.nats)
            .with("inbox_batch_mean", self.inbox_batch.unwrap_or(1.0))
            .with("relay_batch_mean", self.relay_batch.unwrap_or(f64::NAN))
    }
}

/// Runs the scenario on SQLite and PostgreSQL.
pub async fn run(pg: &mut PgServer, nats_url: &str, messages: u64) -> Result<Report> {
    let mut report = report(messages);
    let batches = install_recorder()?;
    let client = seawall::nats::connect(nats_url).await?;
    report.version("nats-server", client.server_info().version.clone());
    let js = jetstream::new(client.clone());
    let dir = tempfile::tempdir()?;
    let sqlite = open_sqlite(dir.path()).await?;
    let (pg_db, _) = pg.fresh("e2e").await?;
    let (wal_db, wal_url) = pg.fresh("e2ewal").await?;
    report.version("PostgreSQL", pg::version(&pg_db).await?);
    let slow_db = open_slow_flush(pg, &mut report).await?;
    let backlog = backlog_rows(&sqlite, &pg_db, wal_db, &wal_url, slow_db);
    let steady = steady_rows(sqlite, pg_db);
    let rows = backlog
        .into_iter()
        .map(|row| (row, false))
        .chain(steady.into_iter().map(|row| (row, true)));
    let bench = Bench {
        nats_url,
        js: &js,
        client: &client,
        batches: &batches,
        messages,
    };
    for ((label, db, wal, batch), steady) in rows {
        let setup = Setup {
            wal_url: wal,
            inbox_batch: batch,
        };
        let measured = bench.measure_row(&db, setup, steady).await?;
        measured.print(label);
        report.row(label, measured.figures());
    }
    Ok(report)
}
