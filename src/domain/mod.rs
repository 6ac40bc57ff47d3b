//! The domain's wiring: which stream its subjects live in, which handler
//! consumes which subject, its settings, and its own commands. Here it is
//! the example, credits applied to accounts (`credits.requested` in,
//! `credits.applied` out) and the `notify` consumer that POSTs each applied
//! credit to a webhook through a two-phase claim, with the commands that
//! drive it: `seawall demo` (the races of `docs/architecture.md`,
//! narrated), `seawall publish` and `seawall load`.
//!
//! A fork replaces this folder (and the `domain` folders of `entity`,
//! `migration` and `service`); the platform reaches it only through
//! [`Settings`], [`domain`], [`Commands`] and [`run`] (see `docs/fork.md`).

pub mod load;
pub mod publish;
pub mod races;

use anyhow::{Context, Result, bail};

use service::ConsumerName;
use service::Registry;
use service::domain::credits::{
    APPLIED_SUBJECT, CREDIT_CONSUMER, CREDITS_STREAM, REQUESTED_SUBJECT, credit,
};

use crate::app::{Domain, connect_db};
use crate::config::{DomainSettings, Loaded};
use crate::webhook::Webhook;

/// The domain's settings (`[domain]` in the file, `SEAWALL_<KEY>`
/// variables).
pub use service::domain::Settings;

impl DomainSettings for Settings {
    fn validate(&self) -> Result<(), (&'static str, String)> {
        Settings::validate(self)
    }
}

/// The `notify` consumer's name.
pub const NOTIFY_CONSUMER: &str = "notify";

/// The stream and consumers: `credit` always, `notify` when a webhook URL
/// is configured.
///
/// # Errors
/// A webhook CA file that cannot be read.
pub fn domain(loaded: &Loaded<Settings>) -> Result<Domain> {
    let (settings, own) = (&loaded.settings, &loaded.domain);
    let mut registry = Registry::new().register_with(
        ConsumerName::parse(CREDIT_CONSUMER)?,
        REQUESTED_SUBJECT,
        own.clone(),
        credit,
    );
    if let Some(url) = &own.notify_webhook_url {
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

/// The domain's commands, flattened into `seawall`'s own.
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

/// Runs one of the domain's commands.
///
/// # Errors
/// The command failing, or (`load`) any message failing.
pub async fn run(command: Commands, loaded: &Loaded<Settings>) -> Result<()> {
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
