//! The orders service's wiring: its stream, its two consumers, its settings
//! and its one command.

use anyhow::{Context, Result};
use async_nats::jetstream::{self, message::PublishMessage};

use service::domain::orders::{
    ACCEPTED_SUBJECT, ORDERS_CONSUMER, ORDERS_STREAM, OrderPlaced, PLACED_SUBJECT,
    SHIPPING_CONSUMER, place,
};
use service::{ConsumerName, Registry};

use crate::app::Domain;
use crate::config::{DomainSettings, Loaded};
use crate::webhook::Webhook;

/// The service's settings.
pub use service::domain::Settings;

impl DomainSettings for Settings {
    fn validate(&self) -> Result<(), (&'static str, String)> {
        Settings::validate(self)
    }
}

/// The ORDERS stream, the `orders` consumer (placed orders accepted, in
/// the inbox's transaction) and the `shipping` consumer (each accepted
/// order POSTed once, through a two-phase claim).
///
/// # Errors
/// An invalid consumer name; a webhook CA file that cannot be read.
pub fn domain(loaded: &Loaded<Settings>) -> Result<Domain> {
    let (settings, own) = (&loaded.settings, &loaded.domain);
    // validate() made sure it is there.
    let shipping_url = own
        .orders_shipping_url
        .clone()
        .context("orders_shipping_url is required")?;
    let registry = Registry::new()
        .register_with(
            ConsumerName::parse(ORDERS_CONSUMER)?,
            PLACED_SUBJECT,
            own.clone(),
            place,
        )
        .register_effect(
            ConsumerName::parse(SHIPPING_CONSUMER)?,
            ACCEPTED_SUBJECT,
            Webhook::new(shipping_url, settings.webhook_ca_file.as_deref())?,
            settings.claim_policy(),
        );
    Ok(Domain {
        stream: settings.stream(ORDERS_STREAM, &["orders.>"]),
        registry,
    })
}

/// The service's own commands, next to the platform's.
#[derive(Debug, clap::Subcommand)]
pub enum Commands {
    /// Publish an `orders.placed` message (message id
    /// `placed-<order-id>`), to try the service out.
    PlaceOrder {
        /// The order's id.
        #[arg(long)]
        order_id: String,
        /// Its amount, in cents.
        #[arg(long)]
        amount: i64,
    },
}

/// Runs one of the service's commands.
///
/// # Errors
/// NATS unreachable, or the ORDERS stream missing.
pub async fn run(command: Commands, loaded: &Loaded<Settings>) -> Result<()> {
    match command {
        Commands::PlaceOrder { order_id, amount } => {
            let nats = crate::nats::connect_with(&loaded.settings, false).await?;
            let payload = serde_json::to_vec(&OrderPlaced {
                order_id: order_id.clone(),
                amount,
            })?;
            let msg = PublishMessage::build()
                .payload(payload.into())
                .message_id(format!("placed-{order_id}"));
            let ack = jetstream::new(nats.client)
                .send_publish(PLACED_SUBJECT, msg)
                .await
                .context("publishing")?
                .await
                .with_context(|| {
                    format!(
                        "waiting for the PubAck (is the ORDERS stream there? start `{} run` first)",
                        crate::SERVICE
                    )
                })?;
            println!("{}", if ack.duplicate { "duplicate" } else { "stored" });
            Ok(())
        }
    }
}
