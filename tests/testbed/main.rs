//! `seawall-testbed`: the platform's command line ([`seawall::cli`]: the
//! roles, `migrate`, `relay --drop-slot`, `stats`, `prune`, `healthcheck`)
//! on the test-only ledger domain of the test kit (`tests/kit`), configured
//! like `seawall` (`SEAWALL_*`), plus knobs of the domain's own:
//! `TESTBED_WORK_MS` (a slow handler), `TESTBED_WEBHOOK_URL` (the `hook`
//! consumer, a two-phase claim that POSTs each recorded entry),
//! `TESTBED_FOREIGN` (`STREAM:subject`: a ledger consumer of a stream
//! another service owns) and `TESTBED_TABLES=skip` (no ledger tables, for
//! the start-up tests), and the crash tests' `TESTBED_FAULT` (a fault
//! point to abort at, see `worker::FaultPoint`), which is no setting of
//! the product.
//!
//! The platform's black-box tests (kill -9, SIGSTOP, outages, settings)
//! run this rather than `seawall`, whose domain is the demo a fork
//! replaces: they pass whatever a fork's domain requires. It is also the
//! smallest example of a service assembled from seawall's parts.

use testkit::ledger as domain;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use seawall::cli::{NoCommands, Service};
use seawall::config::{Loaded, NoSettings};
use seawall::webhook::Webhook;
use seawall::{Domain, Settings};
use service::{ConsumerName, Registry};

/// The test kit's ledger as a service: no settings or commands of its own.
struct Testbed;

impl Service for Testbed {
    type Settings = NoSettings;
    type Commands = NoCommands;

    fn domain(loaded: &Loaded<NoSettings>) -> Result<Domain> {
        ledger(&loaded.settings)
    }

    async fn run_command(command: NoCommands, _: &Loaded<NoSettings>) -> Result<()> {
        match command {}
    }

    fn configure(settings: &mut Settings) -> Result<()> {
        if let Ok(fault) = std::env::var("TESTBED_FAULT") {
            settings
                .arm_fault(&fault)
                .map_err(|e| anyhow::anyhow!("TESTBED_FAULT: {e}"))?;
        }
        Ok(())
    }

    /// `TESTBED_TABLES=skip` leaves the ledger's tables out: a start-up
    /// test then sees the platform's own first database step (which the
    /// tables' wait for the database would otherwise hide).
    async fn prepare_schema(settings: &Settings) -> Result<()> {
        if std::env::var("TESTBED_TABLES").is_ok_and(|v| v == "skip") {
            return Ok(());
        }
        ledger_tables(settings).await
    }
}

fn main() -> ExitCode {
    seawall::cli::main::<Testbed>()
}

/// Creates the ledger's tables where they are missing.
async fn ledger_tables(settings: &Settings) -> Result<()> {
    let db = seawall::app::connect_db_waiting(&settings.database_url, 2, settings.sqlite()).await?;
    // A process restarted while the database restarts meets the outage
    // here too: wait it out, as `connect_db_waiting` did.
    seawall::app::wait_out_database("creating the ledger's tables", || {
        domain::create_tables(&db)
    })
    .await?;
    db.close().await.ok();
    Ok(())
}

/// The ledger consumer of `TESTBED_FOREIGN`'s stream.
const FOREIGN_CONSUMER: &str = "ledger_foreign";

/// The ledger's stream and consumers.
fn ledger(settings: &Settings) -> Result<Domain> {
    let work = match std::env::var("TESTBED_WORK_MS") {
        Ok(ms) => Duration::from_millis(ms.parse().context("TESTBED_WORK_MS")?),
        Err(_) => Duration::ZERO,
    };
    let mut registry = Registry::new().register_handler(
        ConsumerName::parse(domain::LEDGER_CONSUMER)?,
        domain::RECORD_SUBJECT,
        domain::LedgerHandler { work },
    );
    // `STREAM:subject`: the ledger handler also reads `subject` from
    // `STREAM`, a stream another service owns (the test made it).
    if let Ok(foreign) = std::env::var("TESTBED_FOREIGN") {
        let (stream, subject) = foreign
            .split_once(':')
            .context("TESTBED_FOREIGN is STREAM:subject")?;
        registry = registry
            .register_handler(
                ConsumerName::parse(FOREIGN_CONSUMER)?,
                subject,
                domain::LedgerHandler { work },
            )
            .from_stream(stream);
    }
    if let Ok(url) = std::env::var("TESTBED_WEBHOOK_URL") {
        registry = registry.register_effect(
            ConsumerName::parse(domain::HOOK_CONSUMER)?,
            domain::RECORDED_SUBJECT,
            Webhook::new(url, settings.webhook_ca_file.as_deref())?,
            settings.claim_policy(),
        );
    }
    Ok(Domain {
        stream: settings.stream(domain::LEDGER_STREAM, &["ledger.>"]),
        registry,
    })
}
