//! Every claim row ends processed, quarantined with its dead letter, or held
//! by a live lease; never open with nobody to finish it, never both
//! processed and quarantined.

use std::time::Duration;

use chrono::Utc;
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};

use entity::{dead_letter, inbox_message};
use service::ConsumerName;
use service::claim::{ClaimErrorKind, ClaimOutcome, ClaimPolicy, claim};
use service::sweep::{SweepPolicy, sweep_claims};

use crate::crashes::{consume, publish_event, setup};
use crate::on_backends;
use crate::support::proxy::{Proxy, upstream_of};
use crate::support::webhook::WebhookServer;
use crate::support::{Backend, TestDb, charted, entry_envelope, wait_until};

/// A lease that is over the moment it is taken, so the sweeper's clock
/// (passed in) decides without waiting.
fn expired_at_once(instance: &str) -> ClaimPolicy {
    ClaimPolicy {
        lease: Duration::ZERO,
        max_attempts: 5,
        instance: instance.into(),
    }
}

async fn the_row(t: &TestDb) -> inbox_message::Model {
    inbox_message::Entity::find()
        .one(&t.db)
        .await
        .unwrap()
        .unwrap()
}

async fn acquire(t: &TestDb, policy: &ClaimPolicy) -> service::claim::ClaimGuard {
    let consumer = ConsumerName::parse("hook").unwrap();
    let env = entry_envelope("evt-late", "a", 1, None);
    match claim(&t.db, &env, &consumer, policy).await.unwrap() {
        ClaimOutcome::Acquired(guard) => guard,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

/// The sweeper released the claim while the effect ran; the owner's
/// completion still records it, since nobody else would.
async fn an_effect_finished_after_the_sweeper_released_its_claim_is_recorded(backend: Backend) {
    let t = TestDb::new(backend).await;
    let guard = acquire(&t, &expired_at_once("slow")).await;
    let later = Utc::now() + chrono::Duration::seconds(1);
    let swept = sweep_claims(&t.db, &SweepPolicy::default(), later)
        .await
        .unwrap();
    assert_eq!(swept.released, 1);
    guard.complete(Some("200".into())).await.unwrap();
    let row = the_row(&t).await;
    assert!(row.processed_at.is_some(), "recorded after the release");
    assert!(row.quarantined_at.is_none());
    assert_eq!(charted(&t.db).await.1, 1, "the completion is charted");
}
on_backends!(an_effect_finished_after_the_sweeper_released_its_claim_is_recorded: sqlite, postgres);

/// The sweeper quarantined the claim while the effect ran; the slow owner
/// must not also mark it processed.
async fn a_claim_quarantined_while_its_effect_ran_is_not_completed(backend: Backend) {
    let t = TestDb::new(backend).await;
    let guard = acquire(&t, &expired_at_once("slow")).await;
    let later = Utc::now() + chrono::Duration::seconds(1);
    let strict = SweepPolicy {
        default_max_attempts: 1,
        ..SweepPolicy::default()
    };
    assert_eq!(
        sweep_claims(&t.db, &strict, later)
            .await
            .unwrap()
            .quarantined,
        1
    );
    let err = guard.complete(None).await.unwrap_err();
    assert!(matches!(err.kind(), ClaimErrorKind::Quarantined), "{err}");
    let row = the_row(&t).await;
    assert!(row.processed_at.is_none() && row.quarantined_at.is_some());
    assert_eq!(dead_letter::Entity::find().count(&t.db).await.unwrap(), 1);
    assert_eq!(charted(&t.db).await.1, 0, "nothing was processed");
}
on_backends!(a_claim_quarantined_while_its_effect_ran_is_not_completed: sqlite, postgres);

/// Leases barely longer than the webhook's answer (and the handling time
/// they must cover), a busy sweeper and three consumer processes: claims
/// are released, taken over and quarantined at the edge of their leases.
/// Once every delivery is settled, each row is processed or quarantined
/// (with its dead letter), never open and never both.
async fn claims_churned_by_short_leases_all_end_finished(backend: Backend) {
    let (t, nats, js) = setup(backend).await;
    let hook = WebhookServer::start(Duration::from_millis(150), 200).await;
    let cfg = [
        ("SEAWALL_CLAIM_LEASE_MS", "200"),
        ("SEAWALL_MAX_HANDLING_MS", "200"),
        ("SEAWALL_SWEEP_INTERVAL_MS", "50"),
        ("SEAWALL_ACK_WAIT_MS", "2000"),
        ("SEAWALL_CLAIM_MAX_ATTEMPTS", "2"),
    ];
    let mut processes: Vec<_> = (0..3)
        .map(|_| consume(&t.url, &nats, &hook, &cfg))
        .collect();
    let ids: Vec<String> = (0..12).map(|i| format!("churn-{i}")).collect();
    for id in &ids {
        publish_event(&js, id).await;
    }
    wait_until(
        "every delivery settled",
        Duration::from_secs(90),
        || async {
            let Ok(mut c) = js
                .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                    "hook", "LEDGER",
                )
                .await
            else {
                return false;
            };
            let Ok(info) = c.info().await else {
                return false;
            };
            info.num_ack_pending == 0
                && info.num_pending == 0
                && info.delivered.stream_sequence >= 12
        },
    )
    .await;
    let rows = inbox_message::Entity::find()
        .filter(inbox_message::Column::Consumer.eq("hook"))
        .all(&t.db)
        .await
        .unwrap();
    assert_eq!(rows.len(), ids.len());
    let mut quarantined = 0;
    for row in &rows {
        let processed = row.processed_at.is_some();
        let parked = row.quarantined_at.is_some();
        assert!(
            processed != parked,
            "{} ends exactly one way: {row:?}",
            row.message_id
        );
        quarantined += u64::from(parked);
    }
    let letters = dead_letter::Entity::find()
        .filter(dead_letter::Column::Consumer.eq("hook"))
        .count(&t.db)
        .await
        .unwrap();
    assert_eq!(
        letters, quarantined,
        "one dead letter per quarantined claim"
    );
    assert_eq!(
        charted(&t.db).await.1,
        rows.len() as u64 - quarantined,
        "each completed claim charted once, whoever completed it"
    );
    for p in &mut processes {
        assert!(p.terminate().await.success());
        p.assert_no_panic();
    }
}
on_backends!(claims_churned_by_short_leases_all_end_finished: sqlite, postgres);

/// The database goes away after the webhook was called and before the claim
/// is recorded: the consumer waits the outage out and records it with the
/// claim it holds, instead of handling the delivery again (which would take
/// its own claim over once the lease ran out and call the webhook twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_effect_whose_record_meets_an_outage_is_recorded_without_a_second_call() {
    let (t, nats, js) = setup(Backend::Postgres).await;
    let upstream = upstream_of(&t.url);
    let proxy = Proxy::start(upstream).await;
    let hook = WebhookServer::start(Duration::from_millis(1500), 200).await;
    let proxied = proxy.url_for(&t.url, upstream);
    let mut p = consume(
        &proxied,
        &nats,
        &hook,
        &[
            ("SEAWALL_CLAIM_LEASE_MS", "2000"),
            ("SEAWALL_MAX_HANDLING_MS", "2000"),
        ],
    );
    publish_event(&js, "evt-outage").await;
    wait_until("the webhook call", Duration::from_secs(30), || async {
        hook.total_calls() == 1
    })
    .await;
    proxy.cut();
    // Past the webhook's answer, the claim's lease and the handling time,
    // with the database away: the performed effect is not given up.
    tokio::time::sleep(Duration::from_secs(5)).await;
    proxy.restore();
    wait_until("the claim recorded", Duration::from_secs(30), || async {
        inbox_message::Entity::find()
            .one(&t.db)
            .await
            .unwrap()
            .is_some_and(|m| m.processed_at.is_some())
    })
    .await;
    assert_eq!(
        hook.total_calls(),
        1,
        "{:?}\n{}",
        hook.calls(),
        p.log_text()
    );
    assert!(p.terminate().await.success());
    p.assert_no_panic();
}

/// SIGTERM while a performed effect waits for the database to record it:
/// the process stops waiting and exits (it does not wait for the database
/// for ever), and its log names the claim and message a person may have to
/// check; nothing calls the receiver a second time meanwhile.
#[tokio::test]
async fn sigterm_while_a_performed_effect_waits_to_be_recorded_names_its_claim() {
    let (t, nats, js) = setup(Backend::Postgres).await;
    let upstream = upstream_of(&t.url);
    let proxy = Proxy::start(upstream).await;
    let hook = WebhookServer::start(Duration::from_millis(1500), 200).await;
    let proxied = proxy.url_for(&t.url, upstream);
    let mut p = consume(&proxied, &nats, &hook, &[]);
    publish_event(&js, "evt-stopping").await;
    wait_until("the webhook call", Duration::from_secs(30), || async {
        hook.total_calls() == 1
    })
    .await;
    let claim_id = the_row(&t).await.id;
    proxy.cut();
    // Past the receiver's answer: the effect is performed, its record waits.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = tokio::time::timeout(Duration::from_secs(40), p.terminate())
        .await
        .unwrap_or_else(|_| panic!("still running 40 s after SIGTERM:\n{}", p.log_text()));
    assert!(status.success(), "{status:?}\n{}", p.log_text());
    let log = p.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("effect performed but not recorded"))
        .unwrap_or_else(|| panic!("no line names the unrecorded effect:\n{log}"));
    assert!(line.contains(&format!("claim={claim_id}")), "{line}");
    assert!(line.contains("evt-stopping"), "{line}");
    assert_eq!(hook.total_calls(), 1, "{:?}", hook.calls());
    proxy.restore();
    p.assert_no_panic();
}
