//! The executor re-runs the whole unit after a real transient error.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use futures::future::BoxFuture;
use sea_orm::{EntityTrait, IsolationLevel, SqliteTransactionMode};

use crate::support::domain::add;
use crate::support::domain::{Balance, Entry};
use service::executor::unit;
use service::{Executor, HandlerError, RetryPolicy};

use crate::on_backends;
use crate::support::{Backend, TestDb};

/// The first attempt reads the account (taking its snapshot), another
/// connection then commits a change to the same row, and the attempt's own
/// update fails: PostgreSQL reports a serialization failure (40001) under
/// REPEATABLE READ, SQLite reports SQLITE_BUSY_SNAPSHOT for a deferred
/// transaction whose snapshot went stale. Both are real engine errors.
async fn a_transient_error_reruns_the_whole_unit_once_more(backend: Backend) {
    let t = TestDb::new(backend).await;
    add(&t.db, "hot", 0).await.unwrap();
    let other = t.second_pool().await;
    let executor = Executor::new(t.db.clone())
        .with_isolation(IsolationLevel::RepeatableRead)
        .with_sqlite_mode(SqliteTransactionMode::Deferred)
        .with_policy(RetryPolicy {
            max_attempts: 3,
            ..RetryPolicy::default()
        });
    let attempts = Arc::new(AtomicU32::new(0));
    let counter = attempts.clone();
    let work = unit(move |txn| -> BoxFuture<'_, Result<i64, HandlerError>> {
        let (counter, other) = (counter.clone(), other.clone());
        Box::pin(async move {
            let attempt = counter.fetch_add(1, Ordering::SeqCst) + 1;
            Balance::find_by_id("hot".to_owned()).one(txn).await?;
            if attempt == 1 {
                add(&other, "hot", 1).await?;
            }
            Ok(add(txn, "hot", 100).await?)
        })
    });
    let balance = executor.run(&work).await.unwrap();
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "one failed attempt, one retry"
    );
    assert_eq!(
        balance, 101,
        "the effect was applied once, on top of the concurrent change"
    );
}
on_backends!(a_transient_error_reruns_the_whole_unit_once_more: sqlite, postgres);

/// Non-transient errors are not retried.
async fn a_permanent_error_is_not_retried(backend: Backend) {
    let t = TestDb::new(backend).await;
    let attempts = Arc::new(AtomicU32::new(0));
    let counter = attempts.clone();
    let work = unit(move |txn| -> BoxFuture<'_, Result<(), HandlerError>> {
        let counter = counter.clone();
        Box::pin(async move {
            counter.fetch_add(1, Ordering::SeqCst);
            for _ in 0..2 {
                add(txn, "a", 1).await?;
                sea_orm::ConnectionTrait::execute_unprepared(
                    txn,
                    "INSERT INTO credit (message_id, account_id, amount, reference, created_at) VALUES ('m', 'a', 1, 'dup', '2026-01-01T00:00:00+00:00')",
                )
                .await?;
            }
            Ok(())
        })
    });
    let err = Executor::new(t.db.clone()).run(&work).await.unwrap_err();
    assert!(matches!(err, HandlerError::Database(_)));
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert_eq!(t.count(Entry).await, 0);
}
on_backends!(a_permanent_error_is_not_retried: sqlite, postgres);
