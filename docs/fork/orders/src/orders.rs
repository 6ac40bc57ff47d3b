//! The orders service's messaging: its stream and its consumers.

use anyhow::Result;

use service::orders::{ORDERS_CONSUMER, ORDERS_STREAM, OrderHandler, PLACED_SUBJECT};
use service::{ConsumerName, Registry};

use crate::app::Domain;
use crate::config::Settings;

/// The `orders` consumer on the ORDERS stream.
///
/// # Errors
/// None today; a registration that needs configuration may fail.
pub fn domain(settings: &Settings) -> Result<Domain> {
    let registry = Registry::new().register(
        ConsumerName::parse(ORDERS_CONSUMER)?,
        PLACED_SUBJECT,
        OrderHandler,
    );
    Ok(Domain {
        stream: settings.stream(ORDERS_STREAM, &["orders.>"]),
        registry,
    })
}
