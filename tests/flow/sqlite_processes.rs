//! SQLite shared by several processes at once (WAL journal, busy timeout):
//! three consumers on one file, every message published twice under
//! CloudEvents ids (no `Nats-Msg-Id`, so JetStream stores both copies and
//! hands them to different processes at the same moment).

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::pull, message::PublishMessage};
use sea_orm::{EntityTrait, PaginatorTrait};

use entity::prelude::{DeadLetter, InboxMessage};

use crate::helpers::{env, ledger_nats, req};
use crate::support::domain::{Entry, LEDGER_CONSUMER, LEDGER_STREAM, RECORD_SUBJECT};
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, wait_until};

const MESSAGES: usize = 300;

/// Publishes `MESSAGES` credits of 1, each twice in a row.
async fn publish_twice(js: &jetstream::Context) {
    let mut acks = Vec::new();
    for i in 0..MESSAGES {
        let mut headers = HeaderMap::new();
        headers.insert("ce-source", "sqlite-processes");
        headers.insert("ce-id", i.to_string().as_str());
        let payload = serde_json::to_vec(&req(&format!("acct-{}", i % 5), 1)).unwrap();
        for _ in 0..2 {
            let msg = PublishMessage::build()
                .payload(payload.clone().into())
                .headers(headers.clone());
            acks.push(js.send_publish(RECORD_SUBJECT, msg).await.unwrap());
        }
    }
    for ack in acks {
        ack.await.unwrap();
    }
}

/// Whether the ledger's durable consumer has every message delivered and
/// acknowledged.
async fn settled(js: &jetstream::Context) -> bool {
    let Ok(stream) = js.get_stream(LEDGER_STREAM).await else {
        return false;
    };
    let Ok(mut consumer) = stream.get_consumer::<pull::Config>(LEDGER_CONSUMER).await else {
        return false;
    };
    consumer
        .info()
        .await
        .is_ok_and(|info| info.num_pending == 0 && info.num_ack_pending == 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_share_one_sqlite_file_and_apply_each_message_once() {
    let t = TestDb::new(Backend::Sqlite).await;
    let (nats, js) = ledger_nats().await;
    let settings = env(
        &t.url,
        &nats.url(),
        &[("SEAWALL_CONSUMER_CONCURRENCY", "8")],
    );
    let processes: Vec<Seawall> = (0..3)
        .map(|_| Seawall::spawn(&["consume"], &settings))
        .collect();
    for p in &processes {
        wait_until("the consumer running", Duration::from_secs(60), || async {
            p.log_text().contains("seawall is running")
        })
        .await;
    }
    publish_twice(&js).await;
    wait_until("every copy settled", Duration::from_secs(120), || async {
        Entry::find().count(&t.db).await.unwrap() >= MESSAGES as u64 && settled(&js).await
    })
    .await;
    assert_eq!(Entry::find().count(&t.db).await.unwrap(), MESSAGES as u64);
    assert_eq!(
        InboxMessage::find().count(&t.db).await.unwrap(),
        MESSAGES as u64
    );
    assert_eq!(DeadLetter::find().count(&t.db).await.unwrap(), 0);
    for p in processes {
        p.assert_no_panic();
    }
}
