//! The `seawall` command: parses the command line and dispatches to the
//! library crates. Errors end here, printed with their cause chain.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use seawall::app::process::or_stopped;
use seawall::app::{connect_db, serve};
use seawall::domain;
use seawall::{Roles, config};
use tokio_util::sync::CancellationToken;

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
    /// Create or upgrade the schema (idempotent), one process at a time.
    /// Migrations of a newer release are left alone and listed.
    Migrate {
        /// Only list each migration as applied, pending or unknown (a newer
        /// release's) and exit; changes nothing.
        #[arg(long)]
        status: bool,
    },
    /// Everything in one process: migrations, outbox relay, consumers, claim
    /// sweeper, pruner and the admin API with its dashboard.
    Run,
    /// Only the outbox relay (several may run against one database).
    Relay {
        /// Drop the WAL relay's replication slot and publication
        /// (`outbox_mode = "wal"`) and exit: the WAL it retained is freed,
        /// and events not yet relayed from it are lost. Stop the relays first.
        #[arg(long)]
        drop_slot: bool,
        /// With --drop-slot: relay what the slot holds first, then drop it,
        /// switching the database back to table mode. Stop every WAL-mode
        /// process first: what one writes meanwhile is lost with the slot.
        #[arg(long, requires = "drop_slot")]
        drain: bool,
    },
    /// Only the JetStream consumers (several may share one durable consumer),
    /// with the claim sweeper and the pruner.
    Consume,
    /// Only the admin API, dashboard and metrics.
    Api,
    /// Print counts by table and state, relay lag and throughput as JSON.
    Stats,
    /// Delete processed inbox markers and published outbox rows past their
    /// retention, in batches; prints the counts as JSON.
    Prune {
        /// Only count what would be deleted.
        #[arg(long)]
        dry_run: bool,
    },
    /// Exit 0 when a probe answers 2xx within 3 s, 1 otherwise: the
    /// container image's health check, which has no HTTP client of its own.
    /// Without a URL it asks `/healthz` on this process's probe listener
    /// (`metrics_addr`) and on its API listener (`api_addr`): a `relay` or
    /// `consume` answers on the one, `run` and `api` on the other.
    Healthcheck {
        /// The probe to ask.
        url: Option<String>,
    },
    /// The domain's own commands (`src/domain/`).
    #[command(flatten)]
    Domain(domain::Commands),
}

/// The `/healthz` of this process's own listeners, asked over loopback
/// when they listen on every address.
fn local_probes(settings: &config::Settings) -> Vec<String> {
    let local = |addr: std::net::SocketAddr| {
        let ip = if addr.ip().is_unspecified() {
            std::net::IpAddr::from([127, 0, 0, 1])
        } else {
            addr.ip()
        };
        format!(
            "http://{}/healthz",
            std::net::SocketAddr::new(ip, addr.port())
        )
    };
    settings
        .metrics_addr()
        .into_iter()
        .chain([settings.api_addr])
        .map(local)
        .collect()
}

/// GETs each of `urls`; an error unless one answers 2xx within 3 s.
async fn healthcheck(urls: &[String]) -> Result<()> {
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(3))
        .build()
        .context("building the HTTP client")?;
    let mut failures = Vec::new();
    for url in urls {
        match client.get(url).send().await {
            Ok(response) if response.status().is_success() => {
                println!("{url}: {}", response.status());
                return Ok(());
            }
            Ok(response) => failures.push(format!("{url} answered {}", response.status())),
            Err(err) => failures.push(format!("{url}: {err}")),
        }
    }
    anyhow::bail!("no probe answered: {}", failures.join("; "))
}

fn main() -> ExitCode {
    seawall::app::process::main(run)
}

async fn run(stop: CancellationToken) -> Result<()> {
    let cli = Cli::parse();
    let loaded = config::load::<domain::Settings>(cli.config.as_deref())?;
    let settings = &loaded.settings;
    let roles = match cli.command {
        Command::Run => Some(Roles::ALL),
        Command::Relay {
            drop_slot: false, ..
        } => Some(Roles::RELAY),
        Command::Consume => Some(Roles::CONSUME),
        Command::Api => Some(Roles::API),
        _ => None,
    };
    if let Some(roles) = roles {
        return serve(settings, roles, domain::domain(&loaded)?, stop).await;
    }
    if let Command::Relay {
        drop_slot: true,
        drain: true,
    } = cli.command
    {
        return seawall::app::drain_wal_slot(settings, domain::domain(&loaded)?, stop).await;
    }
    let doing = cli.command.doing();
    or_stopped(&stop, doing, one_shot(cli.command, &loaded)).await
}

impl Command {
    /// What a one-shot command is doing, for the error a signal ends it with.
    fn doing(&self) -> &'static str {
        match self {
            Command::Migrate { status: false } => "applying migrations",
            Command::Migrate { status: true } => "reading the applied migrations",
            Command::Relay { .. } => "dropping the replication slot",
            Command::Stats => "reading stats",
            Command::Prune { .. } => "pruning",
            Command::Healthcheck { .. } => "asking the probes",
            Command::Domain(_) => "running the domain's command",
            Command::Run | Command::Consume | Command::Api => "starting",
        }
    }
}

/// The commands that do one thing and exit.
async fn one_shot(command: Command, loaded: &config::Loaded<domain::Settings>) -> Result<()> {
    let settings = &loaded.settings;
    match command {
        Command::Migrate { status } => seawall::app::migrate(settings, status).await,
        Command::Relay { .. } => {
            let db = connect_db(&settings.database_url, 1).await?;
            let slot = settings.wal_slot();
            let dropped = worker::relay::wal::drop_slot(&db, &slot).await?;
            println!(
                "{} replication slot {slot}",
                if dropped { "dropped" } else { "there was no" }
            );
            Ok(())
        }
        Command::Domain(command) => domain::run(command, loaded).await,
        Command::Healthcheck { url } => {
            let urls = match url {
                Some(url) => vec![url],
                None => local_probes(settings),
            };
            healthcheck(&urls).await
        }
        Command::Prune { dry_run } => prune(settings, dry_run).await,
        Command::Stats => stats(settings).await,
        Command::Run | Command::Consume | Command::Api => Ok(()),
    }
}

/// `seawall prune`: deletes (or counts) what retention allows, as JSON.
async fn prune(settings: &config::Settings, dry_run: bool) -> Result<()> {
    let retention = settings.retention()?;
    let db = connect_db(&settings.database_url, 2).await?;
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
        serde_json::json!({ verb: report, "inbox_retention_ms": retention.inbox.map(|d| d.as_millis() as u64), "outbox_retention_ms": retention.outbox.as_millis() as u64 })
    );
    Ok(())
}

/// `seawall stats`: counts, lag and throughput as JSON.
async fn stats(settings: &config::Settings) -> Result<()> {
    let db = connect_db(&settings.database_url, 1).await?;
    let wal_slot = (settings.outbox_mode == service::OutboxMode::Wal).then(|| settings.wal_slot());
    let stats = service::stats::stats(&db, chrono::Utc::now(), wal_slot.as_deref())
        .await
        .context("reading stats")?;
    println!("{}", serde_json::to_string_pretty(&stats)?);
    Ok(())
}
