//! Races between instances on one message (rules 1, 2 and 4).

use std::sync::Arc;

use crate::support::domain::{Balance, Entry};
use crate::support::domain::{LEDGER_CONSUMER, LedgerHandler, entry};
use entity::prelude::*;
use sea_orm::{
    ActiveValue::Set, ColumnTrait as _, ConnectionTrait as _, EntityTrait as _, QueryFilter as _,
    TransactionTrait as _,
};
use service::{ConsumerName, Executor, Inbox, Outcome};
use tokio::sync::Barrier;

use crate::on_backends;
use crate::support::{Backend, TestDb, entry_envelope};

/// The harness can see the bug the inbox prevents.
async fn a_naive_check_then_insert_applies_a_credit_twice(backend: Backend) {
    let t = TestDb::new(backend).await;
    let (a_db, b_db) = (t.db.clone(), t.second_pool().await);
    let gate = Arc::new(Barrier::new(2));
    // "Have I recorded this message before?", then the insert, with no
    // unique index deciding: both instances check before either inserts.
    let naive = |db: sea_orm::DatabaseConnection, gate: Arc<Barrier>| async move {
        let seen = Entry::find()
            .filter(entry::Column::MessageId.eq("naive-1"))
            .one(&db)
            .await?
            .is_some();
        gate.wait().await;
        if seen {
            return Ok::<bool, sea_orm::DbErr>(false);
        }
        Entry::insert(entry::ActiveModel {
            message_id: Set("naive-1".into()),
            account_id: Set("acct".into()),
            amount: Set(100),
            reference: Set(None),
            created_at: Set(chrono::Utc::now()),
            ..Default::default()
        })
        .exec_without_returning(&db)
        .await?;
        Ok(true)
    };
    let (a, b) = tokio::join!(naive(a_db, gate.clone()), naive(b_db, gate));
    assert!(a.unwrap() && b.unwrap(), "both instances passed the check");
    assert_eq!(t.count(Entry).await, 2, "the entry was recorded twice");
}
on_backends!(a_naive_check_then_insert_applies_a_credit_twice: sqlite, postgres);

/// Two connections race `process`; exactly one applies the message.
async fn two_instances_racing_on_one_message_apply_it_once(backend: Backend) {
    let t = TestDb::new(backend).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    // The fast path is off so that the unique index alone must decide, and
    // the handler works for a while so the two transactions overlap.
    let a = Inbox::new(Executor::new(t.db.clone())).with_fast_path(service::FastPath::Never);
    let b =
        Inbox::new(Executor::new(t.second_pool().await)).with_fast_path(service::FastPath::Never);
    let handler = LedgerHandler {
        work: std::time::Duration::from_millis(20),
    };
    let rounds = 10;
    for i in 0..rounds {
        let env = entry_envelope(&format!("race-{i}"), "acct", 10, None);
        let (ra, rb) = tokio::join!(
            a.process(&env, &consumer, &handler),
            b.process(&env, &consumer, &handler)
        );
        let outcomes = [ra.unwrap(), rb.unwrap()];
        let processed = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Processed(_)))
            .count();
        let duplicates = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Duplicate))
            .count();
        assert_eq!(
            (processed, duplicates),
            (1, 1),
            "round {i}: one winner, one Duplicate"
        );
    }
    assert_eq!(t.count(Entry).await, rounds);
    assert_eq!(t.count(InboxMessage).await, rounds);
    assert_eq!(t.count(OutboxMessage).await, rounds);
    let account = Balance::find_by_id("acct".to_owned())
        .one(&t.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(account.balance, 10 * rounds as i64);
}
on_backends!(two_instances_racing_on_one_message_apply_it_once: sqlite, postgres, mysql);

/// A redelivery after the first copy committed is a Duplicate by the fast path.
async fn a_redelivered_message_is_applied_once(backend: Backend) {
    let t = TestDb::new(backend).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    let env = entry_envelope("redelivered", "acct", 10, None);
    let handler = LedgerHandler::default();
    assert!(matches!(
        inbox.process(&env, &consumer, &handler).await.unwrap(),
        Outcome::Processed(_)
    ));
    assert_eq!(
        inbox.process(&env, &consumer, &handler).await.unwrap(),
        Outcome::Duplicate
    );
    // Another consumer of the same message applies it independently (rule 2).
    let audit = ConsumerName::parse("audit").unwrap();
    assert!(matches!(
        inbox.process(&env, &audit, &handler).await.unwrap(),
        Outcome::Processed(_)
    ));
    assert_eq!(t.count(InboxMessage).await, 2);
}
on_backends!(a_redelivered_message_is_applied_once: sqlite, postgres);

/// With the default fast path a redelivery is answered by the look-up alone:
/// while another session holds a lock that blocks every insert into
/// `inbox_message` (but not reads), a redelivered duplicate still comes back
/// `Duplicate`, where the insert path would wait for the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_duplicate_is_answered_by_the_look_up() {
    let t = TestDb::new(Backend::Postgres).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    let handler = LedgerHandler::default();
    let env = entry_envelope("look-up", "acct", 10, None);
    assert!(matches!(
        inbox.process(&env, &consumer, &handler).await.unwrap(),
        Outcome::Processed(_)
    ));
    let locker = t.second_pool().await;
    let lock = locker.begin().await.unwrap();
    lock.execute_unprepared("LOCK TABLE inbox_message IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let outcome = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        inbox.process(&env.clone().redelivered(true), &consumer, &handler),
    )
    .await
    .expect("the redelivery waited for the insert lock: no look-up ran");
    assert_eq!(outcome.unwrap(), Outcome::Duplicate);
    lock.rollback().await.unwrap();
}
