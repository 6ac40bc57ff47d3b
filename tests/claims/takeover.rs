//! Concurrent claims and the atomic takeover of an expired one.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use tokio::sync::Barrier;

use entity::inbox_message;
use service::ConsumerName;
use service::claim::{ClaimOutcome, ClaimPolicy, claim};

use crate::on_backends;
use crate::support::{Backend, TestDb, entry_envelope};

fn policy(instance: &str) -> ClaimPolicy {
    ClaimPolicy {
        lease: Duration::from_secs(30),
        max_attempts: 5,
        instance: instance.into(),
    }
}

/// Two instances claim at once; one owns it.
async fn two_instances_claiming_one_message_get_one_owner(backend: Backend) {
    let t = TestDb::new(backend).await;
    let consumer = ConsumerName::parse("hook").unwrap();
    let env = entry_envelope("evt-1", "a", 1, None);
    let (a, b) = (t.db.clone(), t.second_pool().await);
    let (pa, pb) = (policy("a"), policy("b"));
    let (ra, rb) = tokio::join!(
        claim(&a, &env, &consumer, &pa),
        claim(&b, &env, &consumer, &pb)
    );
    let outcomes = [ra.unwrap(), rb.unwrap()];
    let owners = outcomes
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Acquired(_)))
        .count();
    let waiting = outcomes
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::InProgress { .. }))
        .count();
    assert_eq!((owners, waiting), (1, 1));
    for outcome in outcomes {
        if let ClaimOutcome::Acquired(guard) = outcome {
            assert_eq!(guard.idempotency_key(), "evt-1");
            guard.complete(Some("done".into())).await.unwrap();
        }
    }
    assert!(matches!(
        claim(&a, &env, &consumer, &policy("c")).await.unwrap(),
        ClaimOutcome::AlreadyProcessed
    ));
}
on_backends!(two_instances_claiming_one_message_get_one_owner: sqlite, postgres);

/// Eight tasks race to take over one expired claim; exactly one wins,
/// and the loser of a late `complete` is told it lost the lease.
async fn eight_contenders_for_an_expired_claim_produce_one_owner(backend: Backend) {
    let t = TestDb::new(backend).await;
    let consumer = ConsumerName::parse("hook").unwrap();
    let env = entry_envelope("evt-race", "a", 1, None);
    let ClaimOutcome::Acquired(stale) = claim(&t.db, &env, &consumer, &policy("crashed"))
        .await
        .unwrap()
    else {
        panic!("first claim");
    };
    // The lease runs out (moved into the past rather than waited for).
    inbox_message::Entity::update_many()
        .col_expr(
            inbox_message::Column::LeaseUntil,
            Expr::value(chrono::Utc::now() - chrono::Duration::seconds(1)),
        )
        .filter(inbox_message::Column::MessageId.eq("evt-race"))
        .exec(&t.db)
        .await
        .unwrap();
    let gate = Arc::new(Barrier::new(8));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let pool = if i % 2 == 0 {
            t.db.clone()
        } else {
            t.second_pool().await
        };
        let (gate, env, consumer) = (gate.clone(), env.clone(), consumer.clone());
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            claim(&pool, &env, &consumer, &policy(&format!("contender-{i}")))
                .await
                .unwrap()
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        if let ClaimOutcome::Acquired(guard) = task.await.unwrap() {
            winners.push(guard);
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one contender took the claim over"
    );
    let winner = winners.pop().unwrap();
    assert_eq!(winner.attempt(), 2);
    assert!(
        matches!(
            stale
                .complete(None)
                .await
                .as_ref()
                .map_err(service::claim::ClaimError::kind),
            Err(service::claim::ClaimErrorKind::LeaseLost)
        ),
        "the crashed owner cannot complete"
    );
    winner.complete(None).await.unwrap();
    let row = inbox_message::Entity::find()
        .one(&t.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.attempts, 2);
    assert!(row.processed_at.is_some());
}
on_backends!(eight_contenders_for_an_expired_claim_produce_one_owner: sqlite, postgres);
