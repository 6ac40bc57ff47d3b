//! The row states of `service::state`: each state's SQL condition selects
//! exactly the rows its `of` puts in that state, every row is in exactly one
//! state, and the sweeper, the stats and the API share the lease boundary.

use chrono::{DateTime, Duration, Utc};
use sea_orm::{ActiveValue::Set, EntityTrait, PaginatorTrait, QueryFilter};

use entity::{inbox_message, outbox_message};
use service::sweep::{SweepPolicy, sweep_claims};
use service::{ClaimState, OutboxState};

use crate::on_backends;
use crate::support::{Backend, TestDb, rows};

fn marker(
    i: usize,
    processed: Option<DateTime<Utc>>,
    lease_until: Option<DateTime<Utc>>,
    quarantined: Option<DateTime<Utc>>,
) -> inbox_message::ActiveModel {
    let mut row = rows::marker(format!("m-{i}"), "hook", Utc::now());
    row.processed_at = Set(processed);
    row.claimed_by = Set(lease_until.map(|_| "instance".into()));
    row.lease_until = Set(lease_until);
    row.quarantined_at = Set(quarantined);
    row
}

fn event(i: usize, published: bool, dead: bool) -> outbox_message::ActiveModel {
    let at = Utc::now();
    let mut row = rows::event(format!("e-{i}"), at);
    row.published_at = Set(published.then_some(at));
    row.dead_at = Set(dead.then_some(at));
    row
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

    let rows = inbox_message::Entity::find()
        .into_partial_model::<inbox_message::Summary>()
        .all(&t.db)
        .await
        .unwrap();
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

    let rows = outbox_message::Entity::find()
        .into_partial_model::<outbox_message::Summary>()
        .all(&t.db)
        .await
        .unwrap();
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
