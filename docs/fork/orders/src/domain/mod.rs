//! The orders service's wiring: its stream, its consumer, its settings and
//! its commands (none).

use anyhow::Result;

use service::domain::orders::{ORDERS_CONSUMER, ORDERS_STREAM, PLACED_SUBJECT, place};
use service::{ConsumerName, Registry};

use crate::app::Domain;
use crate::config::{DomainSettings, Loaded};

/// The service's settings.
pub use service::domain::Settings;

impl DomainSettings for Settings {}

/// The `orders` consumer on the ORDERS stream.
///
/// # Errors
/// An invalid consumer name.
pub fn domain(loaded: &Loaded<Settings>) -> Result<Domain> {
    let registry = Registry::new().register_with(
        ConsumerName::parse(ORDERS_CONSUMER)?,
        PLACED_SUBJECT,
        loaded.domain.clone(),
        place,
    );
    Ok(Domain {
        stream: loaded.settings.stream(ORDERS_STREAM, &["orders.>"]),
        registry,
    })
}

/// The service's own commands: none.
#[derive(Debug, clap::Subcommand)]
pub enum Commands {}

/// Runs one of the service's commands.
///
/// # Errors
/// None: there are no commands.
pub async fn run(command: Commands, _loaded: &Loaded<Settings>) -> Result<()> {
    match command {}
}
