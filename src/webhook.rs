//! An effect for two-phase claims: POST each event to a webhook with
//! `Idempotency-Key` = the event's message id, so the receiver can drop a
//! repeat after a crash. The demo's `notify` consumer registers it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::future::BoxFuture;
use reqwest::StatusCode;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use service::{Effect, Envelope, HandlerError};

/// POSTs events to one URL.
pub struct Webhook {
    client: reqwest::Client,
    url: String,
}

impl Webhook {
    /// A webhook with a 10 s request timeout. HTTPS trusts the public web
    /// roots and, when `ca_file` is given, the CA certificates in it (PEM):
    /// receivers inside a company often present certificates of its own CA.
    ///
    /// # Errors
    /// A CA file that cannot be read or holds no certificate, named with its
    /// configuration key; or a client that cannot be built.
    pub fn new(url: String, ca_file: Option<&Path>) -> Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .tls_backend_preconfigured(tls_config(ca_file)?)
            .build()
            .context("building the webhook's HTTP client")?;
        Ok(Self { client, url })
    }
}

/// rustls on the ring provider, with the web roots plus `ca_file`'s CAs.
fn tls_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_file {
        let key = || {
            format!(
                "configuration key `webhook_ca_file` (env SEAWALL_WEBHOOK_CA_FILE): {}",
                path.display()
            )
        };
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .with_context(key)?;
        if certs.is_empty() {
            bail!("{}: no PEM certificate in the file", key());
        }
        for cert in certs {
            roots.add(cert).with_context(key)?;
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS protocol versions")?
    .with_root_certificates(roots)
    .with_no_client_auth())
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
                .map_err(|e| {
                    let reason = format!("POST {}: {e}", self.url);
                    if e.is_connect() {
                        // Refused or unreachable before anything was sent:
                        // the receiver is down, which is no fault of the event.
                        HandlerError::Unavailable {
                            reason,
                            retry_after: None,
                        }
                    } else {
                        // Sent, perhaps received (a timeout, a reset): an
                        // attempt that counts.
                        HandlerError::Failed(reason.into())
                    }
                })?;
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
            } else if matches!(
                status,
                StatusCode::REQUEST_TIMEOUT
                    | StatusCode::TOO_MANY_REQUESTS
                    | StatusCode::BAD_GATEWAY
                    | StatusCode::SERVICE_UNAVAILABLE
                    | StatusCode::GATEWAY_TIMEOUT
            ) {
                // Overloaded, or down behind a proxy: try again later.
                Err(HandlerError::Unavailable {
                    reason: format!("webhook answered HTTP {status}"),
                    retry_after: retry_after(response.headers()),
                })
            } else {
                // A 500 or another answer: the receiver failed on this event.
                Err(HandlerError::Failed(
                    format!("webhook answered HTTP {status}").into(),
                ))
            }
        })
    }
}

/// A `Retry-After` given in seconds (the HTTP-date form is not honoured:
/// the consumer's own backoff applies then), at most an hour.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs.min(3600)))
}
