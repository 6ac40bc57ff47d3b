//! The `seawall` command: parses the command line and dispatches to the
//! library crates. Errors end here, printed with their cause chain.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use seawall::app::serve;
use seawall::demo::{self, load, publish};
use seawall::{Roles, config};

/// Exactly-once effects over at-least-once messaging.
#[derive(Debug, Parser)]
#[command(name = "seawall", version, about)]
struct Cli {
    /// TOML configuration file; `SEAWALL_*` environment variables override it.
    #[arg(long, global = true, env = "SEAWALL_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or upgrade the schema (idempotent).
    Migrate,
    /// Run the races of docs/architecture.md (rules 1-4) against the configured database (default:
    /// a fresh temporary SQLite file) and narrate what happened.
    Demo,
    /// Push synthetic credit requests through the inbox, each several times;
    /// prints a JSON summary. Run several at once to contend across processes.
    Load(load::LoadArgs),
    /// Everything in one process: migrations, outbox relay, consumers, claim
    /// sweeper, pruner and the admin API with its dashboard.
    Run,
    /// Only the outbox relay (several may run against one database).
    Relay,
    /// Only the JetStream consumers (several may share one durable consumer),
    /// with the claim sweeper and the pruner.
    Consume,
    /// Only the admin API, dashboard and metrics.
    Api,
    /// Publish demo `credits.requested` messages to JetStream.
    Publish(publish::PublishArgs),
    /// Print counts by table and state, relay lag and throughput as JSON.
    Stats,
    /// Delete processed inbox markers and published outbox rows past their
    /// retention, in batches; prints the counts as JSON.
    Prune {
        /// Only count what would be deleted.
        #[arg(long)]
        dry_run: bool,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line with the cause chain; no backtrace for operator errors.
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    seawall::app::init();
    let cli = Cli::parse();
    let loaded = config::load(cli.config.as_deref())?;
    let settings = &loaded.settings;
    match cli.command {
        Command::Migrate => {
            let db = connect(&settings.database_url, settings.tool_pool_size()).await?;
            migration::apply(&db).await.context("applying migrations")?;
            println!(
                "migrations applied to {}",
                config::redact(&settings.database_url)
            );
        }
        Command::Demo => {
            let url = loaded
                .database_url_explicit
                .then_some(settings.database_url.as_str());
            let (db, _dir) = demo::races::open(url).await?;
            migration::apply(&db).await.context("applying migrations")?;
            demo::races::run(db).await?;
        }
        Command::Run => serve(settings, Roles::ALL, demo::domain(settings)?).await?,
        Command::Relay => serve(settings, Roles::RELAY, demo::domain(settings)?).await?,
        Command::Consume => serve(settings, Roles::CONSUME, demo::domain(settings)?).await?,
        Command::Api => serve(settings, Roles::API, demo::domain(settings)?).await?,
        Command::Publish(args) => publish::run(&settings.nats_url, &args).await?,
        Command::Prune { dry_run } => {
            let retention = settings.retention()?;
            let db = connect(&settings.database_url, 2).await?;
            let now = chrono::Utc::now();
            let report = if dry_run {
                service::retention::prune_dry_run(&db, &retention, now).await
            } else {
                service::retention::prune(&db, &retention, now).await
            }
            .context("pruning")?;
            let verb = if dry_run { "would_delete" } else { "deleted" };
            println!(
                "{}",
                serde_json::json!({ verb: report, "inbox_retention_ms": retention.inbox.as_millis() as u64, "outbox_retention_ms": retention.outbox.as_millis() as u64 })
            );
        }
        Command::Stats => {
            let db = connect(&settings.database_url, 1).await?;
            let stats = service::stats::stats(&db, chrono::Utc::now())
                .await
                .context("reading stats")?;
            println!("{}", serde_json::to_string_pretty(&stats)?);
        }
        Command::Load(args) => {
            let db = connect(&settings.database_url, settings.tool_pool_size()).await?;
            migration::apply(&db).await.context("applying migrations")?;
            let summary = load::run(db, &args).await?;
            println!("{}", serde_json::to_string(&summary)?);
            if summary.errors > 0 {
                anyhow::bail!("{} message(s) failed", summary.errors);
            }
        }
    }
    Ok(())
}

async fn connect(url: &str, max: u32) -> Result<sea_orm::DatabaseConnection> {
    service::db::connect(url, max)
        .await
        .with_context(|| format!("connecting to the database at {}", config::redact(url)))
}
