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
                    let reason = format!("POST {}: {}", self.url, chain(&e));
                    if receiver_gone(&e) {
                        // The receiver is down, or went away under the
                        // call: no fault of the event.
                        HandlerError::Unavailable {
                            reason,
                            retry_after: None,
                        }
                    } else {
                        // Sent, perhaps received, no answer in time: an
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

/// Whether the call ended, before any answer, because the receiver was not
/// there to answer: the connection was refused or unreachable, or was
/// reset, aborted or closed under the request. A receiver that closes its
/// listening socket (stopping, restarting) resets the connections the
/// kernel had accepted for it and it never took: those calls fail with
/// `Connection reset by peer` while sending, after the connection was
/// made, and no request reached the receiver. One that goes away in the
/// middle of a request is down as well; the `Idempotency-Key` makes the
/// call safe to repeat either way. A timeout is not among them: the
/// receiver may be working on the event.
fn receiver_gone(e: &reqwest::Error) -> bool {
    if e.is_connect() {
        return true;
    }
    if e.is_timeout() || !e.is_request() {
        return false;
    }
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            )
        {
            return true;
        }
        if let Some(http) = err.downcast_ref::<hyper::Error>()
            && (http.is_incomplete_message() || http.is_canceled())
        {
            return true;
        }
        source = err.source();
    }
    false
}

/// `e` with its causes: reqwest's own text ("error sending request") does
/// not say what happened.
fn chain(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        let cause = err.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = err.source();
    }
    text
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    /// A receiver that takes one connection, reads the request's first
    /// bytes and hangs up: with a reset (`reset`), as a closing listener
    /// does to connections it never took, or with a plain close.
    async fn hanging_up(reset: bool) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 64];
            let _ = socket.read(&mut buf).await;
            if reset {
                socket.set_zero_linger().unwrap();
            }
            drop(socket);
        });
        url
    }

    async fn call(url: String) -> HandlerError {
        let envelope = Envelope::from_delivery(
            "ledger.recorded",
            BTreeMap::from([("Nats-Msg-Id".to_owned(), "m-1".to_owned())]),
            b"{}".to_vec(),
        )
        .unwrap();
        Webhook::new(url, None)
            .unwrap()
            .perform(&envelope, "m-1")
            .await
            .unwrap_err()
    }

    /// Without reading the error's causes, both were failures of the
    /// event, and a receiver restarting spent the deliveries of the events
    /// sent to it meanwhile.
    #[tokio::test]
    async fn a_receiver_that_hangs_up_before_answering_is_unavailable() {
        for reset in [true, false] {
            let err = call(hanging_up(reset).await).await;
            assert!(
                matches!(err, HandlerError::Unavailable { .. }),
                "reset: {reset}: {err:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_refused_connection_is_unavailable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        drop(listener);
        let err = call(url).await;
        assert!(matches!(err, HandlerError::Unavailable { .. }), "{err:?}");
    }
}
