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
    let passfile_env = ("PGPASSFILE", passfile.path().display().to_string());
    relays_events(&t, &t.url, &[passfile_env], "tls").await;
}

/// A role whose password PostgreSQL keeps as MD5, behind an `md5` line in
/// `pg_hba.conf`: the pool reaches it (sqlx speaks MD5), and so must the
/// relay. Without `pgwire-replication`'s `md5` feature its connection is
/// refused and no relay holds the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_connects_with_an_md5_password() {
    let pg = PrivatePostgres::start(&["wal_level=logical"]);
    let t = TestDb::on_postgres(&pg.url).await;
    // The relay's own role, so the test's pool (trusted) keeps working.
    t.db.execute_unprepared(
        "SET password_encryption = 'md5'; \
         CREATE ROLE relay_md5 LOGIN SUPERUSER REPLICATION PASSWORD 'md5-secret'",
    )
    .await
    .unwrap();
    pg.set_hba(
        "local all all trust\n\
         host all relay_md5 127.0.0.1/32 md5\n\
         host replication relay_md5 127.0.0.1/32 md5\n\
         host all all 127.0.0.1/32 trust\n\
         host replication all 127.0.0.1/32 trust\n",
    );
    let url = t.url.replacen("postgres@", "relay_md5:md5-secret@", 1);
    relays_events(&t, &url, &[], "md5").await;
}

/// A relay started with `url` (the test database's, with `env` added)
/// holds the slot and publishes ten events committed with ids `prefix-N`.
async fn relays_events(t: &TestDb, url: &str, env: &[(&'static str, String)], prefix: &str) {
    let (nats, js) = crate::helpers::ledger_nats().await;
    let mut cfg = wal_env(t, &nats.url(), &[]);
    for (key, value) in &mut cfg {
        if *key == "SEAWALL_DATABASE_URL" {
            *value = url.to_owned();
        }
    }
    cfg.extend_from_slice(env);
    let mut relay = Seawall::spawn(&["relay"], &cfg);
    let held = tokio::time::timeout(Duration::from_secs(60), async {
        while slot_holder(t).await.is_none() {
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
            .map(|i| recorded(&format!("{prefix}-{i}"), None))
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
