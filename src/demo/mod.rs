//! The example domain: credits applied to accounts (`credits.requested` in,
//! `credits.applied` out, through the inbox and the outbox) and the `notify`
//! consumer that POSTs each applied credit to a webhook through a two-phase
//! claim. With it come the commands that drive it: `seawall demo` (the
//! races of `docs/architecture.md`, narrated), `seawall publish` and
//! `seawall load`.
//!
//! A fork deletes this module (and the `demo` modules of `entity`,
//! `migration` and `service`) and supplies its own [`Domain`]; see
//! `docs/fork.md`. No platform test depends on it.

pub mod load;
pub mod publish;
pub mod races;

use anyhow::{Context, Result, bail};

use service::ConsumerName;
use service::Registry;
use service::demo::credits::{
    APPLIED_SUBJECT, CREDIT_CONSUMER, CREDITS_STREAM, CreditHandler, REQUESTED_SUBJECT,
};

use crate::app::{Domain, connect_db};
use crate::config::{Loaded, Settings};
use crate::webhook::Webhook;

/// The demo `notify` consumer's name.
pub const NOTIFY_CONSUMER: &str = "notify";

/// The demo's stream and consumers: `credit` always, `notify` when a webhook
/// URL is configured.
///
/// # Errors
/// A webhook CA file that cannot be read.
pub fn domain(settings: &Settings) -> Result<Domain> {
    let mut registry = Registry::new().register(
        ConsumerName::parse(CREDIT_CONSUMER)?,
        REQUESTED_SUBJECT,
        CreditHandler {
            work: std::time::Duration::from_millis(settings.demo_work_ms),
        },
    );
    if let Some(url) = &settings.notify_webhook_url {
        registry = registry.register_effect(
            ConsumerName::parse(NOTIFY_CONSUMER)?,
            APPLIED_SUBJECT,
            Webhook::new(url.clone(), settings.webhook_ca_file.as_deref())?,
            settings.claim_policy(),
        );
    }
    Ok(Domain {
        stream: settings.stream(CREDITS_STREAM, &["credits.>"]),
        registry,
    })
}

/// The demo's commands, flattened into `seawall`'s own.
#[derive(Debug, clap::Subcommand)]
pub enum Commands {
    /// Run the races of docs/architecture.md (rules 1-4) against the
    /// configured database (default: a fresh temporary SQLite file) and
    /// narrate what happened.
    Demo,
    /// Push synthetic credit requests through the inbox, each several times;
    /// prints a JSON summary. Run several at once to contend across processes.
    Load(load::LoadArgs),
    /// Publish demo `credits.requested` messages to JetStream.
    Publish(publish::PublishArgs),
}

/// Runs one of the demo's commands.
///
/// # Errors
/// The command failing, or (`load`) any message failing.
pub async fn run(command: Commands, loaded: &Loaded) -> Result<()> {
    let settings = &loaded.settings;
    match command {
        Commands::Demo => {
            let url = loaded
                .database_url_explicit
                .then_some(settings.database_url.as_str());
            let (db, _dir) = races::open(url).await?;
            migration::apply(&db).await.context("applying migrations")?;
            races::run(db).await
        }
        Commands::Load(args) => {
            let db = connect_db(&settings.database_url, settings.tool_pool_size()).await?;
            migration::apply(&db).await.context("applying migrations")?;
            let summary = load::run(db, &args).await?;
            println!("{}", serde_json::to_string(&summary)?);
            if summary.errors > 0 {
                bail!("{} message(s) failed", summary.errors);
            }
            Ok(())
        }
        Commands::Publish(args) => publish::run(settings, &args).await,
    }
}
