//! Another constraint's violation is an error, never a duplicate (rule 4).

use crate::support::domain::Entry;
use crate::support::domain::{LEDGER_CONSUMER, LedgerHandler};
use entity::prelude::*;
use service::{ConsumerName, Executor, Inbox, InboxErrorKind, Outcome};

use crate::on_backends;
use crate::support::{Backend, TestDb, entry_envelope};

async fn a_business_unique_violation_is_an_error_not_a_duplicate(backend: Backend) {
    let t = TestDb::new(backend).await;
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    let handler = LedgerHandler::default();
    let first = entry_envelope("ref-a", "acct", 100, Some("invoice-7"));
    let second = entry_envelope("ref-b", "acct", 100, Some("invoice-7"));
    assert!(matches!(
        inbox.process(&first, &consumer, &handler).await.unwrap(),
        Outcome::Processed(_)
    ));
    let err = inbox
        .process(&second, &consumer, &handler)
        .await
        .unwrap_err();
    let InboxErrorKind::Constraint { constraint, .. } = err.kind() else {
        panic!("expected a constraint error, got {err:?}");
    };
    let expected = match backend {
        Backend::Sqlite => "ledger_entry.reference",
        Backend::Postgres | Backend::MySql => "ix_ledger_entry_reference",
    };
    assert_eq!(constraint, expected);
    assert_eq!(err.message_id().as_str(), "ref-b");
    assert!(
        err.to_string().contains(expected),
        "the message names the constraint: {err}"
    );
    assert!(err.is_permanent());
    assert_eq!(
        t.count(InboxMessage).await,
        1,
        "no marker for the failed message"
    );
    assert_eq!(t.count(Entry).await, 1);
}
on_backends!(a_business_unique_violation_is_an_error_not_a_duplicate: sqlite, postgres, mysql);
