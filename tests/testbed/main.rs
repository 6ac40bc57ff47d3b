//! `seawall-testbed`: the platform's long-running roles on the test-only
//! ledger domain of the test kit (`tests/kit`): `seawall-testbed
//! run|relay|consume|api`, and `migrate [--status]` as `seawall`'s, configured
//! like `seawall` (`SEAWALL_*`), plus two knobs of the domain's own:
//! `TESTBED_WORK_MS` (a slow handler) and `TESTBED_WEBHOOK_URL` (the `hook`
//! consumer, a two-phase claim that POSTs each recorded entry), and the
//! crash tests' `TESTBED_FAULT` (a fault point to abort at, see
//! `worker::FaultPoint`), which is no setting of the product.
//!
//! The black-box tests (kill -9, SIGSTOP, outages) run this rather than
//! `seawall`, whose domain is the demo a fork replaces; it is also the
//! smallest example of a service assembled from seawall's parts.

use testkit::ledger as domain;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio_util::sync::CancellationToken;

use seawall::webhook::Webhook;
use seawall::{Domain, Roles, Settings};
use service::{ConsumerName, Registry};

fn main() -> ExitCode {
    seawall::app::process::main(run)
}

async fn run(stop: CancellationToken) -> Result<()> {
    let command = std::env::args().nth(1);
    let config = std::env::var_os("SEAWALL_CONFIG").map(std::path::PathBuf::from);
    let mut settings =
        seawall::config::load::<seawall::config::NoSettings>(config.as_deref())?.settings;
    let roles = match command.as_deref() {
        Some("run") => Roles::ALL,
        Some("relay") => Roles::RELAY,
        Some("consume") => Roles::CONSUME,
        Some("api") => Roles::API,
        Some("migrate") => {
            let status = std::env::args().nth(2).as_deref() == Some("--status");
            let migrate = async {
                seawall::app::migrate(&settings, status).await?;
                if !status {
                    // The ledger's tables are this domain's schema: the
                    // migration job makes them, before any role starts.
                    ledger_tables(&settings).await?;
                }
                Ok(())
            };
            return seawall::app::process::or_stopped(&stop, "applying migrations", migrate).await;
        }
        other => {
            bail!("usage: seawall-testbed run|relay|consume|api|migrate [--status] (got {other:?})")
        }
    };
    if let Ok(fault) = std::env::var("TESTBED_FAULT") {
        settings
            .arm_fault(&fault)
            .map_err(|e| anyhow::anyhow!("TESTBED_FAULT: {e}"))?;
    }
    // Waiting for the migration job, a role changes no schema: the job
    // (`migrate`) makes the ledger's tables too.
    if settings.migrations == seawall::config::Migrations::Apply
        && seawall::app::until_stopped(&stop, ledger_tables(&settings))
            .await?
            .is_none()
    {
        return Ok(());
    }
    let domain = ledger(&settings)?;
    seawall::app::serve(&settings, roles, domain, stop).await
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
