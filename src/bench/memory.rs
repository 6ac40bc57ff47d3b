//! The relay streams its backlog: its peak RSS with a 10,000-row backlog and
//! with a 1,000,000-row one, as a separate `seawall relay` process.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use async_nats::jetstream;

use super::report::Report;

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

async fn backlog(
    pg: &str,
    nats_url: &str,
    js: &jetstream::Context,
    rows: u64,
) -> Result<(u64, f64)> {
    let (db, url) = super::fresh_pg(pg, "memory").await?;
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
    super::relay::fill(&db, &format!("{subject}.e"), rows, 256).await?;
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .arg("relay")
        .env("SEAWALL_DATABASE_URL", &url)
        .env("SEAWALL_NATS_URL", nats_url)
        .env("SEAWALL_STREAM_MAX_AGE_MS", "3600000")
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().context("relay pid")?;
    let started = Instant::now();
    while worker::relay::pending_count(&db).await? > 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let peak = peak_rss_kib(pid)?;
    child.kill().await?;
    db.close().await?;
    Ok((peak, rows as f64 / elapsed))
}

/// Runs the scenario.
pub async fn run(pg: &str, nats_url: &str, small: u64, large: u64) -> Result<Report> {
    let mut report = Report::new("relay-memory");
    let client = seawall::nats::connect(nats_url).await?;
    report
        .versions
        .push(("nats-server".into(), client.server_info().version.clone()));
    let js = jetstream::new(client);
    report.setup.push(("process".into(), "`seawall relay` (this binary) draining a pre-filled PostgreSQL outbox of 256 B rows; peak RSS = VmHWM".into()));
    let mut peaks = Vec::new();
    for rows in [small, large] {
        let (peak, rate) = backlog(pg, nats_url, &js, rows).await?;
        eprintln!("  {rows} rows: peak RSS {peak} KiB, {rate:.0} rows/s");
        report.row(
            format!("{rows} row backlog"),
            vec![
                ("peak RSS MiB", format!("{:.1}", peak as f64 / 1024.0)),
                ("rows/s", format!("{rate:.0}")),
            ],
        );
        peaks.push(peak as f64);
    }
    report
        .notes
        .push(format!("peak RSS large/small = {:.2}", peaks[1] / peaks[0]));
    Ok(report)
}
