//! A small HTTP server standing in for a webhook receiver: it counts calls
//! per `Idempotency-Key`, and can be slow or failing on purpose.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;

#[derive(Default)]
struct Inner {
    calls: Mutex<HashMap<String, usize>>,
    delay: Duration,
    status: u16,
}

pub struct WebhookServer {
    inner: Arc<Inner>,
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

async fn receive(State(inner): State<Arc<Inner>>, headers: HeaderMap) -> StatusCode {
    let key = headers
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    *inner.calls.lock().unwrap().entry(key).or_default() += 1;
    tokio::time::sleep(inner.delay).await;
    StatusCode::from_u16(inner.status).unwrap()
}

impl WebhookServer {
    /// Answers `status` after `delay`.
    pub async fn start(delay: Duration, status: u16) -> Self {
        Self::start_on(0, delay, status).await
    }

    /// [`WebhookServer::start`] on a given port (0: any free one), so a
    /// test can let callers meet a receiver that is not up yet.
    pub async fn start_on(port: u16, delay: Duration, status: u16) -> Self {
        let inner = Arc::new(Inner {
            delay,
            status,
            ..Inner::default()
        });
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let app = Router::new()
            .route("/hook", post(receive))
            .with_state(inner.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { inner, url, task }
    }

    /// Answers 200 over HTTPS at `https://localhost:<port>/hook`, with a
    /// certificate from a CA generated here; writes that CA's certificate
    /// (PEM) to `ca_pem`.
    pub async fn start_tls(ca_pem: &std::path::Path) -> Self {
        let inner = Arc::new(Inner {
            status: 200,
            ..Inner::default()
        });
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://localhost:{}/hook",
            tcp.local_addr().unwrap().port()
        );
        let certs = crate::tls::TestCerts::generate();
        std::fs::write(ca_pem, &certs.ca_pem).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![certs.cert_der], certs.key_der)
        .unwrap();
        let listener = TlsListener {
            tcp,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        };
        let app = Router::new()
            .route("/hook", post(receive))
            .with_state(inner.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { inner, url, task }
    }

    /// Calls per idempotency key.
    pub fn calls(&self) -> HashMap<String, usize> {
        self.inner.calls.lock().unwrap().clone()
    }

    pub fn total_calls(&self) -> usize {
        self.calls().values().sum()
    }
}

/// TLS on top of a TCP listener, for `axum::serve`.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            // A client that rejects the certificate ends its handshake here.
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
