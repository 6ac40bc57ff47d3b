//! A batch's outbox rows are written in one insert just before its
//! `COMMIT`, not one per unit; an insert that fails there fails the batch,
//! whose units then run alone and write their own rows. (A unit rolled
//! back to its savepoint taking its rows back out is
//! `a_batch_commits_exactly_its_good_messages`: its failing handler emits
//! before it fails.)

use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, join_all};
use sea_orm::ConnectionTrait;

use crate::support::domain::{RECORDED_SUBJECT, ledger_consumer};
use crate::support::{Backend, TestDb, entry_envelope, pg_count};
use service::group::Group;
use service::{Ctx, Envelope, Executor, Handle, HandlerError, Inbox, NewEvent, Outbox, Outcome};

/// Emits one event, `<message id>-event`; with a gate, waits for it first
/// (the batch's first unit, while the others queue behind it).
struct Emits(Option<Arc<tokio::sync::Semaphore>>);

impl Handle<()> for Emits {
    fn handle<'a>(&'a self, ctx: &'a Ctx<'a>) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            if let Some(gate) = &self.0 {
                drop(gate.acquire().await);
            }
            let id = format!("{}-event", ctx.envelope().message_id);
            ctx.emit(NewEvent::new(RECORDED_SUBJECT, "{}").with_message_id(id))
                .await?;
            Ok(())
        })
    }
}

/// Processes `ids` as one batch of their number: the first unit holds the
/// batch open until every other one has queued to join it.
async fn one_batch(t: &TestDb, ids: &[&str]) -> Vec<bool> {
    let inbox = Inbox::new(Executor::new(t.db.clone()))
        .with_group(Group::new(ids.len(), 1).with_patience(Duration::from_secs(60)));
    let consumer = ledger_consumer();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let work: Vec<(Envelope, Emits)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let handler = Emits((i == 0).then(|| gate.clone()));
            (entry_envelope(id, "a", 1, None), handler)
        })
        .collect();
    let (results, ()) = futures::join!(
        join_all(
            work.iter()
                .map(|(envelope, handler)| inbox.process(envelope, &consumer, handler)),
        ),
        async { gate.add_permits(1) }
    );
    results
        .iter()
        .map(|r| matches!(r, Ok(Outcome::Processed(()))))
        .collect()
}

/// Counts the statements that insert into `outbox_message`.
async fn count_outbox_inserts(t: &TestDb) {
    t.db.execute_unprepared(
        "CREATE TABLE outbox_inserts (n int);
         CREATE FUNCTION count_outbox_insert() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN INSERT INTO outbox_inserts VALUES (1); RETURN NULL; END $$;
         CREATE TRIGGER count_outbox_insert AFTER INSERT ON outbox_message
           FOR EACH STATEMENT EXECUTE FUNCTION count_outbox_insert();",
    )
    .await
    .unwrap();
}

/// Eight units, each emitting an event: the batch writes the eight rows
/// in one statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_writes_its_units_events_in_one_insert() {
    let t = TestDb::new(Backend::Postgres).await;
    count_outbox_inserts(&t).await;
    let ids = ["o-0", "o-1", "o-2", "o-3", "o-4", "o-5", "o-6", "o-7"];
    assert_eq!(one_batch(&t, &ids).await, [true; 8]);
    assert_eq!(
        pg_count(&t.db, "SELECT count(*) FROM outbox_message").await,
        8
    );
    assert_eq!(
        pg_count(&t.db, "SELECT count(*) FROM outbox_inserts").await,
        1
    );
}

/// A unit's event collides with a row already in the outbox (its message
/// id is taken): the batch's one insert fails, the batch does not commit,
/// and its units run alone; the other three commit with their events, the
/// colliding one fails on its own.
async fn a_failed_insert_runs_the_batch_alone(backend: Backend) {
    let t = TestDb::new(backend).await;
    let txn = sea_orm::TransactionTrait::begin(&t.db).await.unwrap();
    let taken = NewEvent::new(RECORDED_SUBJECT, "{}").with_message_id("c-3-event");
    Outbox::default().enqueue(&txn, taken).await.unwrap();
    txn.commit().await.unwrap();
    let results = one_batch(&t, &["c-0", "c-1", "c-2", "c-3"]).await;
    assert_eq!(results, [true, true, true, false]);
    for id in ["c-0-event", "c-1-event", "c-2-event", "c-3-event"] {
        let sql = format!("SELECT count(*) FROM outbox_message WHERE message_id = '{id}'");
        assert_eq!(pg_count_any(&t, &sql).await, 1, "{id}");
    }
    assert_eq!(t.count(entity::prelude::InboxMessage).await, 3);
}
crate::on_backends!(a_failed_insert_runs_the_batch_alone: sqlite, postgres, mysql);

/// A count on any backend.
async fn pg_count_any(t: &TestDb, sql: &str) -> i64 {
    let row =
        t.db.query_one_raw(sea_orm::Statement::from_string(
            t.db.get_database_backend(),
            sql.to_owned(),
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}
