//! On PostgreSQL the second insert of a marker waits for the first
//! transaction, and its fate follows that transaction's.

use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};

use crate::support::domain::Entry;
use crate::support::domain::{LEDGER_CONSUMER, LedgerHandler};
use entity::prelude::*;
use service::inbox::record_marker;
use service::{ConsumerName, Executor, Inbox, Outcome};

use crate::support::{Backend, TestDb, entry_envelope, wait_until};

async fn blocked_on_a_lock(t: &TestDb) -> bool {
    let row = t
        .db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap() > 0
}

async fn overlap(commit_first: bool) -> Option<Outcome<crate::support::domain::Recorded>> {
    let t = TestDb::new(Backend::Postgres).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let env = entry_envelope("overlap-1", "acct", 100, None);
    let a = t.second_pool().await;
    let txn = a.begin().await.unwrap();
    record_marker(&txn, &env, &consumer).await.unwrap();

    let b =
        Inbox::new(Executor::new(t.second_pool().await)).with_fast_path(service::FastPath::Never);
    let (env_b, consumer_b) = (env.clone(), consumer.clone());
    let task = tokio::spawn(async move {
        b.process(&env_b, &consumer_b, &LedgerHandler::default())
            .await
    });
    wait_until(
        "B to wait on A's marker",
        std::time::Duration::from_secs(10),
        || blocked_on_a_lock(&t),
    )
    .await;
    assert!(
        !task.is_finished(),
        "B must wait while A's marker is uncommitted"
    );

    if commit_first {
        txn.commit().await.unwrap();
    } else {
        txn.rollback().await.unwrap();
    }
    let outcome = task.await.unwrap().unwrap();
    assert_eq!(t.count(InboxMessage).await, 1);
    assert_eq!(t.count(Entry).await, u64::from(!commit_first));
    Some(outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_instance_processes_when_the_first_rolls_back() {
    let outcome = overlap(false).await.unwrap();
    assert!(matches!(outcome, Outcome::Processed(_)), "{outcome:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_instance_gets_duplicate_when_the_first_commits() {
    let outcome = overlap(true).await.unwrap();
    assert_eq!(outcome, Outcome::Duplicate);
}
