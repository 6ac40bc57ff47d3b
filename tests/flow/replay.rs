//! Replaying a dead letter reaches only the consumer that gave up on it, with
//! the original message id and subject; other consumers of the subject, even
//! one whose marker was pruned, never see it again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use sea_orm::ActiveValue::{NotSet, Set};
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::support::domain::Entry;
use crate::support::domain::{LEDGER_CONSUMER, LEDGER_STREAM, LedgerHandler, RECORD_SUBJECT};
use entity::prelude::*;
use entity::{dead_letter, inbox_message};
use service::handler;
use service::{ConsumerName, Executor, HandlerError, Inbox, Registry};
use worker::{Consumer, ConsumerConfig};

use crate::helpers::{ledger_stream, publish_entries, req};
use crate::support::nats::NatsServer;
use crate::support::{Backend, TestDb, wait_until};

async fn markers(db: &sea_orm::DatabaseConnection, consumer: &str) -> u64 {
    InboxMessage::find()
        .filter(inbox_message::Column::Consumer.eq(consumer))
        .filter(inbox_message::Column::MessageId.eq("r-1"))
        .count(db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_dead_letter_reaches_only_its_own_consumer() {
    // A short duplicate window: a replay inside it is refused (409) as a
    // copy of the original publish.
    let t = TestDb::new(Backend::Sqlite).await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    worker::ensure_stream(&js, &ledger_stream(Duration::from_millis(300)))
        .await
        .unwrap();
    // `audit` refuses the message at first, so it dead-letters it; `credit`
    // applies it.
    let refuse = Arc::new(AtomicBool::new(true));
    let applied = Arc::new(AtomicUsize::new(0));
    let audit = handler({
        let refuse = refuse.clone();
        let applied = applied.clone();
        move |ctx| -> BoxFuture<'_, Result<(), HandlerError>> {
            let refused = refuse.load(Ordering::SeqCst);
            if !refused {
                applied.fetch_add(1, Ordering::SeqCst);
            }
            let subject = ctx.envelope().subject.clone();
            Box::pin(async move {
                assert_eq!(
                    subject, RECORD_SUBJECT,
                    "the handler sees the original subject"
                );
                if refused {
                    Err(HandlerError::Rejected("audit is closed".into()))
                } else {
                    Ok(())
                }
            })
        }
    });
    let registry = Registry::new()
        .register_handler(
            ConsumerName::parse(LEDGER_CONSUMER).unwrap(),
            RECORD_SUBJECT,
            LedgerHandler::default(),
        )
        .register_handler(ConsumerName::parse("audit").unwrap(), RECORD_SUBJECT, audit);
    let inbox = Inbox::new(Executor::new(t.db.clone()));
    let cancel = CancellationToken::new();
    let mut replay_subjects = std::collections::HashMap::new();
    let mut tasks = Vec::new();
    for registration in registry.registrations() {
        let consumer = Consumer::new(
            inbox.clone(),
            js.clone(),
            registration.clone(),
            ConsumerConfig::new(crate::support::domain::LEDGER_STREAM),
        );
        consumer.ensure().await.unwrap();
        replay_subjects.insert(registration.consumer.to_string(), consumer.replay_subject());
        let cancel = cancel.clone();
        tasks.push(tokio::spawn(
            async move { consumer.run(cancel).await.unwrap() },
        ));
    }

    publish_entries(&js, &[("r-1".to_owned(), req("acct", 5))]).await;
    wait_until(
        "credit applied and audit dead-lettered",
        Duration::from_secs(30),
        || async {
            Entry::find().count(&t.db).await.unwrap() == 1
                && DeadLetter::find().count(&t.db).await.unwrap() == 1
        },
    )
    .await;
    // The credit consumer's marker is pruned, as retention eventually does.
    InboxMessage::delete_many()
        .filter(inbox_message::Column::Consumer.eq(LEDGER_CONSUMER))
        .exec(&t.db)
        .await
        .unwrap();
    refuse.store(false, Ordering::SeqCst);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let state = api::AppState {
        db: t.db.clone(),
        reads: None,
        nats: None,
        jetstream: Some(js.clone()),
        relay_wake: Some(Arc::new(Notify::new())),
        metrics: None,
        stats: Default::default(),
        checks: Vec::new(),
        config: Arc::new(api::ApiConfig {
            replay_subjects,
            ..api::ApiConfig::default()
        }),
    };
    tokio::spawn(api::serve_listener(listener, state, cancel.clone()));
    let letter = DeadLetter::find().one(&t.db).await.unwrap().unwrap();
    assert_eq!(letter.consumer, "audit");
    let http = crate::support::http_client();
    let replay = format!("{base}/api/v1/dead-letters/{}/replay", letter.id);
    wait_until(
        "the replay to be accepted after the window",
        Duration::from_secs(10),
        || async {
            let res = http.post(&replay).send().await.unwrap();
            let status = res.status().as_u16();
            assert!(matches!(status, 200 | 409), "{}", res.text().await.unwrap());
            status == 200
        },
    )
    .await;

    wait_until(
        "audit to handle the replay",
        Duration::from_secs(30),
        || async { markers(&t.db, "audit").await == 1 },
    )
    .await;
    wait_until(
        "every consumer settled",
        Duration::from_secs(30),
        || async {
            let stream = js.get_stream(LEDGER_STREAM).await.unwrap();
            let mut settled = true;
            for name in [LEDGER_CONSUMER, "audit"] {
                let mut c: async_nats::jetstream::consumer::Consumer<
                    async_nats::jetstream::consumer::pull::Config,
                > = stream.get_consumer(name).await.unwrap();
                let info = c.info().await.unwrap();
                settled &= info.num_pending == 0 && info.num_ack_pending == 0;
            }
            settled
        },
    )
    .await;
    assert_eq!(
        markers(&t.db, LEDGER_CONSUMER).await,
        0,
        "credit never saw the replay"
    );
    assert_eq!(Entry::find().count(&t.db).await.unwrap(), 1, "applied once");
    let letter = dead_letter::Entity::find_by_id(letter.id)
        .one(&t.db)
        .await
        .unwrap()
        .unwrap();
    assert!(letter.replayed_at.is_some());
    assert_eq!(
        applied.load(Ordering::SeqCst),
        1,
        "audit applied the replay"
    );

    // Replayed once, its marker pruned since: a second replay would apply
    // it again, so it is refused, naming when it was replayed.
    InboxMessage::delete_many()
        .filter(inbox_message::Column::Consumer.eq("audit"))
        .exec(&t.db)
        .await
        .unwrap();
    let again = http.post(&replay).send().await.unwrap();
    assert_eq!(again.status().as_u16(), 409);
    let body = again.text().await.unwrap();
    assert!(body.contains("was replayed at"), "{body}");
    // Forced, it goes again (an operator's explicit choice), once outside
    // the duplicate window of the first replay.
    wait_until(
        "the forced replay to be accepted after the window",
        Duration::from_secs(10),
        || async {
            let res = http
                .post(format!("{replay}?force=true"))
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            let body = res.text().await.unwrap();
            assert!(
                status == 200 || (status == 409 && !body.contains("was replayed at")),
                "{status} {body}"
            );
            status == 200
        },
    )
    .await;
    wait_until(
        "audit to handle the forced replay",
        Duration::from_secs(30),
        || async { applied.load(Ordering::SeqCst) == 2 },
    )
    .await;

    // A dead letter whose claim is still quarantined would only be
    // terminated again: refused, naming the release to do first.
    let now = chrono::Utc::now();
    InboxMessage::insert(inbox_message::ActiveModel {
        message_id: Set("r-2".into()),
        consumer: Set("audit".into()),
        received_at: Set(now),
        quarantined_at: Set(Some(now)),
        attempts: Set(5),
        ..Default::default()
    })
    .exec_without_returning(&t.db)
    .await
    .unwrap();
    let mut parked: dead_letter::ActiveModel = letter.into();
    parked.id = NotSet;
    parked.message_id = Set(Some("r-2".into()));
    parked.replayed_at = Set(None);
    let parked = DeadLetter::insert(parked)
        .exec(&t.db)
        .await
        .unwrap()
        .last_insert_id;
    let res = http
        .post(format!("{base}/api/v1/dead-letters/{parked}/replay"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 409);
    let body = res.text().await.unwrap();
    assert!(body.contains("/release"), "{body}");
    cancel.cancel();
    for task in tasks {
        task.await.unwrap();
    }
}
