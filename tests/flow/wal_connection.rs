//! The WAL relay's replication connection is made as the pool's is, from
//! the same `database_url` and environment: on a PostgreSQL server that
//! takes TLS connections only, with the password in a password file and no
//! `sslmode` in the URL (so TLS is preferred, as libpq and sqlx prefer it),
//! both connect and the relay publishes.

use std::time::Duration;

use sea_orm::ConnectionTrait;

use crate::helpers::stored_on;
use crate::support::domain::RECORDED_SUBJECT;
use crate::support::postgres::PrivatePostgres;
use crate::support::process::Seawall;
use crate::support::tls::TestCerts;
use crate::support::{TestDb, wait_until};
use crate::wal::{commit_events, recorded, slot_holder, wal_env};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_connects_to_a_server_that_takes_only_tls_with_a_password_file() {
    let pg = PrivatePostgres::start(&["wal_level=logical"]);
    let t = TestDb::on_postgres(&pg.url).await;
    let dir = pg.private_dir();
    TestCerts::generate().write(&dir);
    PrivatePostgres::hand_over(&dir);
    for setting in [
        format!("ssl_cert_file = '{}'", dir.join("cert.pem").display()),
        format!("ssl_key_file = '{}'", dir.join("key.pem").display()),
        "ssl = on".to_owned(),
    ] {
        t.db.execute_unprepared(&format!("ALTER SYSTEM SET {setting}"))
            .await
            .unwrap();
    }
    t.db.execute_unprepared("ALTER USER postgres PASSWORD 'tls-only-secret'")
        .await
        .unwrap();
    t.db.execute_unprepared("SELECT pg_reload_conf()")
        .await
        .unwrap();
    // No `host` line: a connection without TLS is refused, whatever it is.
    pg.set_hba(
        "local all all trust\n\
         hostssl all all 127.0.0.1/32 scram-sha-256\n\
         hostssl replication all 127.0.0.1/32 scram-sha-256\n",
    );
    let port = t.url.rsplit(':').next().unwrap().split('/').next().unwrap();
    let passfile = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        passfile.path(),
        format!("127.0.0.1:{port}:*:postgres:tls-only-secret\n"),
    )
    .unwrap();
    let (nats, js) = crate::helpers::ledger_nats().await;
    let mut env = wal_env(&t, &nats.url(), &[]);
    env.push(("PGPASSFILE", passfile.path().display().to_string()));
    let mut relay = Seawall::spawn(&["relay"], &env);
    let held = tokio::time::timeout(Duration::from_secs(60), async {
        while slot_holder(&t).await.is_none() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        held.is_ok(),
        "no relay holds the slot:\n{}",
        relay.log_text()
    );
    commit_events(
        &t.db,
        (0..10)
            .map(|i| recorded(&format!("tls-{i}"), None))
            .collect(),
    )
    .await;
    wait_until("the events relayed", Duration::from_secs(60), || async {
        stored_on(&js, RECORDED_SUBJECT).await.len() == 10
    })
    .await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
}
