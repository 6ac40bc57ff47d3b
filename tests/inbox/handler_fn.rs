//! Handlers written as plain async functions: the platform decodes their
//! payload (and rejects what does not decode, before any write), and what
//! they emit through their context names the message that caused it.

use sea_orm::EntityTrait;
use serde::Deserialize;

use crate::support::domain::{Balance, add};
use entity::prelude::*;
use service::handler::from_fn;
use service::{
    ConsumerName, Ctx, Envelope, Executor, HandlerError, Inbox, InboxErrorKind, Json, MessageId,
    NewEvent, Outcome,
};

use crate::on_backends;
use crate::support::{Backend, TestDb};

#[derive(Debug, Deserialize)]
struct Deposit {
    account_id: String,
    amount: i64,
}

/// A handler as a fork writes one: typed payload in, writes and an event out.
async fn deposit(ctx: &Ctx<'_>, Json(deposit): Json<Deposit>) -> Result<(), HandlerError> {
    add(ctx.txn(), &deposit.account_id, deposit.amount).await?;
    ctx.emit(NewEvent::json("ledger.deposited", &deposit.account_id)?)
        .await?;
    Ok(())
}

fn envelope(id: &str, payload: &str) -> Envelope {
    Envelope::new(MessageId::parse(id).unwrap(), "ledger.deposit", payload)
}

async fn a_payload_that_does_not_decode_is_rejected_and_nothing_is_written(backend: Backend) {
    let t = TestDb::new(backend).await;
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    let consumer = ConsumerName::parse("deposit").unwrap();
    let handler = from_fn(deposit);

    let bad = envelope("d-bad", r#"{"account_id":"a","amount":"lots"}"#);
    let err = inbox.process(&bad, &consumer, &handler).await.unwrap_err();
    match err.kind() {
        InboxErrorKind::Rejected(reason) => {
            assert!(reason.contains("malformed payload"), "{reason}");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(t.count(InboxMessage).await, 0);
    assert_eq!(t.count(Balance).await, 0);
    assert_eq!(t.count(OutboxMessage).await, 0);

    let good = envelope("d-good", r#"{"account_id":"a","amount":5}"#);
    assert_eq!(
        inbox.process(&good, &consumer, &handler).await.unwrap(),
        Outcome::Processed(())
    );
    let rows = OutboxMessage::find().all(&t.db).await.unwrap();
    assert_eq!(rows.len(), 1);
    // The event records what caused it, from the context alone.
    assert_eq!(rows[0].causation_id.as_deref(), Some("d-good"));
    assert_eq!(rows[0].causation_consumer.as_deref(), Some("deposit"));
    assert_eq!(rows[0].correlation_id.as_deref(), Some("d-good"));
}

on_backends!(a_payload_that_does_not_decode_is_rejected_and_nothing_is_written: sqlite, postgres);

/// The payload's next version: the field `memo` added, optional, so that
/// it also decodes what the previous release still emits.
#[derive(Debug, serde::Serialize, Deserialize)]
struct DepositV2 {
    account_id: String,
    amount: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    memo: Option<String>,
}

/// Payloads evolve by adding optional fields (docs/operations.md, "Message
/// payloads"): the previous release's consumer (the plain [`Deposit`],
/// which does not deny unknown fields) handles a version-2 payload, and
/// the new release's consumer handles what the previous release emits; a
/// consumer that denied unknown fields would dead-letter every version-2
/// message, which is why the rule exists.
async fn a_version_one_consumer_handles_a_version_two_payload_and_back(backend: Backend) {
    let t = TestDb::new(backend).await;
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    let v2 = serde_json::to_string(&DepositV2 {
        account_id: "a".into(),
        amount: 5,
        memo: Some("rent".into()),
    })
    .unwrap();
    let v1 = from_fn(deposit);
    let outcome = inbox
        .process(
            &envelope("v2-to-v1", &v2),
            &ConsumerName::parse("deposit").unwrap(),
            &v1,
        )
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Processed(()));

    async fn deposit_v2(ctx: &Ctx<'_>, Json(d): Json<DepositV2>) -> Result<(), HandlerError> {
        add(ctx.txn(), &d.account_id, d.amount).await?;
        Ok(())
    }
    let outcome = inbox
        .process(
            &envelope("v1-to-v2", r#"{"account_id":"a","amount":7}"#),
            &ConsumerName::parse("deposit-v2").unwrap(),
            &from_fn(deposit_v2),
        )
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Processed(()));

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Strict {
        account_id: String,
        amount: i64,
    }
    async fn strict(_ctx: &Ctx<'_>, Json(_): Json<Strict>) -> Result<(), HandlerError> {
        Ok(())
    }
    let refused = inbox
        .process(
            &envelope("v2-to-strict", &v2),
            &ConsumerName::parse("strict").unwrap(),
            &from_fn(strict),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(refused.kind(), InboxErrorKind::Rejected(_)),
        "{refused}"
    );
}

on_backends!(a_version_one_consumer_handles_a_version_two_payload_and_back: sqlite);
