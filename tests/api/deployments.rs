//! The deployments `prometheus.rs` runs side by side, and the steps its
//! runbooks take: each deployment's environment and processes, traffic,
//! admin calls, and the faults a test injects into a database.

use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use serde_json::Value;

use crate::prometheus_server::Prometheus;
use crate::support::domain::{EntryRequest, RECORD_SUBJECT};
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::webhook::WebhookServer;
use crate::support::{TestDb, http_client, wait_until};

/// The deployments, as their targets' `namespace` label names them.
pub(crate) const ORDERS: &str = "orders";
pub(crate) const BILLING: &str = "billing";
pub(crate) const INGEST: &str = "ingest";

/// The environment shared by a deployment's processes.
pub(crate) fn env(
    t: &TestDb,
    nats: &NatsServer,
    hook: &WebhookServer,
    extra: &[(&'static str, String)],
) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("SEAWALL_DATABASE_URL", t.url.clone()),
        ("SEAWALL_NATS_URL", nats.url()),
        ("SEAWALL_RELAY_POLL_MS", "100".to_owned()),
        // A row the stream refuses dies at its first failed attempt.
        ("SEAWALL_RELAY_MAX_ATTEMPTS", "1".to_owned()),
        // Recorded events are POSTed to a webhook through claims; a claim
        // whose lease runs out is quarantined at once, by a sweeper that
        // looks every half second.
        ("TESTBED_WEBHOOK_URL", hook.url.clone()),
        ("SEAWALL_CLAIM_MAX_ATTEMPTS", "1".to_owned()),
        ("SEAWALL_SWEEP_INTERVAL_MS", "500".to_owned()),
        // Deliveries enough for a failing message to stay undead while a
        // fault lasts (the kit's naks come within 2 s).
        ("SEAWALL_MAX_DELIVER", "30".to_owned()),
    ];
    env.extend_from_slice(extra);
    env
}

pub(crate) fn spawn(
    role: &str,
    env: &[(&'static str, String)],
    listen: (&'static str, u16),
) -> Seawall {
    let mut env = env.to_vec();
    env.push((listen.0, format!("127.0.0.1:{}", listen.1)));
    Seawall::spawn(&[role], &env)
}

pub(crate) async fn publish(js: &jetstream::Context, id: &str, payload: &[u8]) {
    let msg = PublishMessage::build()
        .payload(payload.to_vec().into())
        .message_id(id);
    js.send_publish(RECORD_SUBJECT, msg)
        .await
        .unwrap()
        .await
        .unwrap();
}

pub(crate) async fn publish_credits(js: &jetstream::Context, prefix: &str, n: usize) {
    for i in 0..n {
        // An account each, so handlers never wait for one another.
        let payload = format!(r#"{{"account_id":"{prefix}-{i}","amount":1}}"#);
        publish(js, &format!("{prefix}-{i}"), payload.as_bytes()).await;
    }
}

/// Waits until the Prometheus sum of the orders deployment's processed
/// deliveries reaches `n`.
pub(crate) async fn wait_processed(prom: &Prometheus, n: usize) {
    let processed = format!(
        r#"sum(seawall_consumer_messages_total{{namespace="{ORDERS}",consumer="ledger",outcome="processed"}})"#
    );
    wait_until(
        "deliveries processed, as scraped",
        Duration::from_secs(60),
        || async {
            prom.query(&processed)
                .await
                .first()
                .and_then(|s| s["value"][1].as_str()?.parse::<f64>().ok())
                .is_some_and(|v| v >= n as f64)
        },
    )
    .await;
}

pub(crate) async fn admin(method: reqwest::Method, base: &str, path: &str) -> Value {
    let resp = http_client()
        .request(method, format!("{base}{path}"))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{path}: {}", resp.status());
    resp.json().await.unwrap_or(Value::Null)
}

/// The first dead letter not replayed yet, as the runbooks list them;
/// asserts it is `message_id`'s.
pub(crate) async fn first_open_letter(base: &str, message_id: &str) -> Value {
    let letters = admin(
        reqwest::Method::GET,
        base,
        "/api/v1/dead-letters?replayed=false",
    )
    .await;
    let letter = letters["items"][0].clone();
    assert_eq!(letter["message_id"], message_id, "{letters}");
    letter
}

/// A trigger that fails every ledger entry with a serialization failure
/// (40001), which the executor retries as contention.
pub(crate) const CONFLICT_TRIGGER: &str = "
CREATE FUNCTION prom_conflict() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001'; END $$;
CREATE TRIGGER prom_conflict BEFORE INSERT ON ledger_entry
FOR EACH ROW EXECUTE FUNCTION prom_conflict();";

/// A ledger request crediting 1 to `account`.
pub(crate) fn credit_payload(account: &str) -> Vec<u8> {
    serde_json::to_vec(&EntryRequest {
        account_id: account.into(),
        amount: 1,
        reference: None,
    })
    .unwrap()
}

/// The runbook's step for a stalled consumer on PostgreSQL: the sessions
/// that block others (`pg_blocking_pids`), ended with
/// `pg_terminate_backend`. Returns how many were ended.
pub(crate) async fn blocking_sessions_ended(db: &DatabaseConnection) -> usize {
    let sql = "SELECT pg_terminate_backend(b.pid) AS ended FROM pg_stat_activity b \
               WHERE b.pid IN (SELECT unnest(pg_blocking_pids(w.pid)) FROM pg_stat_activity w \
               WHERE w.datname = current_database())";
    wait_until("a blocked handler", Duration::from_secs(30), || async {
        let rows = db
            .query_all_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                "SELECT 1 FROM pg_stat_activity w WHERE w.datname = current_database() \
                 AND cardinality(pg_blocking_pids(w.pid)) > 0",
            ))
            .await
            .unwrap();
        !rows.is_empty()
    })
    .await;
    db.query_all_raw(sea_orm::Statement::from_string(
        sea_orm::DbBackend::Postgres,
        sql,
    ))
    .await
    .unwrap()
    .len()
}
