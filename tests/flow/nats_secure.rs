//! NATS as it is deployed: TLS with a private CA, user logins, per-user
//! subject permissions. seawall runs with the right settings; each wrong one
//! stops start-up with a message naming the key; a publish the server
//! forbids is a failed attempt with the server's reason.

use std::path::Path;
use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter};

use entity::outbox_message;

use crate::helpers::env;
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::tls::TestCerts;
use crate::support::{Backend, TestDb, rows, wait_until};

/// A server that requires TLS (certificates of `dir/ca.pem`) and a login:
/// `seawall` may publish anywhere but `ledger.forbidden`; `admin` anything.
async fn secured_server() -> (NatsServer, std::path::PathBuf) {
    let certs = TestCerts::generate();
    let server = NatsServer::start_with_config(|port, dir| {
        certs.write(dir);
        let d = dir.display();
        format!(
            r#"
listen: "127.0.0.1:{port}"
jetstream {{ store_dir: "{d}/js" }}
tls {{ cert_file: "{d}/cert.pem", key_file: "{d}/key.pem", timeout: 2 }}
authorization {{
  users = [
    {{ user: seawall, password: s3cret, permissions: {{ publish: {{ deny: ["ledger.forbidden"] }} }} }}
    {{ user: admin, password: admin }}
  ]
}}
"#
        )
    })
    .await;
    let ca = server.dir().join("ca.pem");
    (server, ca)
}

async fn admin_client(server: &NatsServer, ca: &Path) -> async_nats::Client {
    // As seawall's binaries do: the tree enables more than one rustls
    // provider, so none is picked by default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin".into())
        .add_root_certificates(ca.to_path_buf())
        .require_tls(true)
        .connect(server.url())
        .await
        .expect("the admin login works")
}

/// With the CA and the login, `run` provisions, consumes and relays; an
/// event on a subject its user may not publish to fails with the server's
/// reason in `last_error`, and the rest keep flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seawall_runs_over_tls_with_a_login_and_records_a_refused_publish() {
    let (server, ca) = secured_server().await;
    let t = TestDb::new(Backend::Sqlite).await;
    let ca_file = ca.display().to_string();
    let mut seawall = Seawall::spawn(
        &["run"],
        &env(
            &t.url,
            &server.url(),
            &[
                ("SEAWALL_NATS_USER", "seawall"),
                ("SEAWALL_NATS_PASSWORD", "s3cret"),
                ("SEAWALL_NATS_CA_FILE", &ca_file),
            ],
        ),
    );
    let js = jetstream::new(admin_client(&server, &ca).await);
    crate::support::wait_for_stream(&js, "LEDGER").await;
    let forbidden = {
        let mut row = rows::event("forbidden-1".into(), chrono::Utc::now());
        row.subject = Set("ledger.forbidden".into());
        row
    };
    outbox_message::Entity::insert(forbidden)
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    let msg = PublishMessage::build()
        .payload(br#"{"account_id":"a","amount":5}"#.to_vec().into())
        .message_id("secure-1");
    js.send_publish("ledger.record", msg)
        .await
        .unwrap()
        .await
        .unwrap();
    wait_until(
        "the entry's event published over TLS",
        Duration::from_secs(60),
        || async {
            outbox_message::Entity::find()
                .filter(outbox_message::Column::Subject.eq("ledger.recorded"))
                .filter(outbox_message::Column::PublishedAt.is_not_null())
                .one(&t.db)
                .await
                .unwrap()
                .is_some()
        },
    )
    .await;
    let forbidden = || async {
        outbox_message::Entity::find()
            .filter(outbox_message::Column::MessageId.eq("forbidden-1"))
            .one(&t.db)
            .await
            .unwrap()
            .unwrap()
    };
    wait_until(
        "the refused publish recorded",
        Duration::from_secs(60),
        || async { forbidden().await.attempts >= 1 },
    )
    .await;
    let row = forbidden().await;
    let error = row.last_error.unwrap_or_default();
    assert!(row.published_at.is_none());
    assert!(
        error.contains("Permissions Violation for Publish to \"ledger.forbidden\""),
        "{error}"
    );
    seawall.assert_no_panic();
    seawall.terminate().await;
}

/// A wrong setting: what it is, the variables, the key its error must name.
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a str);

/// Each wrong NATS setting stops `consume` at start-up, naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_wrong_nats_setting_fails_at_start_up_naming_its_key() {
    let (server, ca) = secured_server().await;
    let t = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.creds");
    std::fs::write(&garbage, "not a credential").unwrap();
    let ca_file = ca.display().to_string();
    let garbage = garbage.display().to_string();
    let cases: Vec<Case> = vec![
        (
            "a wrong password",
            vec![
                ("SEAWALL_NATS_USER", "seawall"),
                ("SEAWALL_NATS_PASSWORD", "wrong"),
                ("SEAWALL_NATS_CA_FILE", &ca_file),
            ],
            "nats_password",
        ),
        (
            "no login at all",
            vec![("SEAWALL_NATS_CA_FILE", &ca_file)],
            "nats_user",
        ),
        (
            "no CA for the server's certificate",
            vec![
                ("SEAWALL_NATS_USER", "seawall"),
                ("SEAWALL_NATS_PASSWORD", "s3cret"),
            ],
            "nats_ca_file",
        ),
        (
            "a CA file that does not exist",
            vec![("SEAWALL_NATS_CA_FILE", "/nonexistent/ca.pem")],
            "nats_ca_file",
        ),
        (
            "a user without a password",
            vec![("SEAWALL_NATS_USER", "seawall")],
            "nats_password",
        ),
        (
            "a creds file that holds no credential",
            vec![("SEAWALL_NATS_CREDS_FILE", &garbage)],
            "nats_creds_file",
        ),
        (
            "a client certificate without its key",
            vec![("SEAWALL_NATS_CERT_FILE", &ca_file)],
            "nats_key_file",
        ),
    ];
    for (what, settings, key) in cases {
        let mut seawall = Seawall::spawn(&["consume"], &env(&t.url, &server.url(), &settings));
        let status = tokio::time::timeout(Duration::from_secs(30), seawall.wait())
            .await
            .unwrap_or_else(|_| panic!("{what}: start-up did not stop"));
        let log = seawall.log_text();
        assert!(!status.success(), "{what}: started anyway");
        assert!(log.contains(key), "{what}: the error names {key}:\n{log}");
        seawall.assert_no_panic();
    }
}
