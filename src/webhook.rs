//! The demo `notify` consumer's effect: POST each `credits.applied` event to a
//! webhook, through a two-phase claim, with `Idempotency-Key` = the event's
//! message id so the receiver can drop a repeat after a crash.

use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::StatusCode;

use service::{Effect, Envelope, HandlerError};

/// POSTs events to one URL.
pub struct Webhook {
    client: reqwest::Client,
    url: String,
}

impl Webhook {
    /// A webhook with a 10 s request timeout.
    pub fn new(url: String) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        Ok(Self { client, url })
    }
}

impl Effect for Webhook {
    fn perform<'a>(
        &'a self,
        envelope: &'a Envelope,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, HandlerError>> {
        Box::pin(async move {
            let response = self
                .client
                .post(&self.url)
                .header("Idempotency-Key", idempotency_key)
                .header("Content-Type", "application/json")
                .body(envelope.payload.clone())
                .send()
                .await
                .map_err(|e| HandlerError::Failed(format!("POST {}: {e}", self.url).into()))?;
            let status = response.status();
            if status.is_success() {
                Ok(Some(format!("HTTP {}", status.as_u16())))
            } else if status.is_client_error()
                && status != StatusCode::TOO_MANY_REQUESTS
                && status != StatusCode::REQUEST_TIMEOUT
            {
                Err(HandlerError::Rejected(format!(
                    "webhook refused the event: HTTP {status}"
                )))
            } else {
                Err(HandlerError::Failed(
                    format!("webhook answered HTTP {status}").into(),
                ))
            }
        })
    }
}
