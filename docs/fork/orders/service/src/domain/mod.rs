//! The orders service: placed orders accepted exactly once.

pub mod orders;

use serde::{Deserialize, Serialize};

/// The service's own settings (`[domain]` in the file, `SEAWALL_<KEY>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// The largest order accepted, in cents; `0` takes any amount.
    pub orders_max_amount: i64,
}
