//! `seawall-bench <scenario>`: seawall measured against real PostgreSQL and
//! NATS servers, printed as a Markdown table (or JSON), next to the physical
//! limits measured in the same run where the scenario has one. Benchmarks
//! report; they never pass or fail on speed.
//!
//! A binary of its own, so the product binary carries no benchmark code; it
//! uses the `seawall` library to start exactly what `seawall run` starts, and
//! the `relay-memory` scenario runs the `seawall` binary itself.
//!
//! # Layout
//! - `report`: figures (numbers with their unit in the key), columns and
//!   the table printer.
//! - `pg`: the PostgreSQL server that hands out fresh databases and drops
//!   them at the end of the run.
//! - `cpu`: CPU time per party, from `/proc`.
//! - one module per scenario: `inbox`, `relay`, `memory`,
//!   `latency`, `e2e`, `api`.

mod api;
mod cpu;
mod e2e;
mod inbox;
mod latency;
mod memory;
mod pg;
mod relay;
mod report;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use pg::PgServer;
use report::Report;

/// Benchmarks of seawall against real servers; see BENCHMARKS.md.
#[derive(Debug, Parser)]
#[command(name = "seawall-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
    /// Print the report as JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// A seconds-long run that only proves the scenario works (CI).
    #[arg(long, global = true)]
    smoke: bool,
    /// PostgreSQL server (no database name); each run creates its own databases.
    #[arg(
        long,
        global = true,
        env = "SEAWALL_BENCH_PG_URL",
        default_value = "postgres://postgres@127.0.0.1:55432"
    )]
    pg_url: String,
    /// NATS server with JetStream (the `relay`, `relay-memory`, `latency` and
    /// `e2e` scenarios create streams on it; `e2e` recreates LEDGER).
    #[arg(
        long,
        global = true,
        env = "SEAWALL_BENCH_NATS_URL",
        default_value = "nats://127.0.0.1:54222"
    )]
    nats_url: String,
}

/// The scenarios.
#[derive(Debug, Clone, Subcommand)]
enum Scenario {
    /// Admin API latency (p50/p95) of list pages and stats on a big outbox and inbox.
    Api {
        /// Rows in each of outbox_message and inbox_message from the last
        /// minutes, at 1,000 per second.
        #[arg(long, default_value_t = 1_000_000)]
        rows: u64,
        /// Older rows in each table, spread over the week before.
        #[arg(long, default_value_t = 1_000_000)]
        history: u64,
        /// Requests per endpoint.
        #[arg(long, default_value_t = 100)]
        requests: usize,
    },
    /// Messages/s through `Inbox::process` against a bare transaction, 1-64 workers.
    Inbox {
        /// Messages per measurement.
        #[arg(long, default_value_t = 10_000)]
        messages: u64,
        /// MariaDB or MySQL server (no database name) to measure too, in a
        /// database of its own; `scripts/bench` sets it to a server that
        /// flushes its log at every commit.
        #[arg(long, env = "SEAWALL_BENCH_MYSQL_URL")]
        mysql_url: Option<String>,
    },
    /// Outbox rows/s to JetStream against a plain publisher, 1 and 3 relays.
    Relay {
        /// Rows per measurement.
        #[arg(long, default_value_t = 100_000)]
        rows: u64,
    },
    /// Peak RSS of a `seawall relay` process: small against large backlog.
    /// Runs the service's binary next to this one, or `SEAWALL_BIN`.
    RelayMemory {
        /// Small backlog.
        #[arg(long, default_value_t = 10_000)]
        small: u64,
        /// Large backlog.
        #[arg(long, default_value_t = 1_000_000)]
        large: u64,
    },
    /// Commit-to-subscriber delay, steady and in bursts, notify vs polling.
    Latency {
        /// Seconds of steady 1,000 events/s.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Messages/s from a JetStream publish to the `ledger.recorded` subscriber.
    E2e {
        /// Messages.
        #[arg(long, default_value_t = 20_000)]
        messages: u64,
    },
    /// Prints BENCHMARKS.md from stored JSON reports (`--json` runs of the
    /// scenarios), followed by `ANALYSIS.md` from the reports' directory.
    Report {
        /// The JSON reports.
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
    },
}

impl Scenario {
    /// The same scenario at the sizes of a smoke run: seconds long, enough to
    /// prove that every step works, too small for its figures to mean much.
    fn smoke(self) -> Self {
        match self {
            Self::Api { .. } => Self::Api {
                rows: 2_000,
                history: 2_000,
                requests: 5,
            },
            Self::Inbox { mysql_url, .. } => Self::Inbox {
                messages: 100,
                mysql_url,
            },
            Self::Relay { .. } => Self::Relay { rows: 500 },
            Self::RelayMemory { .. } => Self::RelayMemory {
                small: 500,
                large: 2_000,
            },
            Self::Latency { .. } => Self::Latency { seconds: 1 },
            Self::E2e { .. } => Self::E2e { messages: 200 },
            Self::Report { paths } => Self::Report { paths },
        }
    }

    /// Runs the scenario; its databases come from `pg`.
    async fn run(self, pg: &mut PgServer, nats_url: &str, smoke: bool) -> Result<Report> {
        match self {
            Self::Api {
                rows,
                history,
                requests,
            } => api::run(pg, rows, history, requests).await,
            Self::Inbox {
                messages,
                mysql_url,
            } => inbox::run(pg, messages, mysql_url.as_deref()).await,
            Self::Relay { rows } => relay::run(pg, nats_url, rows).await,
            Self::RelayMemory { small, large } => memory::run(pg, nats_url, small, large).await,
            Self::Latency { seconds } => {
                let bursts = if smoke { 1 } else { 5 };
                latency::run(pg, nats_url, seconds, bursts).await
            }
            Self::E2e { messages } => e2e::run(pg, nats_url, messages).await,
            Self::Report { .. } => unreachable!("`report` measures nothing; main renders it"),
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    seawall::app::exit_code(run().await)
}

async fn run() -> Result<()> {
    let _telemetry = seawall::app::init()?;
    let cli = Cli::parse();
    let scenario = if cli.smoke {
        cli.scenario.smoke()
    } else {
        cli.scenario
    };
    if let Scenario::Report { paths } = &scenario {
        print!("{}", render(paths)?);
        return Ok(());
    }
    let mut pg = PgServer::new(cli.pg_url);
    let report = scenario.run(&mut pg, &cli.nats_url, cli.smoke).await;
    pg.drop_created().await;
    let report = report?;
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.section());
    }
    Ok(())
}

/// BENCHMARKS.md from the reports at `paths` and the `ANALYSIS.md` beside
/// the first of them.
fn render(paths: &[std::path::PathBuf]) -> Result<String> {
    let mut reports = Vec::new();
    for path in paths {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let report: Report = serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: not a seawall-bench report; run scripts/bench to measure again",
                path.display()
            )
        })?;
        reports.push(report);
    }
    let analysis = paths
        .first()
        .and_then(|p| p.parent())
        .map(|dir| dir.join("ANALYSIS.md"))
        .and_then(|p| std::fs::read_to_string(p).ok());
    Ok(report::document(&reports, analysis.as_deref()))
}
