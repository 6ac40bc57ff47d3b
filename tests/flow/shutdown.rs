//! Graceful shutdown with messages in flight.

use std::time::Duration;

use crate::support::domain::Entry;
use entity::prelude::*;

use crate::helpers::{env, publish_entries, req, with_ledger_stream};
use crate::support::process::Seawall;
use crate::support::{Backend, wait_until};

/// On SIGTERM the consumer stops fetching, finishes and acks what it holds and
/// exits 0: afterwards every committed message is acknowledged and every
/// acknowledged message is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_finishes_and_acks_messages_in_flight() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    let cfg = [
        ("TESTBED_WORK_MS", "300"),
        ("SEAWALL_CONSUMER_CONCURRENCY", "4"),
    ];
    let mut consume = Seawall::spawn(&["consume"], &env(&t.url, &nats.url(), &cfg));
    let msgs: Vec<_> = (0..40)
        .map(|i| (format!("inflight-{i}"), req(&format!("a{i}"), 1)))
        .collect();
    publish_entries(&js, &msgs).await;
    wait_until(
        "some messages to be committed",
        Duration::from_secs(30),
        || async { t.count(Entry).await >= 4 },
    )
    .await;

    let status = consume.terminate().await;
    assert!(
        status.success(),
        "exit status {status:?}\n{}",
        consume.log_text()
    );
    consume.assert_no_panic();

    let committed = t.count(InboxMessage).await;
    assert!(
        committed < 40,
        "shutdown happened with work left ({committed} committed)"
    );
    let mut consumer = js
        .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
            "ledger", "LEDGER",
        )
        .await
        .unwrap();
    let info = consumer.info().await.unwrap();
    let acked = info.delivered.consumer_sequence - info.num_ack_pending as u64;
    assert_eq!(
        acked, committed,
        "acked messages == committed messages (delivered {}, pending ack {})",
        info.delivered.consumer_sequence, info.num_ack_pending
    );
}
