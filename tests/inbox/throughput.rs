//! Per-minute throughput is counted by the transactions that do the work:
//! exactly what committed, never a duplicate or a rolled-back unit, and
//! without a counter that concurrent transactions wait on.

use std::sync::Arc;

use entity::prelude::*;
use sea_orm::{ConnectionTrait as _, EntityTrait as _, Statement, TransactionTrait as _};
use service::inbox::record_marker;
use service::{ConsumerName, Envelope, Executor, Inbox, Outcome};

use crate::on_backends;
use crate::support::domain::{LEDGER_CONSUMER, LedgerHandler};
use crate::support::{Backend, TestDb, charted, entry_envelope};

/// 40 messages processed by 8 concurrent workers, each delivered twice, plus
/// 5 rejected ones: the chart counts the 40 and nothing else.
async fn the_chart_counts_each_committed_message_once(backend: Backend) {
    let t = TestDb::new(backend).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let inbox = Arc::new(Inbox::new(Executor::new(t.db.clone())));
    let valid: Vec<Envelope> = (0..40)
        .map(|i| entry_envelope(&format!("tp-{i}"), &format!("acct-{}", i % 8), 5, None))
        .collect();
    let rejected: Vec<Envelope> = (0..5)
        .map(|i| entry_envelope(&format!("tp-bad-{i}"), "acct", -1, None))
        .collect();
    let deliveries: Vec<Envelope> = valid
        .iter()
        .chain(valid.iter())
        .chain(rejected.iter())
        .cloned()
        .collect();
    let mut workers = Vec::new();
    for chunk in deliveries.chunks(deliveries.len().div_ceil(8)) {
        let (inbox, consumer, chunk) = (inbox.clone(), consumer.clone(), chunk.to_vec());
        workers.push(tokio::spawn(async move {
            let handler = LedgerHandler::default();
            let mut processed = 0u64;
            for env in &chunk {
                if let Ok(Outcome::Processed(_)) = inbox.process(env, &consumer, &handler).await {
                    processed += 1;
                }
            }
            processed
        }));
    }
    let mut processed = 0;
    for w in workers {
        processed += w.await.unwrap();
    }
    assert_eq!(processed, 40, "each valid message applied once");
    assert_eq!(t.count(InboxMessage).await, 40);
    assert_eq!(charted(&t.db).await.1, 40);
}
on_backends!(the_chart_counts_each_committed_message_once: sqlite, postgres, mysql);

/// Two transactions that each record a marker do not wait on each other's
/// count: the second commits while the first is still open. A single
/// counter row per minute would make it wait for the first's commit (here:
/// fail on the lock timeout).
async fn open_transactions_do_not_share_a_counter(backend: Backend) {
    let t = TestDb::new(backend).await;
    let other = t.second_pool().await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let first = t.db.begin().await.unwrap();
    record_marker(&first, &entry_envelope("open-1", "a", 1, None), &consumer)
        .await
        .unwrap();
    let second = other.begin().await.unwrap();
    let lock_timeout = match backend {
        Backend::Postgres => "SET LOCAL lock_timeout = '3s'",
        _ => "SET SESSION innodb_lock_wait_timeout = 3",
    };
    second
        .execute_raw(Statement::from_string(
            t.db.get_database_backend(),
            lock_timeout,
        ))
        .await
        .unwrap();
    record_marker(&second, &entry_envelope("open-2", "a", 1, None), &consumer)
        .await
        .expect("the second transaction counts without waiting for the first");
    second.commit().await.unwrap();
    first.commit().await.unwrap();
    assert_eq!(charted(&t.db).await.1, 2);
    let sessions = ThroughputMinute::find().all(&t.db).await.unwrap();
    assert_eq!(
        sessions.len(),
        2,
        "one counter row per session: {sessions:?}"
    );
}
on_backends!(open_transactions_do_not_share_a_counter: postgres, mysql);
