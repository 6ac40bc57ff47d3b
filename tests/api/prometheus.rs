//! The shipped scrape config, alert rules and Grafana dashboard against a
//! real Prometheus scraping three deployments side by side, each target
//! labelled with its deployment's `namespace` as the shipped config shows:
//! `orders`, a split deployment (two `relay`, two `consume`, one `api`);
//! `billing`, a WAL-mode `api` and `relay` on a database and broker of
//! their own; and `ingest`, a consume-only deployment (one `consume`, no
//! `api`, no relay). Each fault makes its alerts fire for its own
//! deployment only and leaves the others quiet, each alert's runbook
//! (docs/operations.md) is followed to clear it, and every panel of the
//! dashboard returns data. The deployments lacking a role fire nothing
//! throughout.
//!
//! The rules are the shipped ones with shorter waits (`for:` and the range
//! windows), so a fault fires in seconds, not minutes.

use std::time::Duration;

use async_nats::jetstream;
use sea_orm::{ConnectionTrait, EntityTrait, Set, TransactionTrait};

use entity::outbox_message;

use service::claim::{ClaimOutcome, ClaimPolicy, claim};
use service::{ConsumerName, Envelope, MessageId, NewEvent, Outbox, OutboxMode};

use crate::prometheus_server::{Prometheus, dashboard_panels_have_data, test_config, test_rules};
use crate::support::domain::{HOOK_CONSUMER, LEDGER_STREAM, RECORDED_SUBJECT};
use crate::support::nats::NatsServer;
use crate::support::postgres::PrivatePostgres;
use crate::support::webhook::WebhookServer;
use crate::support::{Backend, TestDb, free_port, pg_count, wait_for_stream, wait_until};

use crate::deployments::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn alerts_fire_on_a_split_deployment_and_the_dashboard_has_data() {
    let t = TestDb::new(Backend::Postgres).await;
    // The billing and ingest deployments' databases are on a PostgreSQL
    // server of the test's own. Making a logical slot waits until every
    // transaction holding a transaction id on the whole server has ended;
    // on the suite's shared server those include other tests' (a lock held
    // for 40 s by tests/flow/bad_day.rs), so the lost slot's re-creation
    // (4d) outlasted its wait under a full run.
    let pg = PrivatePostgres::start(&[
        "wal_level=logical",
        "max_slot_wal_keep_size=4GB",
        "max_connections=200",
    ]);
    let wal_db = TestDb::on_postgres(&pg.url).await;
    let ingest_db = TestDb::on_postgres(&pg.url).await;
    // A broker per deployment: an api reports the backlogs of the consumers
    // on its own broker, which another deployment's must not be.
    let nats = NatsServer::start().await;
    let wal_nats = NatsServer::start().await;
    let ingest_nats = NatsServer::start().await;
    let hook = WebhookServer::start(Duration::ZERO, 200).await;
    let common = env(&t, &nats, &hook, &[]);
    let wal_env = env(
        &wal_db,
        &wal_nats,
        &hook,
        &[("SEAWALL_OUTBOX_MODE", "wal".to_owned())],
    );
    let ingest_env = env(&ingest_db, &ingest_nats, &hook, &[]);
    let ports: Vec<u16> = (0..8).map(|_| free_port()).collect();
    let api = spawn("api", &common, ("SEAWALL_API_ADDR", ports[0]));
    let mut relays = vec![
        spawn("relay", &common, ("SEAWALL_METRICS_ADDR", ports[1])),
        spawn("relay", &common, ("SEAWALL_METRICS_ADDR", ports[2])),
    ];
    let consumers = [
        spawn("consume", &common, ("SEAWALL_METRICS_ADDR", ports[3])),
        spawn("consume", &common, ("SEAWALL_METRICS_ADDR", ports[4])),
    ];
    let wal_api = spawn("api", &wal_env, ("SEAWALL_API_ADDR", ports[5]));
    let mut wal_relay = spawn("relay", &wal_env, ("SEAWALL_METRICS_ADDR", ports[6]));
    let ingest = spawn("consume", &ingest_env, ("SEAWALL_METRICS_ADDR", ports[7]));
    let addr = |i: usize| format!("127.0.0.1:{}", ports[i]);
    let prom = Prometheus::start(
        &test_config(&[
            ("seawall-api", ORDERS, vec![addr(0)]),
            ("seawall-api", BILLING, vec![addr(5)]),
            ("seawall-relay", ORDERS, vec![addr(1), addr(2)]),
            ("seawall-relay", BILLING, vec![addr(6)]),
            ("seawall-consume", ORDERS, vec![addr(3), addr(4)]),
            ("seawall-consume", INGEST, vec![addr(7)]),
        ]),
        &test_rules(),
    );
    let base = format!("http://{}", addr(0));
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    wait_for_stream(&js, LEDGER_STREAM).await;
    let ingest_js = jetstream::new(async_nats::connect(ingest_nats.url()).await.unwrap());
    wait_for_stream(&ingest_js, LEDGER_STREAM).await;
    wait_until("every process scraped", Duration::from_secs(60), || async {
        prom.query(r#"up{job=~"seawall.*"} == 1"#).await.len() == 8
    })
    .await;
    // Each deployment's targets carry its namespace.
    let mut per_namespace: Vec<(String, String)> = prom
        .query(r#"count by (namespace) (up{job=~"seawall.*"})"#)
        .await
        .iter()
        .map(|s| {
            (
                s["metric"]["namespace"].as_str().unwrap_or("").to_owned(),
                s["value"][1].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    per_namespace.sort();
    assert_eq!(
        per_namespace,
        vec![
            (BILLING.to_owned(), "2".to_owned()),
            (INGEST.to_owned(), "1".to_owned()),
            (ORDERS.to_owned(), "5".to_owned()),
        ]
    );
    publish_credits(&js, "warm", 20).await;
    wait_processed(&prom, 20).await;
    // Quiet, the consume-only deployment too: no rule fires for want of a
    // relay or an api.
    prom.expect_quiet().await;

    // 1. A row the stream refuses dies: SeawallOutboxRowsDead. The runbook:
    // find it (GET /api/v1/outbox?status=dead), read its last_error, fix
    // the cause, retry it.
    let mut poison = crate::support::rows::event("prom-poison".into(), chrono::Utc::now());
    poison.headers = Set(serde_json::json!(["not", "an", "object"]));
    outbox_message::Entity::insert(poison)
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    prom.expect_firing(&["SeawallOutboxRowsDead"]).await;
    prom.expect_firing_in(&[("SeawallOutboxRowsDead", ORDERS)])
        .await;
    let dead = admin(reqwest::Method::GET, &base, "/api/v1/outbox?status=dead").await;
    let row = &dead["items"][0];
    assert!(
        row["last_error"].as_str().unwrap().contains("headers"),
        "{row}"
    );
    let id = row["id"].as_i64().unwrap();
    t.db.execute_unprepared(&format!(
        "UPDATE outbox_message SET headers = '{{}}' WHERE id = {id}"
    ))
    .await
    .unwrap();
    admin(
        reqwest::Method::POST,
        &base,
        &format!("/api/v1/outbox/{id}/retry"),
    )
    .await;
    prom.expect_quiet().await;

    // 2. A message no handler can use is dead-lettered:
    // SeawallDeadLettersGrowing and SeawallDeadLettersOpen. The runbook:
    // list the open dead letters, read the reason, replay or delete.
    publish(&js, "prom-unusable", b"not json").await;
    publish_credits(&js, "around-dead", 40).await;
    prom.expect_firing(&["SeawallDeadLettersGrowing", "SeawallDeadLettersOpen"])
        .await;
    prom.expect_firing_in(&[
        ("SeawallDeadLettersGrowing", ORDERS),
        ("SeawallDeadLettersOpen", ORDERS),
    ])
    .await;
    let letter = first_open_letter(&base, "prom-unusable").await;
    admin(
        reqwest::Method::DELETE,
        &base,
        &format!("/api/v1/dead-letters/{}", letter["id"]),
    )
    .await;
    prom.expect_quiet().await;

    // 2b. Only failures for a while: SeawallConsumerFailureRatioHigh as
    // well. Its runbook: the failures are in the dead letters (and the
    // consumer's logs); fix the cause, replay or delete them.
    for i in 0..5 {
        publish(&js, &format!("prom-unusable-{i}"), b"not json either").await;
    }
    prom.expect_firing(&[
        "SeawallConsumerFailureRatioHigh",
        "SeawallDeadLettersGrowing",
        "SeawallDeadLettersOpen",
    ])
    .await;
    let letters = admin(
        reqwest::Method::GET,
        &base,
        "/api/v1/dead-letters?replayed=false",
    )
    .await;
    let items = letters["items"].as_array().unwrap();
    assert_eq!(items.len(), 5, "{letters}");
    for letter in items {
        assert!(
            letter["error"]
                .as_str()
                .is_some_and(|r| r.contains("malformed")),
            "{letter}"
        );
        admin(
            reqwest::Method::DELETE,
            &base,
            &format!("/api/v1/dead-letters/{}", letter["id"]),
        )
        .await;
    }
    prom.expect_quiet().await;

    // 3. Messages wait and no consumer settles any (a lock holds every
    // handler): SeawallConsumerStalled, though every process is up. The
    // runbook: the consumers' /readyz and logs, then the database's
    // blocked sessions; end what blocks them.
    // Meanwhile the consume-only deployment's consumer of the same name
    // (`ledger`) settles messages of its own, one every half second: the
    // stall is the orders deployment's, and theirs must not hide it.
    let trickle = {
        let js = ingest_js.clone();
        tokio::spawn(async move {
            for i in 0.. {
                let payload = format!(r#"{{"account_id":"ingest-{i}","amount":1}}"#);
                publish(&js, &format!("ingest-{i}"), payload.as_bytes()).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let holder = t.db.begin().await.unwrap();
    holder
        .execute_unprepared("LOCK TABLE ledger_balance IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    publish_credits(&js, "behind-lock", 5).await;
    prom.expect_firing(&["SeawallConsumerStalled"]).await;
    prom.expect_firing_in(&[("SeawallConsumerStalled", ORDERS)])
        .await;
    let settling = format!(
        r#"sum(rate(seawall_consumer_messages_total{{namespace="{INGEST}",consumer="ledger"}}[15s])) > 0"#
    );
    assert!(
        !prom.query(&settling).await.is_empty(),
        "the consume-only deployment's ledger consumer settled messages during the stall"
    );
    trickle.abort();
    let ended = blocking_sessions_ended(&t.db).await;
    assert!(ended >= 1, "the runbook's query found the lock holder");
    drop(holder);
    wait_processed(&prom, 20 + 40 + 5).await;
    prom.expect_quiet().await;

    // 4. The orders deployment's relays gone: SeawallRelayDown for orders
    // (it has relay targets and no heartbeat left), though the billing
    // deployment's relay beats on; and SeawallProcessDown for each. Nothing
    // for billing, nor for the consume-only deployment, which has no relay
    // at all. The runbook starts them again.
    for relay in &mut relays {
        relay.kill9().await;
    }
    prom.expect_firing(&["SeawallProcessDown", "SeawallRelayDown"])
        .await;
    wait_until(
        "both relays' processes down",
        Duration::from_secs(30),
        || async {
            prom.query(r#"ALERTS{alertname="SeawallProcessDown",alertstate="firing"}"#)
                .await
                .len()
                == 2
        },
    )
    .await;
    prom.expect_firing_in(&[("SeawallProcessDown", ORDERS), ("SeawallRelayDown", ORDERS)])
        .await;
    // ...and the billing deployment's (WAL) relay too: SeawallRelayDown for
    // billing as well; and an event written ten minutes ago (as one would
    // be after a long relay outage) still waits in orders:
    // SeawallOutboxBacklogOld joins. Its runbook, like SeawallRelayDown's:
    // a relay again; the event is then published.
    wal_relay.kill9().await;
    let mut stale = crate::support::rows::event(
        "prom-stale".into(),
        chrono::Utc::now() - chrono::Duration::minutes(10),
    );
    // Publishable from now (as if retried): its relay lag is not ten minutes.
    stale.next_attempt_at = Set(chrono::Utc::now());
    outbox_message::Entity::insert(stale)
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    prom.expect_firing(&[
        "SeawallOutboxBacklogOld",
        "SeawallProcessDown",
        "SeawallRelayDown",
        "SeawallWalSlotUnread",
    ])
    .await;
    prom.expect_firing_in(&[
        ("SeawallOutboxBacklogOld", ORDERS),
        ("SeawallProcessDown", BILLING),
        ("SeawallProcessDown", ORDERS),
        ("SeawallRelayDown", BILLING),
        ("SeawallRelayDown", ORDERS),
        ("SeawallWalSlotUnread", BILLING),
    ])
    .await;
    relays = vec![
        spawn("relay", &common, ("SEAWALL_METRICS_ADDR", ports[1])),
        spawn("relay", &common, ("SEAWALL_METRICS_ADDR", ports[2])),
    ];
    wal_relay = spawn("relay", &wal_env, ("SEAWALL_METRICS_ADDR", ports[6]));
    prom.expect_quiet().await;
    assert_eq!(worker::relay::pending_count(&t.db).await.unwrap(), 0);

    // 4a. An event that waited half a minute for a relay (publishable since
    // then, published now): SeawallRelayLagHigh. Its runbook: the outbox
    // has nothing pending, so the relays keep up again (the lag was a
    // backlog's); it clears by itself once its window has passed.
    let mut late = crate::support::rows::event(
        "prom-late".into(),
        chrono::Utc::now() - chrono::Duration::seconds(30),
    );
    late.next_attempt_at = Set(chrono::Utc::now() - chrono::Duration::seconds(30));
    outbox_message::Entity::insert(late)
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    prom.expect_only(&["SeawallRelayLagHigh"]).await;
    prom.expect_firing_in(&[("SeawallRelayLagHigh", ORDERS)])
        .await;
    assert_eq!(worker::relay::pending_count(&t.db).await.unwrap(), 0);
    prom.expect_quiet().await;

    // 4b. A transient database error that every retry meets (here a
    // trigger raising serialization failures, as heavy contention would):
    // SeawallExecutorRetriesExhausted, and the consumer's failures
    // (SeawallConsumerFailureRatioHigh). The runbook: the consumer's log
    // names the reason; end the contention; the message is redelivered on
    // the nak schedule and applied.
    t.db.execute_unprepared(CONFLICT_TRIGGER).await.unwrap();
    publish(&js, "prom-conflict", &credit_payload("acct-conflict")).await;
    prom.expect_only(&[
        "SeawallConsumerFailureRatioHigh",
        "SeawallExecutorRetriesExhausted",
    ])
    .await;
    prom.expect_firing_in(&[
        ("SeawallConsumerFailureRatioHigh", ORDERS),
        ("SeawallExecutorRetriesExhausted", ORDERS),
    ])
    .await;
    assert!(
        consumers
            .iter()
            .any(|c| c.log_text().contains("could not serialize")),
        "a consumer's log names the reason"
    );
    t.db.execute_unprepared("DROP TRIGGER prom_conflict ON ledger_entry")
        .await
        .unwrap();
    wait_processed(&prom, 20 + 40 + 5 + 1).await;
    prom.expect_quiet().await;

    // 4c. An effect's fate unknown: a claim on a recorded event whose
    // owner went away during the call (its lease over), quarantined by
    // the deployment's sweeper with a dead letter:
    // SeawallClaimsQuarantined and SeawallDeadLettersOpen. The runbook:
    // find it, check the receiver (it never saw the event), release the
    // claim and replay its dead letter: the effect is performed once.
    let event = Envelope::new(
        MessageId::parse("prom-claim").unwrap(),
        RECORDED_SUBJECT,
        credit_payload("acct-claim"),
    );
    let gone = ClaimPolicy {
        lease: Duration::ZERO,
        max_attempts: 1,
        instance: "gone".into(),
    };
    let hook_consumer = ConsumerName::parse(HOOK_CONSUMER).unwrap();
    let ClaimOutcome::Acquired(_owner) = claim(&t.db, &event, &hook_consumer, &gone).await.unwrap()
    else {
        panic!("the claim was taken")
    };
    prom.expect_only(&["SeawallClaimsQuarantined", "SeawallDeadLettersOpen"])
        .await;
    prom.expect_firing_in(&[
        ("SeawallClaimsQuarantined", ORDERS),
        ("SeawallDeadLettersOpen", ORDERS),
    ])
    .await;
    let quarantined = admin(
        reqwest::Method::GET,
        &base,
        "/api/v1/inbox?state=quarantined",
    )
    .await;
    let claim_row = &quarantined["items"][0];
    assert_eq!(claim_row["message_id"], "prom-claim", "{quarantined}");
    assert!(
        !hook.calls().contains_key("prom-claim"),
        "{:?}",
        hook.calls()
    );
    admin(
        reqwest::Method::POST,
        &base,
        &format!("/api/v1/inbox/{}/release", claim_row["id"]),
    )
    .await;
    let letter = first_open_letter(&base, "prom-claim").await;
    admin(
        reqwest::Method::POST,
        &base,
        &format!("/api/v1/dead-letters/{}/replay", letter["id"]),
    )
    .await;
    wait_until("the effect performed", Duration::from_secs(60), || async {
        hook.calls().get("prom-claim") == Some(&1)
    })
    .await;
    prom.expect_quiet().await;

    // 4d. The WAL slot lost. An event is relayed from it (the relay
    // records its position), the relay stops, and the slot is dropped under
    // it (by hand here; PostgreSQL invalidating it past
    // max_slot_wal_keep_size does the same): the relay that starts again
    // makes a new slot and finds the loss. SeawallWalSlotRecreated. The
    // runbook: the relay's log and wal_slot_loss name the WAL range whose
    // events were not relayed; the alert clears by itself later.
    let txn = wal_db.db.begin().await.unwrap();
    Outbox::new(OutboxMode::Wal)
        .enqueue(
            &txn,
            NewEvent::new(RECORDED_SUBJECT, credit_payload("acct-wal")).with_message_id("prom-wal"),
        )
        .await
        .unwrap();
    txn.commit().await.unwrap();
    wait_until("the WAL event relayed", Duration::from_secs(30), || async {
        pg_count(
            &wal_db.db,
            "SELECT count(*) FROM wal_relay_position WHERE lsn > 0",
        )
        .await
            == 1
    })
    .await;
    wal_relay.kill9().await;
    let slot = worker::relay::wal::default_slot_name(&wal_db.url);
    wait_until("the slot dropped", Duration::from_secs(30), || async {
        wal_db
            .db
            .execute_unprepared(&format!("SELECT pg_drop_replication_slot('{slot}')"))
            .await
            .is_ok()
    })
    .await;
    wal_relay = spawn("relay", &wal_env, ("SEAWALL_METRICS_ADDR", ports[6]));
    prom.expect_only(&["SeawallWalSlotRecreated"]).await;
    prom.expect_firing_in(&[("SeawallWalSlotRecreated", BILLING)])
        .await;
    // The loss is recorded (and alerted) before the new slot is made;
    // where it starts is filled in once the slot is ready, and only then
    // does the relay answer its scrape and beat: with billing's
    // SeawallProcessDown and SeawallRelayDown clear above, it is complete,
    // read here. (Making the slot waits for every transaction holding a
    // transaction id on the server to end: on this test's own server, none
    // that lasts.)
    let completed =
        "SELECT count(*) FROM wal_slot_loss WHERE restarted_at >= relayed_to AND relayed_to > 0";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while pg_count(&wal_db.db, completed).await != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the loss not completed (the new slot not ready) in 30 s; the relay's log:\n{}",
            wal_relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = wal_relay.log_text();
    assert!(
        log.lines().any(|l| l.contains("ERROR")
            && l.contains("relayed_to=")
            && l.contains("restarted_at=")),
        "{log}"
    );
    prom.expect_quiet().await;

    // 4e. WAL piles up behind the slot while no relay reads it:
    // SeawallWalBacklogLarge (with SeawallWalSlotUnread, and the relay's
    // SeawallProcessDown and SeawallRelayDown: it was billing's only one).
    // The runbook: a relay again; it reads past the backlog and the slot
    // lets the WAL go.
    // The WAL is the server's, written here by the other database on it,
    // the ingest deployment's (whose changes the slot's decoder skips at
    // once when it reads again).
    wal_relay.kill9().await;
    ingest_db
        .db
        .execute_unprepared(
            "CREATE TABLE ballast AS SELECT repeat('x', 1000) AS b FROM generate_series(1, 400000)",
        )
        .await
        .unwrap();
    prom.expect_only(&[
        "SeawallProcessDown",
        "SeawallRelayDown",
        "SeawallWalBacklogLarge",
        "SeawallWalSlotUnread",
    ])
    .await;
    prom.expect_firing_in(&[
        ("SeawallProcessDown", BILLING),
        ("SeawallRelayDown", BILLING),
        ("SeawallWalBacklogLarge", BILLING),
        ("SeawallWalSlotUnread", BILLING),
    ])
    .await;
    wal_relay = spawn("relay", &wal_env, ("SEAWALL_METRICS_ADDR", ports[6]));
    ingest_db
        .db
        .execute_unprepared("DROP TABLE ballast")
        .await
        .unwrap();
    prom.expect_quiet().await;

    // 5. The API cannot read the tables: SeawallStatsUnavailable, and the
    // table gauges are absent rather than frozen. The runbook: the API's
    // log names the failing query; repair the database.
    t.db.execute_unprepared("ALTER TABLE dead_letter RENAME TO dead_letter_away")
        .await
        .unwrap();
    prom.expect_firing(&["SeawallStatsUnavailable"]).await;
    prom.expect_firing_in(&[("SeawallStatsUnavailable", ORDERS)])
        .await;
    let frozen = prom
        .query(&format!(r#"seawall_outbox_rows{{instance="{}"}}"#, addr(0)))
        .await;
    assert!(frozen.is_empty(), "table gauges still exported: {frozen:?}");
    assert!(api.log_text().contains("stats: could not refresh"));
    t.db.execute_unprepared("ALTER TABLE dead_letter_away RENAME TO dead_letter")
        .await
        .unwrap();
    prom.expect_quiet().await;

    // The dashboard: with traffic flowing, every panel's queries return
    // data from this Prometheus.
    publish_credits(&js, "dashboard", 20).await;
    wait_processed(&prom, 20 + 40 + 5 + 20).await;
    dashboard_panels_have_data(&prom).await;

    for p in relays
        .iter()
        .chain(&consumers)
        .chain([&api, &wal_api, &wal_relay, &ingest])
    {
        p.assert_no_panic();
    }
    // The slot goes with the test's own server, stopped when `pg` drops
    // (after the processes, declared later).
}
