//! The WAL relay's replication connection is made as the pool's is, from
//! the same `database_url` and environment: on a PostgreSQL server that
//! takes TLS connections only, with the password in a password file and no
//! `sslmode` in the URL (so TLS is preferred, as libpq and sqlx prefer it),
//! both connect and the relay publishes.

use std::time::Duration;

use async_nats::jetstream;

use sea_orm::ConnectionTrait;

use crate::helpers::stored_on;
use crate::support::TestDb;
use crate::support::domain::RECORDED_SUBJECT;
use crate::support::nats::NatsServer;
use crate::support::postgres::PrivatePostgres;
use crate::support::process::Seawall;
use crate::support::proxy::{Proxy, upstream_of};
use crate::support::tls::TestCerts;
use crate::wal::{commit_events, recorded, wal_env_on};

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
    let (mut relay, _nats, js) = holding_relay(t, url, env).await;
    relays_ten(t, &relay, &js, prefix, 10).await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
}

/// A relay started with `url` (and `env`), once it holds the test's slot,
/// the NATS server it publishes to (stopped on drop), and its stream.
async fn holding_relay(
    t: &TestDb,
    url: &str,
    env: &[(&'static str, String)],
) -> (Seawall, NatsServer, jetstream::Context) {
    let (nats, js) = crate::helpers::ledger_nats().await;
    let mut cfg = wal_env_on(url, &nats.url(), &[]);
    cfg.extend_from_slice(env);
    let relay = Seawall::spawn(&["relay"], &cfg);
    crate::wal::until_held(&relay, t, Duration::from_secs(60)).await;
    (relay, nats, js)
}

/// Commits ten events with ids `prefix-N` and waits until the stream holds
/// `total` recorded events.
async fn relays_ten(
    t: &TestDb,
    relay: &Seawall,
    js: &jetstream::Context,
    prefix: &str,
    total: usize,
) {
    commit_events(
        &t.db,
        (0..10)
            .map(|i| recorded(&format!("{prefix}-{i}"), None))
            .collect(),
    )
    .await;
    crate::wal_windows::until(
        relay,
        "the events relayed",
        Duration::from_secs(60),
        || async { stored_on(js, RECORDED_SUBJECT).await.len() == total },
    )
    .await;
}

/// A replication connection that goes silent without hanging up (a
/// primary whose host vanished, a network that drops everything): the
/// relay's own heartbeat gives the stream something to say, so a stream
/// silent for twice the relay's lease (5 s here) ends the session instead
/// of waiting on TCP for minutes; the relay reconnects once the server
/// answers again and relays what was written meanwhile. The proxy plays
/// the silence on the replication connection alone (the pool's
/// connections, which carry the heartbeat, go on).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_whose_server_goes_silent_ends_its_session_and_comes_back() {
    let t = TestDb::new(crate::support::Backend::Postgres).await;
    let upstream = upstream_of(&t.url);
    let proxy = Proxy::start(upstream).await;
    let url = proxy.url_for(&t.url, upstream);
    let (mut relay, _nats, js) = holding_relay(&t, &url, &[]).await;
    relays_ten(&t, &relay, &js, "before", 10).await;
    proxy.freeze_replication();
    crate::wal_windows::until(
        &relay,
        "the relay finds the stream silent",
        Duration::from_secs(60),
        || async { relay.log_text().contains("was silent") },
    )
    .await;
    proxy.thaw();
    relays_ten(&t, &relay, &js, "after", 20).await;
    assert!(relay.terminate().await.success(), "{}", relay.log_text());
    relay.assert_no_panic();
    crate::wal::drop_slot(&t);
}

/// A replication connection whose server is there and hears the relay but
/// sends nothing for several silences (as while its walsender reads
/// through a long stretch of other WAL): the relay asks the server through
/// its pool, finds its walsender, and keeps the session instead of
/// starting again from the same place for ever; once the stream speaks
/// again the events flow. The proxy holds back the server's side alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quiet_stream_whose_walsender_is_there_keeps_its_session() {
    let t = TestDb::new(crate::support::Backend::Postgres).await;
    let upstream = upstream_of(&t.url);
    let proxy = Proxy::start(upstream).await;
    let url = proxy.url_for(&t.url, upstream);
    let debug = ("SEAWALL_LOG", "info,worker::relay::wal=debug".to_owned());
    let (mut relay, _nats, js) = holding_relay(&t, &url, &[debug]).await;
    proxy.quiet_replication();
    let quiet = "its walsender is there: waiting on";
    crate::wal_windows::until(
        &relay,
        "the relay finds its walsender twice",
        Duration::from_secs(60),
        || async { relay.log_text().matches(quiet).count() >= 2 },
    )
    .await;
    proxy.thaw();
    relays_ten(&t, &relay, &js, "after", 10).await;
    let log = relay.log_text();
    assert!(!log.contains("was silent"), "{log}");
    assert!(relay.terminate().await.success(), "{log}");
    relay.assert_no_panic();
    crate::wal::drop_slot(&t);
}
