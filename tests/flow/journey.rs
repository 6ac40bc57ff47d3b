//! A message's journey through the admin API: a ledger entry that emits
//! `ledger.recorded`, which the `hook` consumer POSTs to a webhook, shows the
//! whole chain; a malformed message shows where and why it stopped.

use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};

use crate::on_backends;
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::webhook::WebhookServer;
use crate::support::{Backend, TestDb, http_client, wait_until};

async fn get(url: &str) -> (u16, serde_json::Value) {
    match http_client().get(url).send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            (status, resp.json().await.unwrap_or_default())
        }
        Err(_) => (0, serde_json::Value::Null),
    }
}

fn state_of(markers: &serde_json::Value, consumer: &str) -> Option<String> {
    markers
        .as_array()?
        .iter()
        .find(|m| m["consumer"] == consumer)
        .map(|m| m["state"].as_str().unwrap_or_default().to_owned())
}

async fn a_message_journey_shows_the_chain_and_where_it_stopped(backend: Backend) {
    let t = TestDb::new(backend).await;
    let nats = NatsServer::start().await;
    let hook = WebhookServer::start(Duration::ZERO, 200).await;
    let port = crate::support::free_port();
    let mut seawall = Seawall::spawn(
        &["run"],
        &[
            ("SEAWALL_DATABASE_URL", t.url.clone()),
            ("SEAWALL_NATS_URL", nats.url()),
            ("SEAWALL_API_ADDR", format!("127.0.0.1:{port}")),
            ("SEAWALL_RELAY_POLL_MS", "100".to_owned()),
            ("TESTBED_WEBHOOK_URL", hook.url.clone()),
        ],
    );
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    crate::support::wait_for_stream(&js, "LEDGER").await;
    for (id, payload) in [
        ("journey-1", &br#"{"account_id":"a","amount":5}"#[..]),
        ("journey-bad", &b"{not json"[..]),
    ] {
        let msg = PublishMessage::build()
            .payload(payload.to_vec().into())
            .message_id(id);
        js.send_publish("ledger.record", msg)
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let base = format!("http://127.0.0.1:{port}/api/v1");
    let url = format!("{base}/messages/journey-1");
    wait_until(
        "the hook consumer's marker on the journey",
        Duration::from_secs(60),
        || async {
            let (_, journey) = get(&url).await;
            state_of(&journey["caused"][0]["markers"], "hook").as_deref() == Some("processed")
        },
    )
    .await;
    let (status, journey) = get(&url).await;
    assert_eq!(status, 200, "{journey}");
    let message = &journey["message"];
    assert_eq!(
        state_of(&message["markers"], "ledger").as_deref(),
        Some("processed")
    );
    assert_eq!(message["dead_letters"], serde_json::json!([]));
    let caused = journey["caused"].as_array().unwrap();
    assert_eq!(caused.len(), 1, "{journey}");
    let event = &caused[0];
    assert_eq!(event["event"]["subject"], "ledger.recorded");
    assert_eq!(event["event"]["status"], "published");
    assert_eq!(event["caused_by"]["message_id"], "journey-1");
    assert_eq!(event["caused_by"]["consumer"], "ledger");
    assert_eq!(event["correlation_id"], "journey-1");
    assert_eq!(hook.total_calls(), 1);

    // The conversation: the request and the event it caused.
    let (status, correlation) = get(&format!("{base}/correlations/journey-1")).await;
    assert_eq!(status, 200, "{correlation}");
    let ids: Vec<&str> = correlation["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["message_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{correlation}");
    assert_eq!(ids[0], "journey-1");

    // Where the malformed one stopped, and why.
    let bad_url = format!("{base}/messages/journey-bad");
    wait_until(
        "the dead letter on the journey",
        Duration::from_secs(60),
        || async { get(&bad_url).await.0 == 200 },
    )
    .await;
    let (_, bad) = get(&bad_url).await;
    let letter = &bad["message"]["dead_letters"][0];
    assert_eq!(letter["consumer"], "ledger");
    assert!(
        letter["error"]
            .as_str()
            .unwrap_or_default()
            .contains("malformed entry"),
        "{bad}"
    );
    assert_eq!(bad["caused"], serde_json::json!([]));
    assert_eq!(get(&format!("{base}/messages/never-seen")).await.0, 404);
    seawall.assert_no_panic();
    seawall.terminate().await;
}
on_backends!(a_message_journey_shows_the_chain_and_where_it_stopped: sqlite, postgres);
