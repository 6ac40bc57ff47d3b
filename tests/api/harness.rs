//! An in-process admin API on a fresh database, and rows to look at.

use std::sync::Arc;

use chrono::{Duration, Utc};
use sea_orm::ActiveValue::{NotSet, Set};
use sea_orm::EntityTrait;
use tokio_util::sync::CancellationToken;

use entity::{dead_letter, inbox_message, outbox_message};

use crate::support::{Backend, TestDb};

pub const TOKEN: &str = "s3cret-token";

pub struct TestApi {
    pub t: TestDb,
    pub base: String,
    pub http: reqwest::Client,
    cancel: CancellationToken,
}

impl TestApi {
    pub async fn start(backend: Backend) -> Self {
        Self::start_with(backend, Some(TOKEN)).await
    }

    /// An API with the given token, or none (loopback-only mode).
    pub async fn start_with(backend: Backend, token: Option<&str>) -> Self {
        Self::start_on(TestDb::new(backend).await, token, None).await
    }

    /// An API on `t`, reading from `reads` when given (a replica).
    pub async fn start_on(
        t: TestDb,
        token: Option<&str>,
        reads: Option<sea_orm::DatabaseConnection>,
    ) -> Self {
        let state = api::AppState {
            db: t.db.clone(),
            reads,
            nats: None,
            jetstream: None,
            relay_wake: None,
            metrics: Some(
                metrics_exporter_prometheus::PrometheusBuilder::new()
                    .build_recorder()
                    .handle(),
            ),
            stats: Default::default(),
            checks: Vec::new(),
            config: Arc::new(api::ApiConfig {
                tokens: token.map(api::auth::Token::admin).into_iter().collect(),
                prune: Some(service::retention::PruneConfig {
                    inbox: Some(std::time::Duration::from_secs(3600)),
                    outbox: std::time::Duration::from_secs(3600),
                    batch_size: 100,
                }),
                // Every call reads afresh: the tests assert what they just did.
                stats_max_age: std::time::Duration::ZERO,
                ..api::ApiConfig::default()
            }),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let cancel = CancellationToken::new();
        tokio::spawn(api::serve_listener(listener, state, cancel.clone()));
        Self {
            t,
            base,
            http: crate::support::http_client(),
            cancel,
        }
    }

    /// `/metrics` (no token needed): status and Prometheus text.
    pub async fn metrics(&self) -> (u16, String) {
        let resp = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap())
    }

    /// GET with the token; returns status and JSON.
    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    pub async fn post(
        &self,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut req = self.http.post(format!("{}{path}", self.base));
        if let Some(body) = body {
            req = req.json(&body);
        }
        self.send(req).await
    }

    pub async fn delete(&self, path: &str) -> (u16, serde_json::Value) {
        self.send(self.http.delete(format!("{}{path}", self.base)))
            .await
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> (u16, serde_json::Value) {
        let res = req.bearer_auth(TOKEN).send().await.unwrap();
        let status = res.status().as_u16();
        let text = res.text().await.unwrap();
        let json = if text.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
        };
        (status, json)
    }
}

impl Drop for TestApi {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// An outbox row in a given state, `age` old.
pub fn outbox_row(
    id: &str,
    subject: &str,
    status: &str,
    age: Duration,
) -> outbox_message::ActiveModel {
    let at = Utc::now() - age;
    outbox_message::ActiveModel {
        id: NotSet,
        message_id: Set(id.into()),
        subject: Set(subject.into()),
        payload: Set(format!("{{\"id\":\"{id}\"}}").into_bytes()),
        headers: Set(serde_json::json!({"traceparent": "00-abc-def-01"})),
        ordering_key: Set(None),
        created_at: Set(at),
        published_at: Set((status == "published").then_some(at)),
        attempts: Set(if status == "dead" { 10 } else { 0 }),
        last_error: Set((status == "dead").then(|| "no stream for subject".to_owned())),
        next_attempt_at: Set(at),
        locked_by: Set(None),
        locked_until: Set(None),
        dead_at: Set((status == "dead").then_some(at)),
        causation_id: Set(None),
        causation_consumer: Set(None),
        correlation_id: Set(None),
    }
}

/// An inbox marker in a given state.
pub fn marker(id: &str, consumer: &str, state: &str) -> inbox_message::ActiveModel {
    let now = Utc::now();
    let processed = state == "processed";
    inbox_message::ActiveModel {
        id: NotSet,
        message_id: Set(id.into()),
        consumer: Set(consumer.into()),
        received_at: Set(now),
        processed_at: Set(processed.then_some(now)),
        claimed_by: Set((!processed).then(|| "worker-1".to_owned())),
        claimed_at: Set((!processed).then_some(now)),
        lease_until: Set(match state {
            "claimed" => Some(now + Duration::minutes(5)),
            "expired_claim" => Some(now - Duration::minutes(5)),
            _ => None,
        }),
        attempts: Set(1),
        result: Set(None),
        quarantined_at: Set((state == "quarantined").then_some(now)),
        subject: Set(None),
        payload: Set(None),
    }
}

/// A dead letter.
pub fn dead(consumer: &str, message_id: Option<&str>) -> dead_letter::ActiveModel {
    dead_letter::ActiveModel {
        id: NotSet,
        consumer: Set(consumer.into()),
        message_id: Set(message_id.map(Into::into)),
        subject: Set("ledger.record".into()),
        payload: Set(br#"{"account_id":"a","amount":5}"#.to_vec()),
        headers: Set(serde_json::json!({})),
        error: Set("malformed entry".into()),
        deliveries: Set(1),
        created_at: Set(Utc::now()),
        replayed_at: Set(None),
    }
}

pub async fn insert_outbox(api: &TestApi, rows: Vec<outbox_message::ActiveModel>) {
    outbox_message::Entity::insert_many(rows)
        .exec_without_returning(&api.t.db)
        .await
        .unwrap();
}
