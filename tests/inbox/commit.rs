//! A connection lost right after `COMMIT` was sent: the server committed, the
//! client never heard. An inbox unit is re-run and meets its own marker; any
//! other unit must not be re-run, and reports the unknown outcome instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use futures::future::BoxFuture;
use sea_orm::EntityTrait;

use crate::support::domain::{Balance, Entry};
use crate::support::domain::{LEDGER_CONSUMER, LedgerHandler, add};
use service::executor::unit;
use service::{ConsumerName, Executor, HandlerError, Inbox, Outcome};

use crate::support::proxy::{Proxy, upstream_of};
use crate::support::{Backend, TestDb, connect, entry_envelope};

/// A fresh PostgreSQL database and a pool that reaches it through a proxy.
async fn behind_a_proxy() -> (TestDb, Proxy, sea_orm::DatabaseConnection) {
    let t = TestDb::new(Backend::Postgres).await;
    let upstream = upstream_of(&t.url);
    let proxy = Proxy::start(upstream).await;
    let db = connect(&proxy.url_for(&t.url, upstream), 4).await;
    (t, proxy, db)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_inbox_unit_whose_commit_reply_is_lost_is_applied_once() {
    let (t, proxy, db) = behind_a_proxy().await;
    let inbox = Inbox::new(Executor::new(db));
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let envelope = entry_envelope("lost-commit-1", "acct", 5, None);
    proxy.drop_next_commit();
    let outcome = inbox
        .process(&envelope, &consumer, &LedgerHandler::default())
        .await
        .unwrap();
    assert_eq!(proxy.commits_dropped(), 1, "the COMMIT was cut");
    assert!(matches!(
        outcome,
        Outcome::Processed(_) | Outcome::Duplicate
    ));
    assert_eq!(Entry::find().all(&t.db).await.unwrap().len(), 1);
    let account = Balance::find_by_id("acct".to_owned())
        .one(&t.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(account.balance, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bare_unit_whose_commit_reply_is_lost_reports_an_unknown_outcome_and_runs_once() {
    let (t, proxy, db) = behind_a_proxy().await;
    add(&t.db, "acct", 0).await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let counter = runs.clone();
    let work = unit(move |txn| -> BoxFuture<'_, Result<(), HandlerError>> {
        let counter = counter.clone();
        Box::pin(async move {
            counter.fetch_add(1, Ordering::SeqCst);
            add(txn, "acct", 7).await?;
            Ok(())
        })
    });
    proxy.drop_next_commit();
    let err = Executor::new(db).run(&work).await.unwrap_err();
    assert!(matches!(err, HandlerError::CommitUnknown(_)), "{err}");
    assert!(err.to_string().contains("commit outcome unknown"), "{err}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not run again");
    let account = Balance::find_by_id("acct".to_owned())
        .one(&t.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(account.balance, 7, "committed once, by the server");
}
