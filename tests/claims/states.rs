//! The row states of `service::state`: each state's SQL condition selects
//! exactly the rows its `of` puts in that state, every row is in exactly one
//! state, and the sweeper, the stats and the API share the lease boundary.

use chrono::{DateTime, Duration, Utc};
use sea_orm::{
    ActiveValue::{NotSet, Set},
    EntityTrait, PaginatorTrait, QueryFilter,
};

use entity::{inbox_message, outbox_message};
use service::sweep::{SweepPolicy, sweep_claims};
use service::{ClaimState, OutboxState};

use crate::on_backends;
use crate::support::{Backend, TestDb};

fn marker(
    i: usize,
    processed: Option<DateTime<Utc>>,
    lease_until: Option<DateTime<Utc>>,
    quarantined: Option<DateTime<Utc>>,
) -> inbox_message::ActiveModel {
    inbox_message::ActiveModel {
        id: NotSet,
        message_id: Set(format!("m-{i}")),
        consumer: Set("hook".into()),
        received_at: Set(Utc::now()),
        processed_at: Set(processed),
        claimed_by: Set(lease_until.map(|_| "instance".into())),
        claimed_at: Set(None),
        lease_until: Set(lease_until),
        attempts: Set(1),
        result: Set(None),
        quarantined_at: Set(quarantined),
        subject: Set(None),
        payload: Set(None),
    }
}

fn event(i: usize, published: bool, dead: bool) -> outbox_message::ActiveModel {
    let at = Utc::now();
    outbox_message::ActiveModel {
        id: NotSet,
        message_id: Set(format!("e-{i}")),
        subject: Set("states.test".into()),
        payload: Set(b"{}".to_vec()),
        headers: Set(serde_json::json!({})),
        ordering_key: Set(None),
        created_at: Set(at),
        published_at: Set(published.then_some(at)),
        attempts: Set(0),
        last_error: Set(None),
        next_attempt_at: Set(at),
        locked_by: Set(None),
        locked_until: Set(None),
        dead_at: Set(dead.then_some(at)),
    }
}

async fn states_agree(backend: Backend) {
    let t = TestDb::new(backend).await;
    // Whole milliseconds: every backend stores them exactly, so the lease
    // that ends at `now` compares equal to `now` in SQL too.
    let now = DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap();
    let second = Duration::seconds(1);
    let markers = vec![
        marker(0, Some(now), None, None),
        marker(1, None, Some(now + second), None),
        marker(2, None, Some(now), None),
        marker(3, None, Some(now - second), None),
        marker(4, None, None, None),
        marker(5, None, None, Some(now)),
    ];
    inbox_message::Entity::insert_many(markers)
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    let events = vec![
        event(0, false, false),
        event(1, true, false),
        event(2, false, true),
    ];
    outbox_message::Entity::insert_many(events)
        .exec_without_returning(&t.db)
        .await
        .unwrap();

    let rows = inbox_message::Entity::find().all(&t.db).await.unwrap();
    let states = [
        ClaimState::Processed,
        ClaimState::Claimed,
        ClaimState::Expired,
        ClaimState::Quarantined,
    ];
    let mut total = 0;
    for state in states {
        let selected = inbox_message::Entity::find()
            .filter(state.condition(now))
            .count(&t.db)
            .await
            .unwrap();
        let by_row = rows
            .iter()
            .filter(|r| ClaimState::of(r, now) == state)
            .count();
        assert_eq!(
            selected as usize, by_row,
            "{state:?}: SQL and Rust disagree"
        );
        total += selected;
    }
    assert_eq!(
        total as usize,
        rows.len(),
        "every marker is in exactly one state"
    );
    let expired = inbox_message::Entity::find()
        .filter(ClaimState::Expired.condition(now))
        .count(&t.db)
        .await
        .unwrap();
    assert_eq!(
        expired, 3,
        "a lease that ends now, one that ended, none at all"
    );

    let rows = outbox_message::Entity::find().all(&t.db).await.unwrap();
    for state in [
        OutboxState::Pending,
        OutboxState::Published,
        OutboxState::Dead,
    ] {
        let selected = outbox_message::Entity::find()
            .filter(state.condition())
            .count(&t.db)
            .await
            .unwrap();
        let by_row = rows.iter().filter(|r| OutboxState::of(r) == state).count();
        assert_eq!((selected, by_row), (1, 1), "{state:?}");
    }

    // The sweeper releases the claim whose lease ends at this very instant,
    // as the stats already count it expired, and the one that ended before.
    let report = sweep_claims(&t.db, &SweepPolicy::default(), now)
        .await
        .unwrap();
    assert_eq!(report.released, 2);
    let released = inbox_message::Entity::find()
        .filter(ClaimState::Expired.condition(now))
        .all(&t.db)
        .await
        .unwrap();
    assert!(released.iter().all(|r| r.lease_until.is_none()));
}

on_backends!(states_agree: sqlite, postgres);
