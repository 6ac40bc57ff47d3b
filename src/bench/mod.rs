//! `seawall bench <scenario>`: measured figures, printed as a table (or JSON),
//! next to the physical limits measured in the same run where the scenario
//! has one. Benchmarks report; they never pass or fail on speed.

mod api;
mod cpu;
mod e2e;
mod inbox;
mod latency;
mod memory;
mod relay;
mod report;

use anyhow::{Context, Result};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};

use migration::MigratorTrait;

/// Arguments of `seawall bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub scenario: Scenario,
    /// Print the report as JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// A seconds-long run that only proves the scenario works (CI).
    #[arg(long, global = true)]
    pub smoke: bool,
    /// PostgreSQL server (no database name); each run creates its own database.
    #[arg(
        long,
        global = true,
        env = "SEAWALL_BENCH_PG_URL",
        default_value = "postgres://postgres@127.0.0.1:55432"
    )]
    pub pg_url: String,
    /// NATS server with JetStream (the `relay`, `latency` and `e2e` scenarios
    /// create streams on it; `e2e` recreates CREDITS).
    #[arg(
        long,
        global = true,
        env = "SEAWALL_BENCH_NATS_URL",
        default_value = "nats://127.0.0.1:54222"
    )]
    pub nats_url: String,
}

/// The scenarios.
#[derive(Debug, clap::Subcommand)]
pub enum Scenario {
    /// Admin API latency (p50/p95) of list pages and stats on a big outbox and inbox.
    Api {
        /// Rows in each of outbox_message and inbox_message.
        #[arg(long, default_value_t = 1_000_000)]
        rows: u64,
        /// Requests per endpoint.
        #[arg(long, default_value_t = 100)]
        requests: usize,
    },
    /// Messages/s through `Inbox::process` against a bare transaction, 1-64 workers.
    Inbox {
        /// Messages per measurement.
        #[arg(long, default_value_t = 10_000)]
        messages: u64,
    },
    /// Outbox rows/s to JetStream against a plain publisher, 1 and 3 relays.
    Relay {
        /// Rows per measurement.
        #[arg(long, default_value_t = 100_000)]
        rows: u64,
    },
    /// Peak RSS of a `seawall relay` process: small against large backlog.
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
    /// Messages/s from a JetStream publish to the `credits.applied` subscriber.
    E2e {
        /// Messages.
        #[arg(long, default_value_t = 20_000)]
        messages: u64,
    },
}

/// Runs a scenario and prints its report.
pub async fn run(args: BenchArgs) -> Result<()> {
    let report = match args.scenario {
        Scenario::Api { rows, requests } => {
            let (rows, requests) = if args.smoke {
                (2_000, 5)
            } else {
                (rows, requests)
            };
            api::run(&args.pg_url, rows, requests).await?
        }
        Scenario::Inbox { messages } => {
            inbox::run(&args.pg_url, if args.smoke { 100 } else { messages }).await?
        }
        Scenario::Relay { rows } => {
            relay::run(
                &args.pg_url,
                &args.nats_url,
                if args.smoke { 500 } else { rows },
            )
            .await?
        }
        Scenario::RelayMemory { small, large } => {
            let (small, large) = if args.smoke {
                (500, 2_000)
            } else {
                (small, large)
            };
            memory::run(&args.pg_url, &args.nats_url, small, large).await?
        }
        Scenario::Latency { seconds } => {
            let (seconds, bursts) = if args.smoke { (1, 1) } else { (seconds, 5) };
            latency::run(&args.pg_url, &args.nats_url, seconds, bursts).await?
        }
        Scenario::E2e { messages } => {
            e2e::run(
                &args.pg_url,
                &args.nats_url,
                if args.smoke { 200 } else { messages },
            )
            .await?
        }
    };
    drop_created(&args.pg_url).await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report.print();
    }
    Ok(())
}

/// Databases [`fresh_pg`] created in this run, dropped when it ends so that
/// repeated runs (a million-row `api` scenario among them) do not fill the disk.
static CREATED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Drops this run's databases; a failure only leaves them behind (logged).
async fn drop_created(server: &str) {
    let names = std::mem::take(&mut *CREATED.lock().unwrap_or_else(|e| e.into_inner()));
    if names.is_empty() {
        return;
    }
    let admin = match sea_orm::Database::connect(format!("{server}/postgres")).await {
        Ok(admin) => admin,
        Err(err) => {
            tracing::warn!(error = %err, "could not drop the benchmark databases");
            return;
        }
    };
    for name in names {
        let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
        if let Err(err) = admin
            .execute_raw(Statement::from_string(DbBackend::Postgres, sql))
            .await
        {
            tracing::warn!(database = %name, error = %err, "could not drop a benchmark database");
        }
    }
}

/// A fresh, migrated PostgreSQL database for one run (dropped at its end).
pub async fn fresh_pg(server: &str, scenario: &str) -> Result<(DatabaseConnection, String)> {
    let name = format!("bench_{scenario}_{}", uuid::Uuid::now_v7().simple());
    let admin = sea_orm::Database::connect(format!("{server}/postgres"))
        .await
        .with_context(|| format!("connecting to PostgreSQL at {server} (start it with scripts/services start pg, or pass --pg-url)"))?;
    admin
        .execute_raw(Statement::from_string(
            DbBackend::Postgres,
            format!("CREATE DATABASE {name}"),
        ))
        .await?;
    CREATED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(name.clone());
    let url = format!("{server}/{name}");
    let db = service::db::connect(&url, 32).await?;
    migration::Migrator::up(&db, None).await?;
    Ok((db, url))
}

/// The server's version string.
pub async fn pg_version(db: &DatabaseConnection) -> Result<String> {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SHOW server_version",
        ))
        .await?
        .context("no version row")?;
    Ok(row.try_get::<String>("", "server_version")?)
}
