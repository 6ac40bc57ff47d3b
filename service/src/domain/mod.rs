//! The domain: here, the example of crediting accounts ([`credits`]). A fork
//! replaces this folder with its own handlers and [`Settings`] (see
//! `docs/fork.md`); platform code never names what is inside it.

pub mod credits;

use serde::{Deserialize, Serialize};

/// The domain's own settings: the `[domain]` table of the configuration
/// file, or `SEAWALL_<KEY>` variables like the platform's (a key the
/// platform also has is refused at start-up). Every field needs a default,
/// and unknown keys are refused, so a misspelt one stops start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Simulated work inside the `credit` handler after its writes, in
    /// milliseconds, to make races between instances observable.
    pub demo_work_ms: u64,
    /// Where the `notify` consumer POSTs each `credits.applied` event,
    /// through a two-phase claim; `notify` is off when unset.
    pub notify_webhook_url: Option<String>,
}

impl Settings {
    /// Checks what serde cannot.
    ///
    /// # Errors
    /// The offending key and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if let Some(url) = &self.notify_webhook_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err((
                "notify_webhook_url",
                "must be an http:// or https:// URL".to_owned(),
            ));
        }
        Ok(())
    }
}
