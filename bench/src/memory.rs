//! The relay streams its backlog: its peak RSS with a 10,000-row backlog and
//! with a 1,000,000-row one, as a separate `seawall relay` process: the
//! product binary as operators run it, not this benchmark process, whose
//! own memory (and code) would blur the figure.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use async_nats::jetstream;

use crate::pg::PgServer;
use crate::report::{Column, Figures, Report};

/// Overrides where the service's binary is.
const BIN_VAR: &str = "SEAWALL_BIN";

/// The service's binary to measure (named after its package,
/// [`seawall::SERVICE`]): `SEAWALL_BIN`, or the one next to this executable
/// (cargo builds both into the same target directory).
///
/// # Errors
/// When there is no file at that path, naming it and how to provide one.
fn seawall_binary() -> Result<PathBuf> {
    let path = match std::env::var_os(BIN_VAR) {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()
            .context("locating this executable")?
            .with_file_name(format!(
                "{}{}",
                seawall::SERVICE,
                std::env::consts::EXE_SUFFIX
            )),
    };
    anyhow::ensure!(
        path.is_file(),
        "the service's binary is not at {}: build it next to seawall-bench (cargo build --release -p {} -p seawall-bench) or set {BIN_VAR}",
        path.display(),
        seawall::SERVICE
    );
    Ok(path)
}

/// Peak resident set size of a process, from /proc (Linux), in KiB.
fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading /proc status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmHWM line")
}

/// Fills a fresh outbox with `rows` rows, lets a `seawall relay` process
/// (`exe`) drain it, and returns its peak RSS in KiB and its rows per second.
async fn backlog(
    exe: &Path,
    pg: &mut PgServer,
    nats_url: &str,
    js: &jetstream::Context,
    rows: u64,
) -> Result<(u64, f64)> {
    let (db, url) = pg.fresh("memory").await?;
    let id = uuid::Uuid::now_v7().simple().to_string();
    let name = format!("MEM_{}", &id[id.len() - 10..]);
    let subject = format!("mem.{}", &id[id.len() - 10..]);
    worker::ensure_stream(
        js,
        &worker::StreamSpec {
            name,
            subjects: vec![format!("{subject}.>")],
            duplicate_window: Duration::from_secs(120),
            max_age: Duration::from_secs(3600),
            replicas: 1,
        },
    )
    .await?;
    crate::relay::fill(&db, &format!("{subject}.e"), rows, 256).await?;
    let mut child = tokio::process::Command::new(exe)
        .arg("relay")
        .env("SEAWALL_DATABASE_URL", &url)
        .env("SEAWALL_NATS_URL", nats_url)
        .env("SEAWALL_STREAM_MAX_AGE_MS", "3600000")
        .env("SEAWALL_METRICS_ADDR", "127.0.0.1:0")
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {} relay", exe.display()))?;
    let pid = child.id().context("relay pid")?;
    let started = Instant::now();
    while worker::relay::pending_count(&db).await? > 0 {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!(
                "{} relay exited with {status} before draining the outbox",
                exe.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let peak = peak_rss_kib(pid)?;
    child.kill().await?;
    db.close().await?;
    Ok((peak, rows as f64 / elapsed))
}

/// Runs the scenario.
pub async fn run(pg: &mut PgServer, nats_url: &str, small: u64, large: u64) -> Result<Report> {
    let exe = seawall_binary()?;
    let mut report = Report::new(
        "relay-memory",
        vec![
            Column::figure("peak RSS MiB", "peak_rss_mib", 1),
            Column::figure("rows/s", "rows_per_s", 0),
        ],
    );
    let client = seawall::nats::connect(nats_url).await?;
    report.version("nats-server", client.server_info().version.clone());
    let js = jetstream::new(client);
    report.setup("process", "`seawall relay` (the product binary, a separate process) draining a pre-filled PostgreSQL outbox of 256 B rows; peak RSS = VmHWM");
    let mut peaks = Vec::new();
    for rows in [small, large] {
        let (peak, rate) = backlog(&exe, pg, nats_url, &js, rows).await?;
        eprintln!("  {rows} rows: peak RSS {peak} KiB, {rate:.0} rows/s");
        let peak_mib = peak as f64 / 1024.0;
        report.row(
            format!("{rows} row backlog"),
            Figures::new()
                .with("peak_rss_mib", peak_mib)
                .with("rows_per_s", rate),
        );
        peaks.push(peak_mib);
    }
    if let [small, large] = peaks[..] {
        report
            .notes
            .push(format!("peak RSS large/small = {:.2}", large / small));
    }
    Ok(report)
}
