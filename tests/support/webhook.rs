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
        let inner = Arc::new(Inner {
            delay,
            status,
            ..Inner::default()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
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

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
