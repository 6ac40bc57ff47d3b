//! Commit-to-subscriber delay of outbox events: p50/p99/max for a steady
//! 1,000 events/s and for bursts, with wake-up notifications and with polling
//! only, on SQLite and PostgreSQL.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use futures::StreamExt;
use futures::future::BoxFuture;
use migration::MigratorTrait;
use sea_orm::DatabaseConnection;
use tokio::sync::{Mutex, Notify};
use tokio_util::sync::CancellationToken;

use service::executor::unit;
use service::{Executor, HandlerError, NewEvent, Outbox};
use worker::{Relay, RelayConfig, StreamSpec};

use crate::pg::{self, PgServer};
use crate::report::{Column, Figures, Report, quantile};

/// Poll interval of the polling-only runs.
const POLL: Duration = Duration::from_millis(50);

fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

struct Run {
    executor: Executor,
    subject: String,
}

impl Run {
    /// Commits `n` events in one transaction, each stamped with the time just
    /// before their insert and the commit (so the measured delay includes
    /// the commit).
    async fn commit(&self, n: usize) -> Result<()> {
        let subject = self.subject.clone();
        let work = unit(move |txn| -> BoxFuture<'_, Result<(), HandlerError>> {
            let subject = subject.clone();
            Box::pin(async move {
                // One multi-row insert, then the commit: the stamp is taken
                // just before both, so a burst's delay is not its inserts'.
                let t = micros_now().to_string();
                Outbox::default()
                    .enqueue_all(
                        txn,
                        (0..n).map(|_| NewEvent::new(subject.clone(), t.clone())),
                    )
                    .await?;
                Ok(())
            })
        });
        self.executor.run(&work).await?;
        Ok(())
    }
}

/// A fresh stream for one measurement; returns the subject events go to.
async fn stream(js: &async_nats::jetstream::Context) -> Result<String> {
    let id = uuid::Uuid::now_v7().simple().to_string();
    let id = &id[id.len() - 10..];
    worker::ensure_stream(
        js,
        &StreamSpec {
            name: format!("LAT_{id}"),
            subjects: vec![format!("lat.{id}.>")],
            duplicate_window: Duration::from_secs(120),
            max_age: Duration::from_secs(3600),
            replicas: 1,
        },
    )
    .await?;
    Ok(format!("lat.{id}.e"))
}

/// Starts a relay on `db` that wakes on commits (`notify`) or only polls;
/// returns the executor whose commits it hears and the relay's task.
fn start_relay(
    db: &DatabaseConnection,
    js: &async_nats::jetstream::Context,
    notify: bool,
    cancel: CancellationToken,
) -> (Executor, tokio::task::JoinHandle<()>) {
    let wake = Arc::new(Notify::new());
    let executor = Executor::new(db.clone());
    let executor = if notify {
        executor.with_commit_signal(wake.clone())
    } else {
        executor
    };
    let relay = Relay::new(
        db.clone(),
        js.clone(),
        RelayConfig {
            poll_interval: if notify { Duration::from_secs(1) } else { POLL },
            listen: notify,
            ..RelayConfig::default()
        },
        wake,
    );
    let task = tokio::spawn(async move { relay.run(cancel).await });
    (executor, task)
}

/// Collects the delay (ms) of every event on `subject` into `sink`: the
/// payload is the commit-time stamp in microseconds.
async fn receive(
    client: &async_nats::Client,
    subject: &str,
    sink: Arc<Mutex<Vec<f64>>>,
) -> Result<tokio::task::JoinHandle<()>> {
    let mut sub = client.subscribe(subject.to_owned()).await?;
    client.flush().await?;
    Ok(tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            let sent: u64 = std::str::from_utf8(&msg.payload)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            sink.lock()
                .await
                .push(micros_now().saturating_sub(sent) as f64 / 1000.0);
        }
    }))
}

/// Delays (ms) of a steady `steady_secs` at 1,000 events/s, then of
/// `bursts` bursts of 500, with a relay that wakes on commits or polls.
async fn measure(
    db: DatabaseConnection,
    js: &async_nats::jetstream::Context,
    client: &async_nats::Client,
    notify: bool,
    steady_secs: u64,
    bursts: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let subject = stream(js).await?;
    let cancel = CancellationToken::new();
    let (executor, relay_task) = start_relay(&db, js, notify, cancel.clone());
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let receiver = receive(client, &subject, latencies.clone()).await?;
    let run = Run { executor, subject };
    // Steady: one event per millisecond.
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let steady = steady_secs * 1000;
    for _ in 0..steady {
        tick.tick().await;
        run.commit(1).await?;
    }
    wait_for(&latencies, steady as usize).await?;
    let steady_lat = std::mem::take(&mut *latencies.lock().await);
    // Bursts of 500 events in one transaction, a second apart.
    for _ in 0..bursts {
        run.commit(500).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    wait_for(&latencies, bursts * 500).await?;
    let burst_lat = std::mem::take(&mut *latencies.lock().await);
    cancel.cancel();
    relay_task.await?;
    receiver.abort();
    Ok((steady_lat, burst_lat))
}

async fn wait_for(samples: &Mutex<Vec<f64>>, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while samples.lock().await.len() < n {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {n} events arrived",
            samples.lock().await.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Adds a row of `samples` (delays in ms).
fn row(report: &mut Report, name: String, mut samples: Vec<f64>) {
    samples.sort_by(f64::total_cmp);
    report.row(
        name,
        Figures::new()
            .with("events", samples.len() as f64)
            .with("p50_ms", quantile(&samples, 0.5))
            .with("p99_ms", quantile(&samples, 0.99))
            .with("max_ms", quantile(&samples, 1.0)),
    );
}

/// A report with this scenario's columns and setup.
fn report(steady_secs: u64, bursts: usize) -> Report {
    let mut report = Report::new(
        "latency",
        vec![
            Column::figure("events", "events", 0),
            Column::figure("p50 ms", "p50_ms", 2),
            Column::figure("p99 ms", "p99_ms", 2),
            Column::figure("max ms", "max_ms", 2),
        ],
    );
    report.setup(
        "steady",
        format!("1 event per transaction every 1 ms for {steady_secs} s (1,000 events/s)"),
    );
    report.setup(
        "bursts",
        format!("{bursts} transactions of 500 events, 1 s apart"),
    );
    report.setup(
        "delay",
        "from just before COMMIT to a plain NATS subscriber receiving the event",
    );
    report.setup("wake-ups", format!("notify: in-process commit signal (+ LISTEN/NOTIFY on PostgreSQL); polling: every {} ms only", POLL.as_millis()));
    report
}

/// A migrated database on `backend` for one measurement.
async fn database(
    report: &mut Report,
    pg: &mut PgServer,
    dir: &Path,
    backend: &str,
    notify: bool,
) -> Result<DatabaseConnection> {
    if backend == "SQLite" {
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.join(format!("lat-{notify}.db")).display()
        );
        let db = service::db::connect(&url, 8).await?;
        migration::Migrator::up(&db, None)
            .await
            .context("migrating")?;
        return Ok(db);
    }
    let (db, _) = pg.fresh("latency").await?;
    if !report.has_version("PostgreSQL") {
        report.version("PostgreSQL", pg::version(&db).await?);
    }
    Ok(db)
}

/// Runs the scenario.
pub async fn run(
    pg: &mut PgServer,
    nats_url: &str,
    steady_secs: u64,
    bursts: usize,
) -> Result<Report> {
    let mut report = report(steady_secs, bursts);
    let client = seawall::nats::connect(nats_url).await?;
    report.version("nats-server", client.server_info().version.clone());
    let js = async_nats::jetstream::new(client.clone());
    let dir = tempfile::tempdir()?;
    for backend in ["SQLite", "PostgreSQL"] {
        for notify in [true, false] {
            let db = database(&mut report, pg, dir.path(), backend, notify).await?;
            let (steady, bursts_lat) =
                measure(db, &js, &client, notify, steady_secs, bursts).await?;
            let mode = if notify { "notify" } else { "polling" };
            row(
                &mut report,
                format!("{backend}, {mode}, steady 1,000/s"),
                steady,
            );
            row(
                &mut report,
                format!("{backend}, {mode}, bursts of 500"),
                bursts_lat,
            );
            eprintln!("  {backend} {mode} done");
        }
    }
    Ok(report)
}
