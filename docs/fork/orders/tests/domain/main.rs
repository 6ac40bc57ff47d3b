//! End to end through the service's binary (named after its package),
//! which the test kit's `spawn_app` starts on a database and a nats-server
//! of the test's own: `place-order` publishes an order; it becomes an order row and an
//! `orders.accepted` event, which the `shipping` consumer POSTs to the
//! shipping service once. The same message delivered again (after the
//! broker's duplicate window) is acknowledged as a duplicate and changes
//! nothing. Without its required setting the service does not start.

use testkit as support;

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, message::PublishMessage};
use futures::StreamExt;
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};

use entity::domain::orders;
use entity::{inbox_message, outbox_message};
use service::domain::orders::{
    ACCEPTED_SUBJECT, ORDERS_CONSUMER, ORDERS_STREAM, PLACED_SUBJECT, SHIPPING_CONSUMER,
};
use support::webhook::WebhookServer;
use support::{Backend, binary_output, fails_naming, spawn_app, wait_until};

/// Publishes the order with id `placed-o-1` directly; whether JetStream
/// took it as a duplicate of an earlier one inside its window.
async fn place(js: &jetstream::Context) -> bool {
    let msg = PublishMessage::build()
        .payload(r#"{"order_id":"o-1","amount":1250}"#.into())
        .message_id("placed-o-1");
    let ack = js.send_publish(PLACED_SUBJECT, msg).await.unwrap();
    ack.await.unwrap().duplicate
}

/// Whether the orders consumer has been handed `deliveries` messages.
async fn delivered(js: &jetstream::Context, deliveries: u64) -> bool {
    let Ok(stream) = js.get_stream(ORDERS_STREAM).await else {
        return false;
    };
    let Ok(mut consumer) = stream.get_consumer::<pull::Config>(ORDERS_CONSUMER).await else {
        return false;
    };
    consumer
        .info()
        .await
        .is_ok_and(|info| info.delivered.consumer_sequence >= deliveries)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_placed_order_is_accepted_and_shipped_once_even_when_delivered_twice() {
    let shipping = WebhookServer::start(Duration::ZERO, 200).await;
    // A one-second duplicate window, so the test can deliver the same
    // message again past it (the window must cover lease + retry).
    let app = spawn_app(
        env!("CARGO_PKG_NAME"),
        Backend::Sqlite,
        &[
            ("SEAWALL_ORDERS_SHIPPING_URL", &shipping.url),
            ("SEAWALL_DUPLICATE_WINDOW_MS", "1000"),
            ("SEAWALL_RELAY_LEASE_MS", "400"),
            ("SEAWALL_RELAY_RETRY_MAX_MS", "500"),
        ],
    )
    .await;
    let client = async_nats::connect(app.nats.url()).await.unwrap();
    let mut accepted = client.subscribe(ACCEPTED_SUBJECT).await.unwrap();
    client.flush().await.unwrap();

    // The service's own command places the order.
    let env = [
        ("SEAWALL_NATS_URL", app.nats.url()),
        ("SEAWALL_ORDERS_SHIPPING_URL", shipping.url.clone()),
    ];
    let out = tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        binary_output(
            env!("CARGO_PKG_NAME"),
            &["place-order", "--order-id", "o-1", "--amount", "1250"],
            &env,
        )
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "stored");
    let event = tokio::time::timeout(Duration::from_secs(30), accepted.next())
        .await
        .expect("orders.accepted within 30 s")
        .unwrap();
    assert_eq!(&event.payload[..], br#"{"order_id":"o-1"}"#);

    // The same message again, once the broker no longer drops it: only the
    // inbox stands between it and a second order and a second shipment.
    let js = &app.js;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while place(js).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the window never passed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_until("the second delivery taken", Duration::from_secs(30), || {
        delivered(js, 2)
    })
    .await;
    app.drain(ORDERS_STREAM, &[ORDERS_CONSUMER, SHIPPING_CONSUMER])
        .await;
    let db = &app.db.db;
    assert_eq!(orders::Entity::find().count(db).await.unwrap(), 1);
    let markers = inbox_message::Entity::find()
        .filter(inbox_message::Column::Consumer.eq(ORDERS_CONSUMER))
        .count(db)
        .await
        .unwrap();
    assert_eq!(markers, 1);
    assert_eq!(outbox_message::Entity::find().count(db).await.unwrap(), 1);
    assert_eq!(shipping.total_calls(), 1, "{:?}", shipping.calls());
}

/// The shipping URL is required: every command stops at start-up and names
/// the key.
#[test]
fn the_service_does_not_start_without_its_shipping_url() {
    let out = binary_output(
        env!("CARGO_PKG_NAME"),
        &["migrate"],
        &[("SEAWALL_DATABASE_URL", "sqlite::memory:")],
    );
    fails_naming(&out, "orders_shipping_url");
}
