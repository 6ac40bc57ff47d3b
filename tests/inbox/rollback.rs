//! All or nothing (rules 3 and 6).

use futures::future::BoxFuture;
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

use crate::support::domain::{Balance, Entry};
use crate::support::domain::{
    EntryRequest, LEDGER_CONSUMER, LedgerHandler, balance, entry, record,
};
use entity::prelude::*;
use service::executor::unit;
use service::handler;
use service::inbox::record_marker;
use service::{ConsumerName, Executor, HandlerError, Inbox, InboxErrorKind, Outcome};

use crate::on_backends;
use crate::support::{Backend, TestDb, entry_envelope};

/// A failing business write rolls the marker back.
async fn a_failing_business_write_rolls_the_marker_back(backend: Backend) {
    let t = TestDb::new(backend).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    // The second credit insert reuses the reference of the first: the business
    // write fails after the marker, the credit and the outbox row were written.
    let failing = handler(|ctx| -> BoxFuture<'_, Result<(), HandlerError>> {
        Box::pin(async move {
            let (txn, env) = (ctx.txn(), ctx.envelope());
            let req = EntryRequest::parse(&env.payload).map_err(HandlerError::Rejected)?;
            record(ctx, &req).await?;
            entry::Entity::insert(entry::ActiveModel {
                id: sea_orm::NotSet,
                message_id: sea_orm::Set(env.message_id.to_string()),
                account_id: sea_orm::Set(req.account_id.clone()),
                amount: sea_orm::Set(1),
                reference: sea_orm::Set(req.reference.clone()),
                created_at: sea_orm::Set(chrono::Utc::now()),
            })
            .exec_without_returning(txn)
            .await?;
            Ok(())
        })
    });
    let env = entry_envelope("rollback-1", "acct", 100, Some("ref-1"));
    let err = inbox.process(&env, &consumer, &failing).await.unwrap_err();
    assert!(
        matches!(err.kind(), InboxErrorKind::Constraint { .. }),
        "{err}"
    );
    assert_eq!(t.count(InboxMessage).await, 0);
    assert_eq!(t.count(Entry).await, 0);
    assert_eq!(t.count(Balance).await, 0);
    assert_eq!(t.count(OutboxMessage).await, 0);
}
on_backends!(a_failing_business_write_rolls_the_marker_back: sqlite, postgres, mysql);

/// A bulk update made before the marker is rejected rolls back with it.
async fn a_bulk_update_is_rolled_back_when_the_marker_is_rejected(backend: Backend) {
    let t = TestDb::new(backend).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    for (i, acct) in ["a", "b", "c"].iter().enumerate() {
        let env = entry_envelope(&format!("bulk-{i}"), acct, 100, None);
        inbox
            .process(&env, &consumer, &LedgerHandler::default())
            .await
            .unwrap();
    }
    // The redelivered copy of bulk-0: a unit bumps every balance with one
    // update_many, then records the marker, which the index rejects.
    let redelivered = entry_envelope("bulk-0", "a", 100, None);
    let bump = unit(move |txn| -> BoxFuture<'_, Result<(), HandlerError>> {
        let (env, consumer) = (redelivered.clone(), consumer.clone());
        Box::pin(async move {
            let updated = balance::Entity::update_many()
                .col_expr(
                    balance::Column::Balance,
                    Expr::col(balance::Column::Balance).add(1_000),
                )
                .filter(balance::Column::Balance.gt(0))
                .exec(txn)
                .await?;
            assert_eq!(updated.rows_affected, 3);
            record_marker(txn, &env, &consumer).await?;
            Ok(())
        })
    });
    let err = inbox.executor().run(&bump).await.unwrap_err();
    let HandlerError::Database(db_err) = err else {
        panic!("expected a database error")
    };
    assert_eq!(
        service::classify::classify(&db_err),
        service::classify::Failure::InboxDuplicate
    );
    let balances: Vec<i64> = Balance::find()
        .all(&t.db)
        .await
        .unwrap()
        .iter()
        .map(|a| a.balance)
        .collect();
    assert_eq!(
        balances,
        vec![100, 100, 100],
        "the bulk update did not survive the rejection"
    );
}
on_backends!(a_bulk_update_is_rolled_back_when_the_marker_is_rejected: sqlite, postgres);

/// After a failed unit, the redelivery runs in a fresh transaction and
/// nothing of the failed attempt leaks into it.
async fn a_retry_after_a_failed_unit_starts_from_a_clean_transaction(backend: Backend) {
    let t = TestDb::new(backend).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    let env = entry_envelope("retry-1", "acct", 100, Some("first-attempt"));
    let failing = handler(|ctx| -> BoxFuture<'_, Result<(), HandlerError>> {
        Box::pin(async move {
            let env = ctx.envelope();
            let req = EntryRequest::parse(&env.payload).map_err(HandlerError::Rejected)?;
            record(ctx, &req).await?;
            Err(HandlerError::Failed("downstream refused".into()))
        })
    });
    let err = inbox.process(&env, &consumer, &failing).await.unwrap_err();
    assert!(matches!(err.kind(), InboxErrorKind::Handler(_)), "{err}");
    // The redelivery succeeds. Had the first attempt's writes leaked, the
    // reference would collide and the balance would be 200.
    let outcome = inbox
        .process(&env, &consumer, &LedgerHandler::default())
        .await
        .unwrap();
    let Outcome::Processed(applied) = outcome else {
        panic!("expected Processed")
    };
    assert_eq!(applied.balance, 100);
    assert_eq!(t.count(Entry).await, 1);
    assert_eq!(t.count(OutboxMessage).await, 1);
    let credits = Entry::find()
        .filter(entry::Column::Reference.eq("first-attempt"))
        .all(&t.db)
        .await
        .unwrap();
    assert_eq!(credits.len(), 1);
}
on_backends!(a_retry_after_a_failed_unit_starts_from_a_clean_transaction: sqlite, postgres);

/// `Outbox::enqueue_all` records a batch larger than one multi-row insert in
/// the order given, and nothing of it when the transaction rolls back.
async fn a_batch_of_events_commits_in_order_or_not_at_all(backend: Backend) {
    use sea_orm::{QueryOrder, TransactionTrait};
    use service::{NewEvent, Outbox};
    let t = TestDb::new(backend).await;
    let n = service::outbox::ROWS_PER_INSERT + 500;
    let events = |prefix: &str| {
        (0..n)
            .map(|i| {
                NewEvent::new("ledger.recorded", i.to_string())
                    .with_message_id(format!("{prefix}-{i}"))
            })
            .collect::<Vec<_>>()
    };
    let txn = t.db.begin().await.unwrap();
    Outbox::default()
        .enqueue_all(&txn, events("dropped"))
        .await
        .unwrap();
    txn.rollback().await.unwrap();
    assert_eq!(t.count(OutboxMessage).await, 0);

    let txn = t.db.begin().await.unwrap();
    Outbox::default()
        .enqueue_all(&txn, events("kept"))
        .await
        .unwrap();
    txn.commit().await.unwrap();
    let payloads: Vec<Vec<u8>> = OutboxMessage::find()
        .order_by_asc(entity::outbox_message::Column::Id)
        .all(&t.db)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.payload)
        .collect();
    let expected: Vec<Vec<u8>> = (0..n).map(|i| i.to_string().into_bytes()).collect();
    assert_eq!(payloads, expected);
}
on_backends!(a_batch_of_events_commits_in_order_or_not_at_all: sqlite, postgres, mysql);
