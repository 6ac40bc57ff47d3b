//! The orders service: placed orders accepted exactly once, and each
//! accepted order handed to the shipping service exactly once.

pub mod orders;

use serde::{Deserialize, Serialize};

/// The service's own settings (`[domain]` in the file, `SEAWALL_<KEY>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// The largest order accepted, in cents; `0` takes any amount.
    pub orders_max_amount: i64,
    /// Where the `shipping` consumer POSTs each accepted order. Required:
    /// without it start-up stops, naming the key, for every command.
    pub orders_shipping_url: Option<String>,
}

impl Settings {
    /// What serde cannot check: the shipping URL is there, and is one.
    ///
    /// # Errors
    /// The offending key and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        match &self.orders_shipping_url {
            None => Err((
                "orders_shipping_url",
                "is required: the shipping service's URL".to_owned(),
            )),
            Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => Err((
                "orders_shipping_url",
                "must be an http:// or https:// URL".to_owned(),
            )),
            Some(_) => Ok(()),
        }
    }
}
