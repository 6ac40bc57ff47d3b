//! A batch's units are as separate as their own transactions would be:
//! what one sets for the rest of the transaction does not reach the next
//! (nor the batch's `COMMIT`), the batch reads at READ COMMITTED whatever
//! the server's default, a unit that swallowed the loss of the whole
//! transaction takes none of its batch-mates with it, and a deadlock in one
//! unit re-runs that unit only.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, join_all};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};

use crate::on_backends;
use crate::support::domain::{EntryRequest, ledger_consumer, record};
use crate::support::{Backend, TestDb, connect, entry_envelope};
use service::group::Group;
use service::{Ctx, Envelope, Executor, Handle, HandlerError, Inbox, Outcome};

/// One thing a handler does after the ledger's writes.
enum Step {
    /// Runs a statement in the unit's transaction.
    Sql(&'static str),
    /// Reads one text value in the unit's transaction, kept in the list.
    Read(&'static str, Arc<Mutex<Vec<String>>>),
    /// Waits for the test at the barrier.
    Meet(Arc<tokio::sync::Barrier>),
    /// Waits for the gate to open (it stays open).
    Gate(Arc<tokio::sync::Semaphore>),
    /// Counts the handler's runs.
    Count(Arc<AtomicUsize>),
    /// Fails the handler, after its writes.
    Fail,
    /// Runs a statement on the handler's first run only; with `swallow`,
    /// ignores what it answers (a handler that swallows database errors).
    Once {
        sql: &'static str,
        done: Arc<AtomicBool>,
        swallow: bool,
    },
}

struct Steps(Vec<Step>);

impl Handle<()> for Steps {
    fn handle<'a>(&'a self, ctx: &'a Ctx<'a>) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let req =
                EntryRequest::parse(&ctx.envelope().payload).map_err(HandlerError::Rejected)?;
            record(ctx, &req).await?;
            let txn = ctx.txn();
            for step in &self.0 {
                match step {
                    Step::Sql(sql) => {
                        txn.execute_unprepared(sql).await?;
                    }
                    Step::Read(sql, seen) => {
                        let row = txn
                            .query_one_raw(Statement::from_string(txn.get_database_backend(), *sql))
                            .await?
                            .expect("one row");
                        seen.lock()
                            .unwrap()
                            .push(row.try_get_by_index::<String>(0)?);
                    }
                    Step::Meet(barrier) => {
                        barrier.wait().await;
                    }
                    Step::Gate(gate) => drop(gate.acquire().await),
                    Step::Count(runs) => {
                        runs.fetch_add(1, Ordering::SeqCst);
                    }
                    Step::Fail => {
                        return Err(HandlerError::Failed("fails after its writes".into()));
                    }
                    Step::Once { sql, done, swallow } => {
                        if !done.swap(true, Ordering::SeqCst) {
                            let answer = txn.execute_unprepared(sql).await;
                            if !swallow {
                                answer?;
                            }
                        }
                    }
                }
            }
            Ok(())
        })
    }
}

/// An inbox whose batches stay open for a minute: a slow machine cannot
/// close one before every unit of a test joined it.
fn batching(db: &DatabaseConnection) -> Inbox {
    Inbox::new(Executor::new(db.clone()))
        .with_group(Group::new(8, 1).with_patience(Duration::from_secs(60)))
}

/// Handles every message at once, the first one's handler waiting at
/// `gate` (opened by `meanwhile` when it is done): the others queue behind
/// it and join its batch.
async fn in_one_batch(
    inbox: &Inbox,
    units: &[(Envelope, Steps)],
    gate: &tokio::sync::Semaphore,
    meanwhile: impl std::future::Future<Output = ()>,
) -> Vec<Outcome<()>> {
    together(inbox, units, gate, meanwhile)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

async fn together(
    inbox: &Inbox,
    units: &[(Envelope, Steps)],
    gate: &tokio::sync::Semaphore,
    meanwhile: impl std::future::Future<Output = ()>,
) -> Vec<Result<Outcome<()>, service::InboxError>> {
    let consumer = ledger_consumer();
    let (results, ()) = futures::join!(
        join_all(
            units
                .iter()
                .map(|(envelope, handler)| inbox.process(envelope, &consumer, handler)),
        ),
        async {
            meanwhile.await;
            gate.add_permits(1);
        }
    );
    results
}

/// A pool on `t`'s database once `setting` defaults to `value` there (the
/// test server's own defaults favour speed over durability).
async fn with_default(t: &TestDb, setting: &str, value: &str) -> DatabaseConnection {
    let name = t
        .url
        .rsplit('/')
        .next()
        .and_then(|tail| tail.split('?').next())
        .unwrap();
    t.db.execute_unprepared(&format!(
        "ALTER DATABASE \"{name}\" SET {setting} = '{value}'"
    ))
    .await
    .unwrap();
    connect(&t.url, 4).await
}

fn seen() -> Arc<Mutex<Vec<String>>> {
    Arc::default()
}

fn values(seen: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    seen.lock().unwrap().clone()
}

async fn text(db: &DatabaseConnection, sql: &str) -> Vec<String> {
    db.query_all_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap()
        .iter()
        .map(|row| row.try_get_by_index::<String>(0).unwrap())
        .collect()
}

/// A tenant chosen with `set_config(.., true)` (row-level security's usual
/// pattern) and `SET LOCAL synchronous_commit = off` in one unit: the next
/// unit of the batch runs as no tenant, and the batch's `COMMIT` (seen by a
/// deferred trigger, which runs inside it) is synchronous. Without the
/// reset between units the second saw tenant A and the commit ran with
/// `synchronous_commit = off`, acknowledging messages as durable that were
/// not.
#[tokio::test]
async fn a_unit_cannot_change_the_next_units_settings_or_the_commit() {
    let t = TestDb::new(Backend::Postgres).await;
    t.db.execute_unprepared(
        "CREATE TABLE commit_note (setting text NOT NULL);
         CREATE FUNCTION note_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO commit_note VALUES (current_setting('synchronous_commit')); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER note_commit AFTER INSERT ON ledger_entry
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION note_commit();",
    )
    .await
    .unwrap();
    let (gate, tenant, xid) = (Arc::new(tokio::sync::Semaphore::new(0)), seen(), seen());
    let units = vec![
        (
            entry_envelope("s-1", "a", 1, None),
            Steps(vec![
                Step::Gate(gate.clone()),
                Step::Sql("SELECT set_config('app.tenant', 'A', true)"),
                Step::Sql("SET LOCAL synchronous_commit = off"),
                Step::Read("SELECT txid_current()::text", xid.clone()),
            ]),
        ),
        (
            entry_envelope("s-2", "b", 1, None),
            Steps(vec![
                Step::Read(
                    "SELECT coalesce(current_setting('app.tenant', true), '')",
                    tenant.clone(),
                ),
                Step::Read("SELECT txid_current()::text", xid.clone()),
                // The last unit: the commit follows it.
                Step::Sql("SET LOCAL synchronous_commit = off"),
            ]),
        ),
    ];
    let db = with_default(&t, "synchronous_commit", "on").await;
    let outcomes = in_one_batch(&batching(&db), &units, &gate, async {}).await;
    assert_eq!(outcomes, vec![Outcome::Processed(()); 2]);
    let xid = values(&xid);
    assert_eq!(xid[0], xid[1], "one batch");
    assert_eq!(values(&tenant), vec![String::new()], "no tenant leaked");
    assert_eq!(
        text(&t.db, "SELECT setting FROM commit_note").await,
        vec!["on".to_owned(); 2],
        "the batch committed synchronously"
    );
}

/// With REPEATABLE READ as the database's default, a unit that joins a
/// batch after another unit took a snapshot still sees what was committed
/// before it ran (a precondition written elsewhere before its message
/// arrived). Without the batch's own READ COMMITTED it read the first
/// unit's snapshot and missed it.
#[tokio::test]
async fn a_batch_reads_committed_data_whatever_the_default_isolation() {
    let t = TestDb::new(Backend::Postgres).await;
    let db = with_default(&t, "default_transaction_isolation", "repeatable read").await;
    assert_eq!(
        text(&db, "SHOW default_transaction_isolation").await,
        vec!["repeatable read".to_owned()]
    );
    let (gate, met) = (
        Arc::new(tokio::sync::Semaphore::new(0)),
        Arc::new(tokio::sync::Barrier::new(2)),
    );
    let (balance, xid) = (seen(), seen());
    let units = vec![
        (
            entry_envelope("r-1", "a", 1, None),
            Steps(vec![
                Step::Read("SELECT txid_current()::text", xid.clone()),
                Step::Meet(met.clone()),
                Step::Gate(gate.clone()),
            ]),
        ),
        (
            entry_envelope("r-2", "b", 1, None),
            Steps(vec![
                Step::Read("SELECT txid_current()::text", xid.clone()),
                Step::Read(
                    "SELECT count(*)::text FROM ledger_balance WHERE account_id = 'pre'",
                    balance.clone(),
                ),
            ]),
        ),
    ];
    let elsewhere = Inbox::new(Executor::new(db.clone()));
    let written_elsewhere = async {
        // The first unit has its snapshot by now.
        met.wait().await;
        elsewhere
            .process(
                &entry_envelope("r-pre", "pre", 1, None),
                &ledger_consumer(),
                &Steps(vec![]),
            )
            .await
            .unwrap();
    };
    let outcomes = in_one_batch(&batching(&db), &units, &gate, written_elsewhere).await;
    assert_eq!(outcomes, vec![Outcome::Processed(()); 2]);
    let xid = values(&xid);
    assert_eq!(xid[0], xid[1], "one batch");
    assert_eq!(values(&balance), vec!["1".to_owned()]);
}

/// A unit's handler rolls the whole transaction back and swallows it (as
/// an InnoDB deadlock or a full SQLite disk does behind a handler that
/// ignores the error), in the middle of a batch and at its end; what runs
/// after it runs outside the batch's transaction. Every message is still
/// applied, once, and one whose handler fails after it is not: the batch
/// notices that its transaction is gone and runs its units again alone.
/// Without the `RELEASE` of the first savepoint before `COMMIT`, the first
/// unit was reported processed with nothing written (SQLite and MariaDB in
/// the middle, where the next unit's statements commit on their own;
/// PostgreSQL at the end, where its `COMMIT` outside a transaction only
/// warns). Without MariaDB's release of the savepoint before each unit's,
/// the failing unit's marker and writes committed one by one, and it was
/// reported a duplicate with its handler failed.
async fn a_unit_that_swallows_a_rollback_loses_none_of_its_batch_mates(backend: Backend) {
    let t = TestDb::new(backend).await;
    let inbox = batching(&t.db);
    for (batch, swallower, units) in [("mid", 1, 4), ("end", 2, 3)] {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let units: Vec<(Envelope, Steps)> = (0..units)
            .map(|i| {
                let mut steps = Vec::new();
                if i == 0 {
                    steps.push(Step::Gate(gate.clone()));
                }
                if i == swallower {
                    steps.push(Step::Once {
                        sql: "ROLLBACK",
                        done: Arc::default(),
                        swallow: true,
                    });
                }
                if i == 3 {
                    steps.push(Step::Fail);
                }
                let account = format!("{batch}-{i}");
                (
                    entry_envelope(&account, &account, 10 + i as i64, None),
                    Steps(steps),
                )
            })
            .collect();
        let outcomes = in_one_batch_or_not(&inbox, &units, &gate).await;
        assert_eq!(outcomes[0], Some(Outcome::Processed(())), "{batch}");
        if let Some(failing) = outcomes.get(3) {
            assert_eq!(failing, &None, "the failing unit fails");
            assert_eq!(super::balance(&t.db, "mid-3").await, None, "nothing of it");
        }
        for i in 0..3 {
            let account = format!("{batch}-{i}");
            assert_eq!(
                super::balance(&t.db, &account).await,
                Some(10 + i as i64),
                "{account}: applied once"
            );
        }
    }
    assert_eq!(t.count(entity::prelude::InboxMessage).await, 6);
}

/// [`in_one_batch`] for units some of which fail: `None` for those.
async fn in_one_batch_or_not(
    inbox: &Inbox,
    units: &[(Envelope, Steps)],
    gate: &tokio::sync::Semaphore,
) -> Vec<Option<Outcome<()>>> {
    together(inbox, units, gate, async {})
        .await
        .into_iter()
        .map(Result::ok)
        .collect()
}

on_backends!(a_unit_that_swallows_a_rollback_loses_none_of_its_batch_mates: sqlite, postgres, mysql);

/// A deadlock in the middle unit (PostgreSQL's 40P01, raised by the
/// server): that unit rolls back to its savepoint and runs again alone;
/// the others commit in the batch, their handlers run once. Without the
/// error kept to its unit the batch broke and every unit ran twice.
#[tokio::test]
async fn a_deadlock_in_one_unit_runs_that_unit_again_alone() {
    let t = TestDb::new(Backend::Postgres).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let runs: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::default()).collect();
    let units = vec![
        (
            entry_envelope("d-1", "a", 1, None),
            Steps(vec![Step::Count(runs[0].clone()), Step::Gate(gate.clone())]),
        ),
        (
            entry_envelope("d-2", "b", 10, None),
            Steps(vec![
                Step::Count(runs[1].clone()),
                Step::Once {
                    sql: "DO $$ BEGIN RAISE EXCEPTION 'chosen as the deadlock victim' \
                          USING ERRCODE = '40P01'; END $$",
                    done: Arc::default(),
                    swallow: false,
                },
            ]),
        ),
        (
            entry_envelope("d-3", "c", 100, None),
            Steps(vec![Step::Count(runs[2].clone())]),
        ),
    ];
    let outcomes = in_one_batch(&batching(&t.db), &units, &gate, async {}).await;
    assert_eq!(outcomes, vec![Outcome::Processed(()); 3]);
    let runs: Vec<usize> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    assert_eq!(runs, vec![1, 2, 1], "only the deadlocked unit ran again");
    assert_eq!(t.count(entity::prelude::InboxMessage).await, 3);
}
