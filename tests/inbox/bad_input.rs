//! Bad input gets a clear error and leaves nothing behind.

use futures::future::BoxFuture;

use crate::support::domain::{Balance, Entry};
use crate::support::domain::{EntryRequest, LEDGER_CONSUMER, record};
use entity::prelude::*;
use service::envelope::MAX_MESSAGE_ID_LEN;
use service::handler;
use service::{
    ConsumerName, EnvelopeError, Executor, HandlerError, Inbox, InboxErrorKind, MessageId,
};

use crate::on_backends;
use crate::support::{Backend, TestDb, entry_envelope};

#[test]
fn empty_and_oversized_identifiers_are_rejected_with_a_reason() {
    let empty = MessageId::parse("").unwrap_err();
    assert_eq!(empty, EnvelopeError::EmptyMessageId);
    assert_eq!(empty.to_string(), "message id is empty");
    let long = MessageId::parse("x".repeat(MAX_MESSAGE_ID_LEN + 1)).unwrap_err();
    assert!(long.to_string().contains("the limit is 200"), "{long}");
    assert_eq!(
        ConsumerName::parse("").unwrap_err().to_string(),
        "consumer name is empty"
    );
    assert!(
        ConsumerName::parse("has space")
            .unwrap_err()
            .to_string()
            .contains("invalid")
    );
}

async fn a_panicking_handler_is_reported_and_leaves_no_rows(backend: Backend) {
    let t = TestDb::new(backend).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    let panicking = handler(|ctx| -> BoxFuture<'_, Result<(), HandlerError>> {
        Box::pin(async move {
            let env = ctx.envelope();
            let req = EntryRequest::parse(&env.payload).map_err(HandlerError::Rejected)?;
            record(ctx, &req).await?;
            panic!("handler bug after the writes");
        })
    });
    let env = entry_envelope("panics", "acct", 100, None);
    let err = inbox
        .process(&env, &consumer, &panicking)
        .await
        .unwrap_err();
    let InboxErrorKind::Panicked(panic) = err.kind() else {
        panic!("expected Panicked, got {err:?}")
    };
    assert_eq!(panic, "handler bug after the writes");
    assert_eq!(err.message_id().as_str(), "panics");
    for n in [
        t.count(InboxMessage).await,
        t.count(Entry).await,
        t.count(Balance).await,
        t.count(OutboxMessage).await,
    ] {
        assert_eq!(n, 0);
    }
    // The pool is still usable after the panic.
    let ok = entry_envelope("after-panic", "acct", 100, None);
    inbox
        .process(
            &ok,
            &consumer,
            &crate::support::domain::LedgerHandler::default(),
        )
        .await
        .unwrap();
    assert_eq!(t.count(Entry).await, 1);
}
on_backends!(a_panicking_handler_is_reported_and_leaves_no_rows: sqlite, postgres);

async fn a_malformed_payload_is_rejected_without_rows(backend: Backend) {
    let t = TestDb::new(backend).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    let env = service::Envelope::new(
        MessageId::parse("bad-json").unwrap(),
        "ledger.record",
        &b"{not json"[..],
    );
    let err = inbox
        .process(
            &env,
            &consumer,
            &crate::support::domain::LedgerHandler::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), InboxErrorKind::Rejected(_)) && err.is_permanent(),
        "{err}"
    );
    assert!(err.to_string().contains("malformed entry"), "{err}");
    assert_eq!(t.count(InboxMessage).await, 0);
}
on_backends!(a_malformed_payload_is_rejected_without_rows: sqlite, postgres);

/// Ids that differ only in case, in a trailing space, or in characters
/// outside latin1 are different messages. A database's default collation
/// on MySQL and MariaDB is case-insensitive (and latin1 without a
/// configuration file), and `utf8mb4_bin` ignores trailing spaces: there
/// the second id met the first one's marker and was acknowledged as a
/// duplicate without being applied.
async fn ids_that_differ_only_in_case_are_different_messages(backend: Backend) {
    let t = TestDb::new(backend).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    let handler = crate::support::domain::LedgerHandler::default();
    for id in [
        "Order-1",
        "order-1",
        "ORDER-1",
        "order-1 ",
        "order-1 ✓",
        "order-1 😀",
    ] {
        let outcome = inbox
            .process(&entry_envelope(id, "c", 1, None), &consumer, &handler)
            .await
            .unwrap_or_else(|err| panic!("{id}: {err}"));
        assert!(
            matches!(outcome, service::Outcome::Processed(_)),
            "{id} was taken for another id's copy: {outcome:?}"
        );
    }
    assert_eq!(t.count(InboxMessage).await, 6);
    assert_eq!(t.count(OutboxMessage).await, 6);
}

on_backends!(ids_that_differ_only_in_case_are_different_messages: sqlite, postgres, mysql);

/// A handler that meets a database error, swallows it and returns `Ok`.
/// PostgreSQL has aborted the transaction by then, and its `COMMIT`
/// answers `ROLLBACK` without an error: the message would be acknowledged
/// with its marker and its entry gone. The inbox must report it as failed,
/// alone and in a batch, and leave nothing behind.
async fn a_handler_that_swallows_a_database_error_is_not_reported_processed(batch: usize) {
    let t = TestDb::new(Backend::Postgres).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let inbox = Inbox::new(Executor::new(t.db.clone())).with_batching(batch, 1);
    let swallowing = handler(|ctx| -> BoxFuture<'_, Result<(), HandlerError>> {
        Box::pin(async move {
            let env = ctx.envelope();
            let req = EntryRequest::parse(&env.payload).map_err(HandlerError::Rejected)?;
            record(ctx, &req).await?;
            let failed = sea_orm::ConnectionTrait::execute_unprepared(ctx.txn(), "SELECT 1/0")
                .await
                .is_err();
            assert!(failed, "the statement was meant to fail");
            Ok(())
        })
    });
    let env = entry_envelope("swallows", "acct", 100, None);
    let err = inbox
        .process(&env, &consumer, &swallowing)
        .await
        .expect_err("reported processed, with nothing committed");
    assert!(
        err.to_string().contains("swallowed"),
        "the error does not say what happened: {err}"
    );
    for n in [
        t.count(InboxMessage).await,
        t.count(Entry).await,
        t.count(OutboxMessage).await,
    ] {
        assert_eq!(n, 0);
    }
}

#[tokio::test]
async fn a_handler_that_swallows_a_database_error_is_not_reported_processed_alone() {
    a_handler_that_swallows_a_database_error_is_not_reported_processed(1).await;
}

#[tokio::test]
async fn a_handler_that_swallows_a_database_error_is_not_reported_processed_in_a_batch() {
    a_handler_that_swallows_a_database_error_is_not_reported_processed(4).await;
}
