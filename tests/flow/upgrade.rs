//! The road through an upgrade and a rollback: the tree's release on a
//! schema one expand step ahead of it (the previous release beside, or
//! after, the next one), processes that wait for the migration job, and
//! SIGTERM at any point of start-up.

use std::time::Duration;

use migration::MigratorTrait;
use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};

use crate::helpers::{
    applied_events_once_each, drain, env, publish_entries, req, with_ledger_stream,
};
use crate::on_backends;
use crate::support::ahead::{Ahead, EXPAND_STEP};
use crate::support::domain::Entry;
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, free_port, testbed_output, wait_until};

/// How long a test waits for a process a signal told to stop: the
/// process's promise is 10 s.
const STOPS_WITHIN: Duration = Duration::from_secs(20);

/// `env` as the `&str` pairs `testbed_output` takes.
fn pairs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// The tree's binary on a database a next release migrated one expand step
/// further: `migrate` exits 0 with a note naming the step, and `run`
/// (which applies migrations at start-up) serves messages end to end.
/// Against sea-orm-migration's own check, both refused the database.
async fn a_release_runs_messages_end_to_end_on_a_schema_one_expand_step_ahead(backend: Backend) {
    let (t, nats, js) = with_ledger_stream(backend).await;
    Ahead::up(&t.db, None).await.unwrap();
    let env = env(&t.url, &nats.url(), &[]);
    let out = testbed_output(&["migrate"], &pairs(&env));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("note:") && stdout.contains(EXPAND_STEP),
        "{stdout}"
    );
    let status = testbed_output(&["migrate", "--status"], &pairs(&env));
    let listed = String::from_utf8_lossy(&status.stdout);
    assert!(
        listed.contains(&format!("unknown  {EXPAND_STEP}")),
        "{listed}"
    );

    let mut run = Seawall::spawn(&["run"], &env);
    let msgs: Vec<_> = (0..20)
        .map(|i| (format!("ahead-{i}"), req(&format!("acct-{}", i % 3), 10)))
        .collect();
    publish_entries(&js, &msgs).await;
    crate::helpers::wait_for_rows::<Entry>(&t.db, 20, Duration::from_secs(60)).await;
    drain(&t.db, &js, Duration::from_secs(60)).await;
    assert_eq!(applied_events_once_each(&js).await, 20);
    assert!(run.terminate().await.success(), "{}", run.log_text());
    let log = run.log_text();
    assert!(
        log.contains("does not know") && log.contains(EXPAND_STEP),
        "the unknown migration is logged: {log}"
    );
    run.assert_no_panic();
}
on_backends!(a_release_runs_messages_end_to_end_on_a_schema_one_expand_step_ahead: sqlite, postgres);

/// `SEAWALL_MIGRATIONS=wait`: a consumer started before the migration job
/// waits for it, saying so, without touching the schema; once `migrate`
/// has run, it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_waits_for_the_migration_job_and_serves_once_it_ran() {
    let t = TestDb::empty(Backend::Postgres).await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    let env = env(&t.url, &nats.url(), &[("SEAWALL_MIGRATIONS", "wait")]);
    let consume = Seawall::spawn(&["consume"], &env);
    wait_until(
        "the consumer says it waits for migrations",
        Duration::from_secs(60),
        || async { consume.log_text().contains("waiting for migrations") },
    )
    .await;
    let recorded =
        t.db.query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT to_regclass('seaql_migrations') IS NULL AS none",
        ))
        .await
        .unwrap()
        .unwrap();
    assert!(
        recorded.try_get::<bool>("", "none").unwrap(),
        "a waiting process changes no schema"
    );
    let out = testbed_output(&["migrate"], &pairs(&env));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The stream exists once the consumer is past its wait.
    crate::support::wait_for_stream(&js, crate::support::domain::LEDGER_STREAM).await;
    let msgs = vec![("after-job".to_owned(), req("acct", 1))];
    publish_entries(&js, &msgs).await;
    crate::helpers::wait_for_rows::<Entry>(&t.db, 1, Duration::from_secs(60)).await;
    consume.assert_no_panic();
}

/// Starts `consume` with `env`, waits for its log to show `waiting`, sends
/// SIGTERM and asserts that start-up ended at once and cleanly, its log
/// naming `interrupted`.
async fn sigterm_during_start_up(env: &[(&'static str, String)], waiting: &str, interrupted: &str) {
    let mut consume = Seawall::spawn(&["consume"], env);
    wait_until(waiting, Duration::from_secs(60), || async {
        consume.log_text().contains(waiting)
    })
    .await;
    let status = tokio::time::timeout(STOPS_WITHIN, consume.terminate())
        .await
        .unwrap_or_else(|_| panic!("still running after SIGTERM: {}", consume.log_text()));
    let log = consume.log_text();
    assert!(status.success(), "{log}");
    assert!(
        log.contains("stopped by a signal during start-up") && log.contains(interrupted),
        "{log}"
    );
}

/// Start-up waits up to a minute for a database that refuses connections;
/// a SIGTERM meanwhile ends the process at once, and its log names what it
/// interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigterm_while_start_up_waits_for_the_database_ends_it_at_once() {
    let url = format!("postgres://postgres@127.0.0.1:{}/nowhere", free_port());
    let env = env(&url, "nats://127.0.0.1:1", &[]);
    sigterm_during_start_up(
        &env,
        "connecting to the database",
        "connecting to the database",
    )
    .await;
}

/// Holds the migration lock of `backend` on a connection of the test's
/// own, as a migrator that is running would, until the transaction ends.
async fn hold_migration_lock(t: &TestDb) -> sea_orm::DatabaseTransaction {
    let txn = t.db.begin().await.unwrap();
    let sql = match t.backend {
        Backend::Postgres => format!(
            "SELECT pg_advisory_xact_lock({})",
            migration::POSTGRES_MIGRATION_LOCK
        ),
        _ => format!(
            "SELECT GET_LOCK({}, 10) AS taken",
            migration::MYSQL_MIGRATION_LOCK
        ),
    };
    let row = txn
        .query_one_raw(Statement::from_string(t.db.get_database_backend(), sql))
        .await
        .unwrap()
        .unwrap();
    if t.backend == Backend::MySql {
        assert_eq!(
            row.try_get::<i64>("", "taken").unwrap(),
            1,
            "the test holds the lock"
        );
    }
    txn
}

/// Whether a session waits for the migration lock.
async fn someone_waits_for_the_lock(t: &TestDb) -> bool {
    let sql = match t.backend {
        // This test's database only: other tests run migrations meanwhile.
        Backend::Postgres => {
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        }
        _ => {
            "SELECT count(*) AS n FROM information_schema.processlist \
             WHERE state = 'User lock' AND db = DATABASE()"
        }
    };
    let row =
        t.db.query_one_raw(Statement::from_string(t.db.get_database_backend(), sql))
            .await
            .unwrap()
            .unwrap();
    row.try_get::<i64>("", "n").unwrap() > 0
}

/// `migrate` stopped by SIGTERM while it migrates (here: waiting for
/// another migrator's lock) exits at once with an error naming the step,
/// so a job does not count it done; run again, it applies cleanly.
async fn a_sigterm_mid_migration_stops_it_and_it_applies_again_cleanly(backend: Backend) {
    let t = TestDb::empty(backend).await;
    let held = hold_migration_lock(&t).await;
    let env = env(&t.url, "nats://127.0.0.1:1", &[]);
    let mut migrate = Seawall::spawn(&["migrate"], &env);
    wait_until(
        "migrate waits for the lock",
        Duration::from_secs(30),
        || someone_waits_for_the_lock(&t),
    )
    .await;
    let status = tokio::time::timeout(STOPS_WITHIN, migrate.terminate())
        .await
        .unwrap_or_else(|_| panic!("still running after SIGTERM: {}", migrate.log_text()));
    let log = migrate.log_text();
    assert!(
        !status.success(),
        "an interrupted migration is no success: {log}"
    );
    assert!(
        log.contains("stopped by a signal while applying migrations"),
        "{log}"
    );
    if backend == Backend::MySql {
        // A session's lock outlives its transaction.
        let release = format!("DO RELEASE_LOCK({})", migration::MYSQL_MIGRATION_LOCK);
        held.execute_unprepared(&release).await.unwrap();
    }
    held.rollback().await.unwrap();
    let out = testbed_output(&["migrate"], &pairs(&env));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = migration::status(&t.db).await.unwrap();
    assert!(
        status.pending.is_empty() && status.unknown.is_empty(),
        "{status:?}"
    );
}
on_backends!(a_sigterm_mid_migration_stops_it_and_it_applies_again_cleanly: postgres, mysql);

/// `SEAWALL_MIGRATIONS=wait`: a SIGTERM while the process waits for the
/// migration job (inside `seawall::app::serve`'s start-up) ends it at once,
/// naming the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigterm_while_waiting_for_the_migration_job_ends_the_process_naming_the_wait() {
    let t = TestDb::empty(Backend::Postgres).await;
    let nats = NatsServer::start().await;
    let env = env(&t.url, &nats.url(), &[("SEAWALL_MIGRATIONS", "wait")]);
    sigterm_during_start_up(
        &env,
        "waiting for migrations",
        "waiting for the migration job",
    )
    .await;
}
