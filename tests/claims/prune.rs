//! Retention pruning and the start-up retention check.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};

use crate::support::domain::LedgerHandler;
use entity::{inbox_message, outbox_message};
use service::retention::{PruneConfig, prune, prune_dry_run};
use service::{ConsumerName, Executor, Inbox, Outcome};

use crate::on_backends;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, entry_envelope, rows};

fn old_marker(i: usize, age: chrono::Duration) -> inbox_message::ActiveModel {
    rows::marker(format!("old-{i}"), "ledger", Utc::now() - age)
}

fn old_event(i: usize, published: bool, dead: bool) -> outbox_message::ActiveModel {
    let at = Utc::now() - chrono::Duration::hours(2);
    let mut row = rows::event(format!("old-event-{i}"), at);
    row.published_at = Set(published.then_some(at));
    row.dead_at = Set(dead.then_some(at));
    row
}

/// Pruning removes exactly the rows past retention, in batches, from
/// two pruners at once, while a consumer keeps inserting; a message
/// redelivered inside the retention is still a duplicate.
async fn pruning_removes_exactly_the_expired_rows_while_work_goes_on(backend: Backend) {
    let t = TestDb::new(backend).await;
    for chunk in (0..1_000).collect::<Vec<_>>().chunks(200) {
        inbox_message::Entity::insert_many(
            chunk
                .iter()
                .map(|i| old_marker(*i, chrono::Duration::hours(2))),
        )
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    }
    // A quarantined claim is never pruned, however old.
    let mut quarantined = old_marker(5_000, chrono::Duration::hours(2));
    quarantined.quarantined_at = Set(Some(Utc::now()));
    inbox_message::Entity::insert(quarantined)
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    let events: Vec<_> = (0..300)
        .map(|i| old_event(i, true, false))
        .chain((300..350).map(|i| old_event(i, false, false)))
        .chain((350..370).map(|i| old_event(i, false, true)))
        .collect();
    outbox_message::Entity::insert_many(events)
        .exec_without_returning(&t.db)
        .await
        .unwrap();

    let inbox = Inbox::new(Executor::new(t.db.clone()));
    let consumer = ConsumerName::parse("ledger").unwrap();
    let recent = entry_envelope("recent-0", "acct", 1, None);
    inbox
        .process(&recent, &consumer, &LedgerHandler::default())
        .await
        .unwrap();

    let config = PruneConfig {
        inbox: Some(Duration::from_secs(3600)),
        outbox: Duration::from_secs(3600),
        batch_size: 100,
    };
    let dry = prune_dry_run(&t.db, &config, Utc::now()).await.unwrap();
    assert_eq!((dry.inbox, dry.outbox), (1_000, 300));

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (inbox, consumer, stop) = (inbox.clone(), consumer.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 1;
            while !stop.load(Ordering::Relaxed) {
                let env = entry_envelope(&format!("recent-{n}"), "acct", 1, None);
                inbox
                    .process(&env, &consumer, &LedgerHandler::default())
                    .await
                    .unwrap();
                n += 1;
            }
            n
        })
    };
    let second = t.second_pool().await;
    let (a, b) = tokio::join!(
        prune(&t.db, &config, Utc::now()),
        prune(&second, &config, Utc::now())
    );
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        a.inbox + b.inbox,
        1_000,
        "two pruners together removed each expired marker once"
    );
    assert_eq!(a.outbox + b.outbox, 300);

    let left_old = inbox_message::Entity::find()
        .filter(inbox_message::Column::MessageId.starts_with("old-"))
        .count(&t.db)
        .await
        .unwrap();
    assert_eq!(left_old, 1, "only the quarantined claim is left");
    let recent_markers = inbox_message::Entity::find()
        .filter(inbox_message::Column::MessageId.starts_with("recent-"))
        .count(&t.db)
        .await
        .unwrap();
    assert_eq!(
        recent_markers, written,
        "markers inside the retention are kept"
    );
    assert_eq!(
        outbox_message::Entity::find()
            .filter(outbox_message::Column::MessageId.starts_with("old-event-"))
            .count(&t.db)
            .await
            .unwrap(),
        70,
        "pending and dead rows stay"
    );
    assert_eq!(
        inbox
            .process(&recent, &consumer, &LedgerHandler::default())
            .await
            .unwrap(),
        Outcome::Duplicate
    );
}
on_backends!(pruning_removes_exactly_the_expired_rows_while_work_goes_on: sqlite, postgres);

/// Start-up refuses a retention shorter than ack wait x max deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn startup_refuses_a_retention_the_broker_could_outlive() {
    let t = TestDb::new(Backend::Sqlite).await;
    let env = |extra: &[(&'static str, &str)]| {
        let mut env = vec![
            ("SEAWALL_DATABASE_URL", t.url.clone()),
            ("SEAWALL_NATS_URL", "nats://127.0.0.1:1".to_owned()),
            ("SEAWALL_ACK_WAIT_MS", "30000".to_owned()),
            ("SEAWALL_MAX_DELIVER", "5".to_owned()),
            ("SEAWALL_INBOX_RETENTION_MS", "60000".to_owned()),
        ];
        env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        env
    };
    for command in ["consume", "run", "prune"] {
        let mut p = Seawall::spawn(&[command], &env(&[]));
        assert!(!p.wait().await.success());
        let log = p.log_text();
        for needle in [
            "inbox_retention_ms",
            "ack_wait_ms",
            "max_deliver",
            "stream_max_age_ms",
        ] {
            assert!(
                log.contains(needle),
                "`seawall {command}` should name {needle}: {log}"
            );
        }
    }
    // The override lets it past the check (prune then runs on the file).
    let mut p = Seawall::spawn(
        &["prune", "--dry-run"],
        &env(&[("SEAWALL_ALLOW_SHORT_RETENTION", "true")]),
    );
    assert!(p.wait().await.success(), "{}", p.log_text());
}

/// A deployment that only produces runs relays and no consumers: its relays
/// prune the outbox, or published rows would pile up for good. They leave
/// inbox markers alone: how long those must outlive redeliveries is for the
/// consumers' settings to say, which a relay's need not repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_only_process_prunes_the_outbox() {
    let t = TestDb::new(Backend::Sqlite).await;
    let nats = crate::support::nats::NatsServer::start().await;
    let events: Vec<_> = (0..50).map(|i| old_event(i, true, false)).collect();
    outbox_message::Entity::insert_many(events)
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    inbox_message::Entity::insert_many((0..20).map(|i| old_marker(i, chrono::Duration::days(30))))
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    let relay = Seawall::spawn(
        &["relay"],
        &[
            ("SEAWALL_DATABASE_URL", t.url.clone()),
            ("SEAWALL_NATS_URL", nats.url()),
            ("SEAWALL_OUTBOX_RETENTION_MS", "3600000".to_owned()),
            ("SEAWALL_PRUNE_INTERVAL_MS", "200".to_owned()),
        ],
    );
    crate::support::wait_until(
        "the published rows pruned",
        Duration::from_secs(60),
        || async { outbox_message::Entity::find().count(&t.db).await.unwrap() == 0 },
    )
    .await;
    assert_eq!(
        inbox_message::Entity::find().count(&t.db).await.unwrap(),
        20,
        "markers are not a relay's to prune"
    );
    relay.assert_no_panic();
}
