//! End to end through the `seawall` binary: `orders.placed` in, an order row
//! and an `orders.accepted` event out; the same message delivered again
//! (after the broker's duplicate window) is acknowledged as a duplicate and
//! changes nothing.

use testkit as support;

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, message::PublishMessage};
use futures::StreamExt;
use sea_orm::{EntityTrait, PaginatorTrait};

use entity::domain::orders;
use entity::{inbox_message, outbox_message};
use service::domain::orders::{ACCEPTED_SUBJECT, ORDERS_CONSUMER, ORDERS_STREAM, PLACED_SUBJECT};
use support::nats::NatsServer;
use support::{Backend, TestDb, wait_until};

/// Publishes the order with id `placed-o-1`; whether JetStream took it as a
/// duplicate of an earlier one inside its window.
async fn place(js: &jetstream::Context) -> bool {
    let msg = PublishMessage::build()
        .payload(r#"{"order_id":"o-1","amount":1250}"#.into())
        .message_id("placed-o-1");
    let ack = js.send_publish(PLACED_SUBJECT, msg).await.unwrap();
    ack.await.unwrap().duplicate
}

/// Whether the orders consumer has taken `deliveries` messages and settled them.
async fn settled(js: &jetstream::Context, deliveries: u64) -> bool {
    let Ok(stream) = js.get_stream(ORDERS_STREAM).await else {
        return false;
    };
    let Ok(mut consumer) = stream.get_consumer::<pull::Config>(ORDERS_CONSUMER).await else {
        return false;
    };
    let Ok(info) = consumer.info().await else {
        return false;
    };
    info.num_pending == 0
        && info.num_ack_pending == 0
        && info.delivered.consumer_sequence >= deliveries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_placed_order_is_accepted_once_even_when_delivered_twice() {
    let t = TestDb::new(Backend::Sqlite).await;
    let nats = NatsServer::start().await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut accepted = client.subscribe(ACCEPTED_SUBJECT).await.unwrap();
    client.flush().await.unwrap();
    let _seawall = tokio::process::Command::new(env!("CARGO_BIN_EXE_seawall"))
        .arg("run")
        .env("SEAWALL_DATABASE_URL", &t.url)
        .env("SEAWALL_NATS_URL", nats.url())
        .env("SEAWALL_API_ADDR", "127.0.0.1:0")
        // A one-second duplicate window, so the test can deliver the same
        // message again past it (the window must cover lease + retry).
        .env("SEAWALL_DUPLICATE_WINDOW_MS", "1000")
        .env("SEAWALL_RELAY_LEASE_MS", "400")
        .env("SEAWALL_RELAY_RETRY_MAX_MS", "500")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let js = jetstream::new(client.clone());
    wait_until("the orders consumer", Duration::from_secs(30), || {
        settled(&js, 0)
    })
    .await;
    assert!(!place(&js).await);
    let event = tokio::time::timeout(Duration::from_secs(30), accepted.next())
        .await
        .expect("orders.accepted within 30 s")
        .unwrap();
    assert_eq!(&event.payload[..], br#"{"order_id":"o-1"}"#);

    // The same message again, once the broker no longer drops it: only the
    // inbox stands between it and a second order.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while place(&js).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the window never passed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_until(
        "the second delivery settled",
        Duration::from_secs(30),
        || settled(&js, 2),
    )
    .await;
    assert_eq!(orders::Entity::find().count(&t.db).await.unwrap(), 1);
    assert_eq!(inbox_message::Entity::find().count(&t.db).await.unwrap(), 1);
    assert_eq!(
        outbox_message::Entity::find().count(&t.db).await.unwrap(),
        1
    );
}
