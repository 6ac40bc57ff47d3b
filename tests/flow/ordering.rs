//! An ordered consumer (`Registry::ordered`) handles a key's messages in
//! the order they were published: a `release` right after its `reserve`
//! is never handled first, though the `reserve` takes longer and the
//! consumer's configured concurrency, and a second instance of it, would
//! let both run at once, and though one `reserve` fails at first and comes
//! back after its nak delay.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use service::handler;
use service::{ConsumerName, Executor, HandlerError, Inbox, Registry};
use worker::{Consumer, ConsumerConfig};

use crate::helpers::ledger_stream;
use crate::support::domain::{LEDGER_STREAM, RECORD_SUBJECT};
use crate::support::nats::NatsServer;
use crate::support::{Backend, TestDb, wait_until};

const KEYS: usize = 10;
/// The key whose `reserve` fails at its first delivery.
const FAILS_ONCE: &str = "3";

/// What the handler saw: the keys reserved, the releases handled before
/// their reserve, and how many messages it finished.
#[derive(Default)]
struct Seen {
    reserved: HashSet<String>,
    early_releases: Vec<String>,
    handled: usize,
    failed_once: bool,
}

/// Publishes `reserve` then `release` for each key, back to back.
async fn publish_pairs(js: &jetstream::Context) {
    for key in 0..KEYS {
        for step in ["reserve", "release"] {
            let msg = PublishMessage::build()
                .payload(format!("{step} {key}").into_bytes().into())
                .message_id(format!("{step}-{key}"));
            js.send_publish(RECORD_SUBJECT, msg)
                .await
                .unwrap()
                .await
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ordered_consumer_never_handles_a_release_before_its_reserve() {
    let t = TestDb::new(Backend::Sqlite).await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    worker::ensure_stream(&js, &ledger_stream(Duration::from_secs(120)))
        .await
        .unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stock = handler({
        let seen = seen.clone();
        move |ctx| -> BoxFuture<'_, Result<(), HandlerError>> {
            let text = String::from_utf8_lossy(&ctx.envelope().payload).into_owned();
            let seen = seen.clone();
            Box::pin(async move {
                let (step, key) = text.split_once(' ').unwrap_or(("", ""));
                if step == "reserve" {
                    // Slower than its release: unordered, the release
                    // delivered beside it finishes first.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let mut seen = seen.lock().unwrap();
                if step == "reserve" && key == FAILS_ONCE && !seen.failed_once {
                    // Its nak delay must hold its release back too.
                    seen.failed_once = true;
                    return Err(HandlerError::Failed("stock service busy".into()));
                }
                match step {
                    "reserve" => {
                        seen.reserved.insert(key.to_owned());
                    }
                    _ if !seen.reserved.contains(key) => seen.early_releases.push(key.to_owned()),
                    _ => {}
                }
                seen.handled += 1;
                Ok(())
            })
        }
    });
    let registry = Registry::new()
        .register_handler(ConsumerName::parse("stock").unwrap(), RECORD_SUBJECT, stock)
        .ordered();
    // Two instances of the consumer, as two processes would run it.
    let cancel = CancellationToken::new();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let consumer = Consumer::new(
            Inbox::new(Executor::new(t.db.clone())),
            js.clone(),
            registry.registrations()[0].clone(),
            ConsumerConfig {
                concurrency: 16,
                nak_base: Duration::from_millis(300),
                nak_max: Duration::from_millis(300),
                ..ConsumerConfig::new(LEDGER_STREAM)
            },
        );
        let cancel = cancel.clone();
        tasks.push(tokio::spawn(
            async move { consumer.run(cancel).await.unwrap() },
        ));
    }
    publish_pairs(&js).await;
    wait_until("every message handled", Duration::from_secs(60), || async {
        seen.lock().unwrap().handled >= 2 * KEYS
    })
    .await;
    cancel.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.handled, 2 * KEYS);
    assert!(seen.failed_once, "one reserve failed and came back");
    assert!(
        seen.early_releases.is_empty(),
        "released before reserved: {:?}",
        seen.early_releases
    );
}
