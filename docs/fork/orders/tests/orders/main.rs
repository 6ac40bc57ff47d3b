//! End to end through the `seawall` binary: `orders.placed` in, an order row
//! and one `orders.accepted` event out, a redelivered copy applied once.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};
use futures::StreamExt;
use sea_orm::{EntityTrait, PaginatorTrait};

use entity::orders;
use service::orders::{ACCEPTED_SUBJECT, ORDERS_STREAM, PLACED_SUBJECT};
use support::nats::NatsServer;
use support::{Backend, TestDb, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_placed_order_is_accepted_once() {
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
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let js = jetstream::new(client.clone());
    wait_until("the ORDERS stream", Duration::from_secs(30), || {
        let js = js.clone();
        async move { js.get_stream(ORDERS_STREAM).await.is_ok() }
    })
    .await;
    // The same message twice: JetStream drops the copy inside its window; a
    // copy after it (or a redelivery) would meet the inbox marker.
    for _ in 0..2 {
        let msg = PublishMessage::build()
            .payload(r#"{"order_id":"o-1","amount":1250}"#.into())
            .message_id("placed-o-1");
        js.send_publish(PLACED_SUBJECT, msg)
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let event = tokio::time::timeout(Duration::from_secs(30), accepted.next())
        .await
        .expect("orders.accepted within 30 s")
        .unwrap();
    assert_eq!(&event.payload[..], br#"{"order_id":"o-1"}"#);
    assert_eq!(orders::Entity::find().count(&t.db).await.unwrap(), 1);
}
