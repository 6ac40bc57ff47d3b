//! The platform's command line, the same for every service built on
//! seawall: `migrate`, the roles (`run`, `relay`, `consume`, `api`), `relay
//! --drop-slot`, `stats`, `prune` and `healthcheck`, plus the service's own
//! commands. A service's `main` is one call to [`main`] naming its
//! [`Service`]. The platform's black-box tests run this same command line
//! on a domain of their own (the test kit's), so they pass whatever a
//! fork's domain requires of its settings.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::app::process::or_stopped;
use crate::app::until_stopped;
use crate::app::{connect_db, serve};
use crate::config::{self, DomainSettings, Loaded, Settings};
use crate::{Domain, Roles};

/// What a service plugs into the platform's command line.
pub trait Service: 'static {
    /// Its settings (the `[domain]` table, `SEAWALL_DOMAIN_*`).
    type Settings: DomainSettings;
    /// Its own commands, beside the platform's ([`NoCommands`] for none).
    type Commands: Subcommand + std::fmt::Debug;

    /// Its stream and consumers.
    ///
    /// # Errors
    /// Whatever stops the domain from being assembled (a file it reads).
    fn domain(loaded: &Loaded<Self::Settings>) -> Result<Domain>;

    /// Runs one of its commands.
    fn run_command(
        command: Self::Commands,
        loaded: &Loaded<Self::Settings>,
    ) -> impl Future<Output = Result<()>>;

    /// Adjusts the settings before any command runs (the test domain arms
    /// a fault point here). Nothing by default.
    ///
    /// # Errors
    /// A value it cannot take.
    fn configure(_settings: &mut Settings) -> Result<()> {
        Ok(())
    }

    /// Makes the part of its schema its migrations do not (the test
    /// domain's tables): after `migrate`'s migrations, and in a role that
    /// applies migrations itself before it serves, so before the platform's
    /// migrations and outside their lock. What it makes must therefore not
    /// depend on the platform's tables, and must accept finding itself
    /// made by another process. Nothing by default.
    fn prepare_schema(_settings: &Settings) -> impl Future<Output = Result<()>> {
        async { Ok(()) }
    }
}

/// The commands of a service that has none of its own.
#[derive(Debug, Subcommand)]
pub enum NoCommands {}

/// Parses the command line and runs the command for `S`: the whole of a
/// service's `main`.
pub fn main<S: Service>() -> ExitCode {
    // Boxed: the command line's future holds every command's, a domain's
    // included, and laid out inline it can overflow the compiler's query
    // depth (a fork's domain did).
    crate::app::process::main(|stop| -> Pin<Box<dyn Future<Output = Result<()>>>> {
        Box::pin(run::<S>(stop))
    })
}

/// Exactly-once effects over at-least-once messaging.
#[derive(Debug, Parser)]
#[command(name = crate::SERVICE, version, about)]
struct Cli<C: Subcommand> {
    /// TOML configuration file; `SEAWALL_*` environment variables override it.
    #[arg(long, global = true, env = "SEAWALL_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command<C>,
}

#[derive(Debug, Subcommand)]
enum Command<C: Subcommand> {
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
    /// The service's own commands.
    #[command(flatten)]
    Domain(C),
}

/// The `/healthz` of this process's own listeners, asked over loopback
/// when they listen on every address.
fn local_probes(settings: &Settings) -> Vec<String> {
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

/// Runs the command line's command.
async fn run<S: Service>(stop: CancellationToken) -> Result<()> {
    let cli = Cli::<S::Commands>::parse();
    let mut loaded = config::load::<S::Settings>(cli.config.as_deref())?;
    S::configure(&mut loaded.settings)?;
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
        // Assembled first, so a domain that cannot be is an error even
        // when a signal ends start-up at the next step.
        let domain = S::domain(&loaded)?;
        // Waiting for the migration job, a role changes no schema.
        if settings.migrations == config::Migrations::Apply
            && until_stopped(&stop, S::prepare_schema(settings))
                .await?
                .is_none()
        {
            return Ok(());
        }
        return serve(settings, roles, domain, stop).await;
    }
    if let Command::Relay {
        drop_slot: true,
        drain: true,
    } = cli.command
    {
        return crate::app::drain_wal_slot(settings, S::domain(&loaded)?, stop).await;
    }
    let doing = cli.command.doing();
    or_stopped(&stop, doing, one_shot::<S>(cli.command, &loaded)).await
}

impl<C: Subcommand> Command<C> {
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
async fn one_shot<S: Service>(
    command: Command<S::Commands>,
    loaded: &Loaded<S::Settings>,
) -> Result<()> {
    let settings = &loaded.settings;
    match command {
        Command::Migrate { status } => {
            crate::app::migrate(settings, status).await?;
            if status {
                return Ok(());
            }
            S::prepare_schema(settings).await
        }
        Command::Relay { .. } => {
            let db = connect_db(&settings.database_url, 1).await?;
            settings.settle_wal_slot(&db).await?;
            let slot = settings.wal_slot();
            let dropped = worker::relay::wal::drop_slot(&db, &slot).await?;
            println!(
                "{} replication slot {slot}",
                if dropped { "dropped" } else { "there was no" }
            );
            Ok(())
        }
        Command::Domain(command) => S::run_command(command, loaded).await,
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
async fn prune(settings: &Settings, dry_run: bool) -> Result<()> {
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
async fn stats(settings: &Settings) -> Result<()> {
    let db = connect_db(&settings.database_url, 1).await?;
    let wal = settings.outbox_mode == service::OutboxMode::Wal;
    if wal {
        settings.settle_wal_slot(&db).await?;
    }
    let wal_slot = wal.then(|| settings.wal_slot());
    let stats = service::stats::stats(&db, chrono::Utc::now(), wal_slot.as_deref())
        .await
        .context("reading stats")?;
    println!("{}", serde_json::to_string_pretty(&stats)?);
    Ok(())
}
