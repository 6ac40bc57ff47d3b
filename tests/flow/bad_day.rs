//! A database that is up but cannot do the work (a lock or statement
//! timeout, a read-only server, a file it cannot write) is not the
//! message's fault: the consumer holds its deliveries through it, and no
//! valid message becomes a dead letter. Each test runs a `consume` process
//! with default settings (but the kit's fast nak schedule, under which a
//! fault counted against the messages spends their deliveries sooner) on a
//! real server, injects the fault for a fixed
//! time while messages flow (long enough for every delivery to be spent if
//! the fault counted against the messages), and counts what was applied.

use std::time::Duration;

use async_nats::jetstream;
use sea_orm::{ConnectionTrait, DatabaseConnection, EntityTrait, PaginatorTrait, TransactionTrait};

use crate::support::domain::{Balance, Entry};
use entity::prelude::*;

use crate::helpers::{env, publish_entries, req, with_ledger_stream};
use crate::support::process::Seawall;
use crate::support::{Backend, connect, wait_until};

async fn count<E: EntityTrait>(db: &DatabaseConnection) -> u64
where
    E::Model: Send + Sync,
{
    E::find().count(db).await.unwrap()
}

/// A `consume` process on `db_url` with default settings, once its
/// consumer runs.
async fn consume(db_url: &str, nats_url: &str) -> Seawall {
    let consume = Seawall::spawn(&["consume"], &env(db_url, nats_url, &[]));
    wait_until("the consumer running", Duration::from_secs(60), || async {
        consume.log_text().contains("consumer started")
    })
    .await;
    consume
}

/// Publishes `n` entries of 1 each over 7 accounts.
async fn publish(js: &jetstream::Context, n: usize) {
    let msgs: Vec<_> = (0..n)
        .map(|i| (format!("bad-day-{i}"), req(&format!("acct-{}", i % 7), 1)))
        .collect();
    publish_entries(js, &msgs).await;
}

/// Waits until all `n` messages are applied or dead-lettered, then checks
/// each was applied once and none became a dead letter.
async fn all_applied_once(db: &DatabaseConnection, n: u64, consume: &Seawall) {
    wait_until(
        "every message settled",
        Duration::from_secs(180),
        || async { count::<Entry>(db).await + count::<DeadLetter>(db).await >= n },
    )
    .await;
    assert_eq!(count::<Entry>(db).await, n, "each applied once");
    let balances = Balance::find().all(db).await.unwrap();
    assert_eq!(
        balances.iter().map(|b| b.balance).sum::<i64>(),
        i64::try_from(n).unwrap()
    );
    assert_eq!(
        count::<DeadLetter>(db).await,
        0,
        "no valid message dead-lettered"
    );
    consume.assert_no_panic();
}

/// The database name at the end of a server URL.
fn database_of(url: &str) -> &str {
    url.rsplit('/').next().unwrap().split('?').next().unwrap()
}

/// PostgreSQL with `setting` on the database (so every new connection has
/// it), and the ledger's tables locked `ACCESS EXCLUSIVE` for `hold` while
/// `n` messages flow.
async fn locked_ledger(setting: &str, hold: Duration, n: usize) {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    t.db.execute_unprepared(&format!(
        "ALTER DATABASE {} SET {setting}",
        database_of(&t.url)
    ))
    .await
    .unwrap();
    let consume = consume(&t.url, &nats.url()).await;
    let locker = connect(&t.url, 1).await;
    let txn = locker.begin().await.unwrap();
    txn.execute_unprepared("LOCK TABLE ledger_entry, ledger_balance IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    publish(&js, n).await;
    tokio::time::sleep(hold).await;
    assert!(
        consume.log_text().contains("timeout"),
        "the handlers met the timeout"
    );
    txn.commit().await.unwrap();
    all_applied_once(&t.db, n as u64, &consume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_held_past_the_lock_timeout_dead_letters_nothing() {
    locked_ledger("lock_timeout = '200ms'", Duration::from_secs(40), 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_statement_timeout_dead_letters_nothing() {
    locked_ledger("statement_timeout = '200ms'", Duration::from_secs(10), 300).await;
}

/// A failure that looks like an outage (`25006`, as a standby answers) but
/// recurs while the database answers the probe: a trigger on the ledger's
/// table raises it for 40 s, while the dead-letter table takes writes. After
/// five holds of a delivery it is held with patience, like a resource
/// failure, not counted against the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_like_failure_while_the_database_answers_dead_letters_nothing() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    let consume = consume(&t.url, &nats.url()).await;
    for sql in [
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'ledger is read-only now' USING ERRCODE = '25006'; END $$",
        "CREATE TRIGGER refuse BEFORE INSERT ON ledger_entry FOR EACH ROW EXECUTE FUNCTION refuse()",
    ] {
        t.db.execute_unprepared(sql).await.unwrap();
    }
    publish(&js, 300).await;
    // Long enough for each delivery's five holds and the executor's retries
    // to run out every allowed delivery, were the failure the message's.
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert!(
        consume.log_text().contains("ledger is read-only now"),
        "the handlers met the failure"
    );
    t.db.execute_unprepared("DROP TRIGGER refuse ON ledger_entry")
        .await
        .unwrap();
    all_applied_once(&t.db, 300, &consume).await;
}

/// MariaDB switched to `read_only` for 10 s. The process connects as a user
/// of its own database only: `read_only` binds users without the
/// `READ ONLY ADMIN` privilege, which the suite's administrative user (and
/// so every other test on the shared server) keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_only_mariadb_dead_letters_nothing() {
    let (t, nats, js) = with_ledger_stream(Backend::MySql).await;
    let name = database_of(&t.url).to_owned();
    for sql in [
        format!("CREATE USER '{name}'@'%' IDENTIFIED BY 'pw'"),
        format!("GRANT ALL ON {name}.* TO '{name}'@'%'"),
    ] {
        t.db.execute_unprepared(&sql).await.unwrap();
    }
    let base = crate::support::server_url("SEAWALL_TEST_MYSQL_URL");
    let host = base.rsplit('@').next().unwrap();
    let url = format!("mysql://{name}:pw@{host}/{name}");
    let consume = consume(&url, &nats.url()).await;
    t.db.execute_unprepared("SET GLOBAL read_only = ON")
        .await
        .unwrap();
    let lifted = ReadOnlyLifted(t.url.clone());
    publish(&js, 300).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    t.db.execute_unprepared("SET GLOBAL read_only = OFF")
        .await
        .unwrap();
    drop(lifted);
    all_applied_once(&t.db, 300, &consume).await;
    t.db.execute_unprepared(&format!("DROP USER '{name}'@'%'"))
        .await
        .unwrap();
}

/// SQLite on a file system with no room left for 10 s (a tmpfs of the
/// test's own, filled by a file of its own): every write meets
/// SQLITE_FULL, the dead-letter inserts included, and no valid message is
/// dead-lettered once the room is back. SQLite rolls those transactions
/// back by itself; before the pool closed the connections this left
/// inside a transaction, later "commits" on them were savepoints that
/// never committed, and all 300 messages were acknowledged with nothing
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_under_sqlite_dead_letters_nothing() {
    let disk = SmallDisk::mount(64);
    let t = crate::support::TestDb::sqlite_in(disk.path()).await;
    let (nats, js) = crate::helpers::ledger_nats().await;
    let consume = consume(&t.url, &nats.url()).await;
    // An empty write-ahead log, so the next commit needs room it cannot get.
    wait_until("the WAL truncated", Duration::from_secs(30), || async {
        use sea_orm::Statement;
        let row =
            t.db.query_one_raw(Statement::from_string(
                sea_orm::DbBackend::Sqlite,
                "PRAGMA wal_checkpoint(TRUNCATE)",
            ))
            .await
            .unwrap()
            .unwrap();
        row.try_get_by_index::<i32>(0).unwrap() == 0
    })
    .await;
    let filler = disk.fill();
    publish(&js, 300).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    std::fs::remove_file(filler).unwrap();
    all_applied_once(&t.db, 300, &consume).await;
    assert!(
        consume.log_text().contains("database or disk is full"),
        "the consumer met the full disk:\n{}",
        consume.log_text()
    );
}

/// A tmpfs of a few MiB mounted on a temporary directory, unmounted on drop.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount(mib: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(
            status.success(),
            "mounting a tmpfs (the suite runs as root)"
        );
        Self(dir)
    }

    fn path(&self) -> &std::path::Path {
        self.0.path()
    }

    /// Writes a file until the file system has no room left; returns it.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
        let _ = file.sync_all();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

/// Turns `read_only` off again should the test fail while it is on, so the
/// shared server does not stay read-only for the rest of the suite.
struct ReadOnlyLifted(String);

impl Drop for ReadOnlyLifted {
    fn drop(&mut self) {
        let url = url_parts(&self.0);
        let _ = std::process::Command::new("mariadb")
            .args([
                &format!("-h{}", url.host),
                &format!("-P{}", url.port),
                &format!("-u{}", url.user),
                &format!("-p{}", url.password),
                "-e",
                "SET GLOBAL read_only = OFF",
            ])
            .status();
    }
}

struct UrlParts {
    user: String,
    password: String,
    host: String,
    port: String,
}

/// `mysql://user:password@host:port/...`
fn url_parts(url: &str) -> UrlParts {
    let rest = url.trim_start_matches("mysql://");
    let (auth, addr) = rest.split_once('@').unwrap();
    let (user, password) = auth.split_once(':').unwrap();
    let addr = addr.split('/').next().unwrap();
    let (host, port) = addr.split_once(':').unwrap();
    UrlParts {
        user: user.into(),
        password: password.into(),
        host: host.into(),
        port: port.into(),
    }
}

/// A handler that runs past `MAX_HANDLING_MS` loses its delivery: the
/// transaction is dropped (nothing applied) and the delivery counts as a
/// failure of the message, so it ends as a dead letter naming the handling
/// time instead of being held with in-progress acks forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_past_its_handling_time_fails_its_deliveries() {
    let (t, nats, js) = with_ledger_stream(Backend::Sqlite).await;
    let consume = Seawall::spawn(
        &["consume"],
        &env(
            &t.url,
            &nats.url(),
            &[
                ("TESTBED_WORK_MS", "4000"),
                ("SEAWALL_MAX_HANDLING_MS", "1000"),
                ("SEAWALL_ACK_WAIT_MS", "2000"),
                ("SEAWALL_MAX_DELIVER", "2"),
            ],
        ),
    );
    publish(&js, 1).await;
    wait_until("the dead letter", Duration::from_secs(60), || async {
        count::<DeadLetter>(&t.db).await == 1
    })
    .await;
    let dead = DeadLetter::find().one(&t.db).await.unwrap().unwrap();
    assert!(dead.error.contains("max handling time"), "{}", dead.error);
    assert_eq!(dead.deliveries, 2);
    assert_eq!(count::<Entry>(&t.db).await, 0, "nothing applied");
    consume.assert_no_panic();
}

/// SIGTERM while deliveries are held for a resource failure (a lock past
/// the lock timeout): the process stops promptly and cleanly, spending
/// nothing; the held messages are redelivered to the next process once the
/// lock is gone and are applied once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_while_deliveries_are_held_stops_cleanly_and_loses_nothing() {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    t.db.execute_unprepared(&format!(
        "ALTER DATABASE {} SET lock_timeout = '200ms'",
        database_of(&t.url)
    ))
    .await
    .unwrap();
    let mut first = consume(&t.url, &nats.url()).await;
    let locker = connect(&t.url, 1).await;
    let txn = locker.begin().await.unwrap();
    txn.execute_unprepared("LOCK TABLE ledger_entry, ledger_balance IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    publish(&js, 20).await;
    wait_until("deliveries held", Duration::from_secs(30), || async {
        first.log_text().contains("lock timeout")
    })
    .await;
    let stopped = tokio::time::timeout(Duration::from_secs(30), first.terminate())
        .await
        .expect("the process stops within its shutdown deadline, not its patience");
    assert!(stopped.success(), "{}", first.log_text());
    first.assert_no_panic();
    assert_eq!(count::<DeadLetter>(&t.db).await, 0);
    txn.commit().await.unwrap();
    let second = consume(&t.url, &nats.url()).await;
    all_applied_once(&t.db, 20, &second).await;
}
