//! The ledger's `hook` consumer POSTs `ledger.recorded` events to a webhook
//! through a claim, in `seawall-testbed consume` processes that crash at the
//! fault points.

use std::time::Duration;

use async_nats::jetstream::message::PublishMessage;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

use entity::{dead_letter, inbox_message};

use crate::on_backends;
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::webhook::WebhookServer;
use crate::support::{Backend, TestDb, wait_until};

pub(crate) async fn setup(
    backend: Backend,
) -> (TestDb, NatsServer, async_nats::jetstream::Context) {
    let t = TestDb::new(backend).await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    worker::ensure_stream(
        &js,
        &worker::StreamSpec {
            name: "LEDGER".into(),
            subjects: vec!["ledger.>".into()],
            duplicate_window: Duration::from_secs(120),
            max_age: Duration::from_secs(3600),
            replicas: 1,
        },
    )
    .await
    .unwrap();
    (t, nats, js)
}

pub(crate) async fn publish_event(js: &async_nats::jetstream::Context, id: &str) {
    let body = format!(r#"{{"message_id":"req-{id}","account_id":"a","amount":1,"balance":1}}"#);
    let msg = PublishMessage::build().payload(body.into()).message_id(id);
    js.send_publish("ledger.recorded", msg)
        .await
        .unwrap()
        .await
        .unwrap();
}

pub(crate) fn consume(
    db_url: &str,
    nats: &NatsServer,
    hook: &WebhookServer,
    extra: &[(&'static str, &str)],
) -> Seawall {
    let mut env = vec![
        ("SEAWALL_DATABASE_URL", db_url.to_owned()),
        ("SEAWALL_NATS_URL", nats.url()),
        ("TESTBED_WEBHOOK_URL", hook.url.clone()),
        ("SEAWALL_SWEEP_INTERVAL_MS", "100".into()),
        ("SEAWALL_STREAM_MAX_AGE_MS", "3600000".into()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    Seawall::spawn(&["consume"], &env)
}

async fn marker(t: &TestDb, id: &str) -> Option<inbox_message::Model> {
    inbox_message::Entity::find()
        .filter(inbox_message::Column::MessageId.eq(id))
        .filter(inbox_message::Column::Consumer.eq("hook"))
        .one(&t.db)
        .await
        .unwrap()
}

async fn completed(t: &TestDb, id: &str) -> bool {
    marker(t, id)
        .await
        .is_some_and(|m| m.processed_at.is_some())
}

/// The first process freezes while its webhook
/// call is in flight (its in-progress acks stop with it), so the second
/// receives the redelivery while the first holds the claim. One call.
async fn two_processes_racing_on_one_event_call_the_webhook_once(backend: Backend) {
    let (t, nats, js) = setup(backend).await;
    let hook = WebhookServer::start(Duration::from_millis(1200), 200).await;
    let cfg = [
        ("SEAWALL_ACK_WAIT_MS", "300"),
        ("SEAWALL_MAX_DELIVER", "20"),
    ];
    let mut a = consume(&t.url, &nats, &hook, &cfg);
    publish_event(&js, "evt-race").await;
    wait_until(
        "the first call to arrive",
        Duration::from_secs(30),
        || async { hook.total_calls() == 1 },
    )
    .await;
    a.freeze();
    let mut b = consume(&t.url, &nats, &hook, &cfg);
    wait_until(
        "the redelivery to meet the live claim",
        Duration::from_secs(30),
        || async { b.log_text().contains("claim held by another instance") },
    )
    .await;
    a.thaw();
    wait_until("the event to be completed", Duration::from_secs(30), || {
        completed(&t, "evt-race")
    })
    .await;
    wait_until(
        "the consumer to settle",
        Duration::from_secs(30),
        || async {
            let mut c = js
                .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                    "hook", "LEDGER",
                )
                .await
                .unwrap();
            let info = c.info().await.unwrap();
            info.num_ack_pending == 0 && info.num_pending == 0
        },
    )
    .await;
    assert_eq!(hook.calls().get("evt-race"), Some(&1), "{:?}", hook.calls());
    assert_eq!(hook.total_calls(), 1);
    for p in [&mut a, &mut b] {
        assert!(p.terminate().await.success());
        p.assert_no_panic();
    }
}
on_backends!(two_processes_racing_on_one_event_call_the_webhook_once: sqlite, postgres);

/// The process dies after committing the claim, before the call. The
/// sweeper releases the claim after its lease, the redelivery takes it over,
/// and the call happens once, with the message id as its key.
async fn a_crash_before_the_call_is_recovered_with_one_call(backend: Backend) {
    let (t, nats, js) = setup(backend).await;
    let hook = WebhookServer::start(Duration::ZERO, 200).await;
    let cfg = [
        ("SEAWALL_ACK_WAIT_MS", "1000"),
        ("SEAWALL_CLAIM_LEASE_MS", "500"),
        ("SEAWALL_MAX_HANDLING_MS", "500"),
    ];
    let mut crashing = consume(
        &t.url,
        &nats,
        &hook,
        &[
            cfg[0],
            cfg[1],
            cfg[2],
            ("TESTBED_FAULT", "claim-after-commit"),
        ],
    );
    publish_event(&js, "evt-crash").await;
    assert!(
        !crashing.wait().await.success(),
        "the fault point aborted the process"
    );
    let open = marker(&t, "evt-crash")
        .await
        .expect("the claim was committed");
    assert!(open.processed_at.is_none());
    assert_eq!(hook.total_calls(), 0);

    let mut recovery = consume(&t.url, &nats, &hook, &cfg);
    wait_until("the event to be completed", Duration::from_secs(30), || {
        completed(&t, "evt-crash")
    })
    .await;
    assert_eq!(hook.calls().len(), 1, "one distinct key");
    assert_eq!(hook.calls().get("evt-crash"), Some(&1));
    assert_eq!(
        marker(&t, "evt-crash").await.unwrap().attempts,
        2,
        "the second attempt took the claim over"
    );
    assert!(recovery.terminate().await.success());
    assert!(
        recovery.log_text().contains("released an abandoned claim"),
        "the sweeper found it"
    );
    recovery.assert_no_panic();
}
on_backends!(a_crash_before_the_call_is_recovered_with_one_call: sqlite, postgres);

/// The process dies after the call, before `complete()`. The retry
/// calls again, with the same idempotency key, so the receiver can drop it.
async fn a_crash_after_the_call_retries_with_the_same_key(backend: Backend) {
    let (t, nats, js) = setup(backend).await;
    let hook = WebhookServer::start(Duration::ZERO, 200).await;
    let cfg = [
        ("SEAWALL_ACK_WAIT_MS", "1000"),
        ("SEAWALL_CLAIM_LEASE_MS", "500"),
        ("SEAWALL_MAX_HANDLING_MS", "500"),
    ];
    let mut crashing = consume(
        &t.url,
        &nats,
        &hook,
        &[
            cfg[0],
            cfg[1],
            cfg[2],
            ("TESTBED_FAULT", "claim-after-call"),
        ],
    );
    publish_event(&js, "evt-after").await;
    assert!(!crashing.wait().await.success());
    assert_eq!(hook.calls().get("evt-after"), Some(&1));

    let mut recovery = consume(&t.url, &nats, &hook, &cfg);
    wait_until("the event to be completed", Duration::from_secs(30), || {
        completed(&t, "evt-after")
    })
    .await;
    assert_eq!(hook.calls().len(), 1, "every call carried the same key");
    assert_eq!(hook.calls().get("evt-after"), Some(&2));
    assert!(recovery.terminate().await.success());
    recovery.assert_no_panic();
}
on_backends!(a_crash_after_the_call_retries_with_the_same_key: sqlite, postgres);

/// The webhook keeps answering 503: the receiver's failure, not the
/// event's, so the delivery is held and tried again (no attempt of the claim
/// counted) until the failure outlasts the infra patience; then it counts,
/// and after the last delivery the claim is quarantined with its dead letter.
async fn a_claim_failing_too_often_is_quarantined_for_a_person(backend: Backend) {
    let (t, nats, js) = setup(backend).await;
    let hook = WebhookServer::start(Duration::ZERO, 503).await;
    let cfg = [
        ("SEAWALL_ACK_WAIT_MS", "1000"),
        ("SEAWALL_INFRA_PATIENCE_MS", "1000"),
        ("SEAWALL_MAX_DELIVER", "2"),
    ];
    let mut p = consume(&t.url, &nats, &hook, &cfg);
    publish_event(&js, "evt-broken").await;
    wait_until(
        "the claim to be quarantined",
        Duration::from_secs(30),
        || async {
            marker(&t, "evt-broken")
                .await
                .is_some_and(|m| m.quarantined_at.is_some())
        },
    )
    .await;
    wait_until("its dead letter", Duration::from_secs(10), || async {
        dead_letter::Entity::find()
            .one(&t.db)
            .await
            .unwrap()
            .is_some()
    })
    .await;
    let letters = dead_letter::Entity::find().all(&t.db).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.consumer, "hook");
    assert_eq!(letter.message_id.as_deref(), Some("evt-broken"));
    assert!(letter.error.contains("infra patience"), "{}", letter.error);
    assert!(
        letter.error.contains("503"),
        "the last failure is kept: {}",
        letter.error
    );
    assert_eq!(letter.subject, "ledger.recorded");
    let calls = hook.calls().get("evt-broken").copied().unwrap_or(0);
    assert!(
        calls >= 4,
        "tried again while held, on each delivery: {calls}"
    );
    let attempts = marker(&t, "evt-broken").await.unwrap().attempts;
    assert!(
        attempts <= 1,
        "no attempt counted against the claim for the receiver's failures: {attempts}"
    );
    assert!(p.terminate().await.success());
    p.assert_no_panic();
}
on_backends!(a_claim_failing_too_often_is_quarantined_for_a_person: sqlite, postgres);

/// HTTPS receivers with a company CA: with the CA file the webhook is called
/// once; a CA file that does not exist stops start-up naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_https_webhook_signed_by_a_private_ca_is_called() {
    let (t, nats, js) = setup(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let hook = WebhookServer::start_tls(&ca).await;
    let ca_path = ca.to_str().unwrap().to_owned();
    let mut p = consume(
        &t.url,
        &nats,
        &hook,
        &[("SEAWALL_WEBHOOK_CA_FILE", &ca_path)],
    );
    publish_event(&js, "evt-tls").await;
    wait_until("the HTTPS call", Duration::from_secs(30), || {
        completed(&t, "evt-tls")
    })
    .await;
    assert_eq!(hook.calls().get("evt-tls"), Some(&1));
    assert!(p.terminate().await.success());
    p.assert_no_panic();

    let missing = dir.path().join("missing.pem");
    let mut refused = consume(
        &t.url,
        &nats,
        &hook,
        &[("SEAWALL_WEBHOOK_CA_FILE", missing.to_str().unwrap())],
    );
    let status = tokio::time::timeout(Duration::from_secs(20), refused.wait())
        .await
        .expect("start-up refuses a missing CA file");
    assert!(!status.success());
    assert!(
        refused.log_text().contains("webhook_ca_file"),
        "{}",
        refused.log_text()
    );
}

/// The webhook's receiver down (connection refused) for 20 s while 200
/// events flow, default settings: a target that is down is no fault of the
/// events. Every effect is performed once after it returns; no dead letter,
/// no quarantined claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_down_for_a_while_gets_every_event_once_it_is_back() {
    let (t, nats, js) = setup(Backend::Postgres).await;
    let port = crate::support::free_port();
    let env = vec![
        ("SEAWALL_DATABASE_URL", t.url.clone()),
        ("SEAWALL_NATS_URL", nats.url()),
        (
            "TESTBED_WEBHOOK_URL",
            format!("http://127.0.0.1:{port}/hook"),
        ),
        ("SEAWALL_STREAM_MAX_AGE_MS", "3600000".into()),
    ];
    let p = Seawall::spawn(&["consume"], &env);
    for i in 0..200 {
        publish_event(&js, &format!("down-{i}")).await;
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    let hook = WebhookServer::start_on(port, Duration::ZERO, 200).await;
    let processed = || async {
        inbox_message::Entity::find()
            .filter(inbox_message::Column::Consumer.eq("hook"))
            .filter(inbox_message::Column::ProcessedAt.is_not_null())
            .all(&t.db)
            .await
            .unwrap()
            .len()
    };
    let settled = || async {
        processed().await
            + dead_letter::Entity::find()
                .filter(dead_letter::Column::Consumer.eq("hook"))
                .all(&t.db)
                .await
                .unwrap()
                .len()
    };
    wait_until("every event settled", Duration::from_secs(120), || async {
        settled().await >= 200
    })
    .await;
    assert_eq!(processed().await, 200, "every effect recorded");
    assert_eq!(hook.calls().len(), 200, "every event reached the receiver");
    assert_eq!(hook.total_calls(), 200, "each once");
    let quarantined = inbox_message::Entity::find()
        .filter(inbox_message::Column::QuarantinedAt.is_not_null())
        .all(&t.db)
        .await
        .unwrap()
        .len();
    assert_eq!(quarantined, 0);
    p.assert_no_panic();
}

/// A delivery that meets another instance's claim waits for it (holding
/// the delivery) instead of spending itself: the effect's message still
/// gets all its deliveries. The first process dies with its webhook call
/// in flight; the second meets its claim until the lease ends, takes it
/// over and fails (the receiver answers 500), and so on. With the wait
/// spent as a delivery, the message was dead-lettered after two calls of
/// its three deliveries.
async fn a_delivery_waiting_for_another_instances_claim_is_not_spent(backend: Backend) {
    let (t, nats, js) = setup(backend).await;
    let hook = WebhookServer::start(Duration::from_millis(1500), 500).await;
    let cfg = [
        ("SEAWALL_ACK_WAIT_MS", "1000"),
        ("SEAWALL_MAX_DELIVER", "3"),
        ("SEAWALL_CLAIM_LEASE_MS", "3000"),
        ("SEAWALL_MAX_HANDLING_MS", "3000"),
        ("SEAWALL_CLAIM_MAX_ATTEMPTS", "10"),
    ];
    let mut a = consume(&t.url, &nats, &hook, &cfg);
    publish_event(&js, "evt-held").await;
    wait_until(
        "the first call to arrive",
        Duration::from_secs(30),
        || async { hook.total_calls() == 1 },
    )
    .await;
    a.kill9().await;
    let mut b = consume(&t.url, &nats, &hook, &cfg);
    wait_until("the dead letter", Duration::from_secs(60), || async {
        dead_letter::Entity::find()
            .filter(dead_letter::Column::MessageId.eq("evt-held"))
            .one(&t.db)
            .await
            .unwrap()
            .is_some()
    })
    .await;
    let letter = dead_letter::Entity::find()
        .filter(dead_letter::Column::MessageId.eq("evt-held"))
        .one(&t.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(letter.deliveries, 3, "{letter:?}");
    assert!(
        b.log_text().contains("claim held by another instance"),
        "the second process met the claim: {}",
        b.log_text()
    );
    assert_eq!(
        hook.total_calls(),
        3,
        "a call per delivery: {:?}\n{}",
        hook.calls(),
        b.log_text()
    );
    assert!(b.terminate().await.success());
    b.assert_no_panic();
}
on_backends!(a_delivery_waiting_for_another_instances_claim_is_not_spent: sqlite, postgres);
