//! The audit trail of a real `api` process with the default log filter:
//! a state-changing call leaves one line naming the action, the rows it
//! changed, the client and the identity; reads leave none; a log written
//! to a file carries no colour codes.

use std::time::Duration;

use sea_orm::EntityTrait;

use entity::dead_letter;

use crate::harness::{TOKEN, dead};
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, free_port, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_action_is_audited_at_the_default_log_level() {
    let t = TestDb::new(Backend::Sqlite).await;
    let nats = NatsServer::start().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let base = format!("http://{addr}");
    let api = Seawall::spawn(
        &["api"],
        &[
            ("SEAWALL_DATABASE_URL", t.url.clone()),
            ("SEAWALL_NATS_URL", nats.url()),
            ("SEAWALL_API_ADDR", addr.clone()),
            ("SEAWALL_ADMIN_TOKEN", TOKEN.to_owned()),
            (
                "SEAWALL_ADMIN_TOKENS",
                "grafana:read:grafana-secret, ops:write:ops-secret".to_owned(),
            ),
            // The default filter, as a process started without SEAWALL_LOG.
            ("SEAWALL_LOG", String::new()),
        ],
    );
    let http = crate::support::http_client();
    wait_until("the API to answer", Duration::from_secs(30), || async {
        http.get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    let id = dead_letter::Entity::insert(dead("ledger", Some("audited")))
        .exec(&t.db)
        .await
        .unwrap()
        .last_insert_id;
    let list = http
        .get(format!("{base}/api/v1/dead-letters"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), 200);
    let deleted = http
        .delete(format!("{base}/api/v1/dead-letters/{id}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    // A read-only token reads, and is refused a change (403, nothing
    // changed, nothing audited); another named token changes, and the trail
    // names it.
    let second = dead_letter::Entity::insert(dead("ledger", Some("audited-2")))
        .exec(&t.db)
        .await
        .unwrap()
        .last_insert_id;
    let call = |method: reqwest::Method, path: String, token: &'static str| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let resp = http
                .request(method, format!("{base}{path}"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.text().await.unwrap())
        }
    };
    assert_eq!(
        call(
            reqwest::Method::GET,
            "/api/v1/stats".into(),
            "grafana-secret"
        )
        .await
        .0,
        200
    );
    let (status, body) = call(
        reqwest::Method::DELETE,
        format!("/api/v1/dead-letters/{second}"),
        "grafana-secret",
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("read-only"), "{body}");
    assert!(
        dead_letter::Entity::find_by_id(second)
            .one(&t.db)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        call(
            reqwest::Method::DELETE,
            format!("/api/v1/dead-letters/{second}"),
            "ops-secret"
        )
        .await
        .0,
        204
    );
    wait_until("the audit lines", Duration::from_secs(10), || async {
        api.log_text().matches("admin action").count() >= 2
    })
    .await;
    let log = api.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("admin action")).collect();
    assert_eq!(lines.len(), 2, "only the deletes are audited:\n{log}");
    assert!(lines[1].contains("token ops"), "{}", lines[1]);
    let line = lines[0];
    let action = format!("DELETE /api/v1/dead-letters/{id}");
    for needle in [
        action.as_str(),
        "rows=1",
        "status=204",
        "client=127.0.0.1:",
        "token admin",
    ] {
        assert!(line.contains(needle), "{needle} missing in {line}");
    }
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log file:\n{log}"
    );
    api.assert_no_panic();
}

#[test]
fn a_malformed_token_list_stops_startup_naming_the_key() {
    for tokens in [
        "ops",
        "ops:admin:secret",
        "a:read:same,b:write:same",
        "a:read:",
        "a:read:CHANGE-ME",
    ] {
        let out = crate::support::testbed_output(
            &["migrate"],
            &[
                ("SEAWALL_DATABASE_URL", "sqlite::memory:"),
                ("SEAWALL_ADMIN_TOKENS", tokens),
            ],
        );
        crate::support::fails_naming(&out, "admin_tokens");
    }
}

#[test]
fn the_manifests_placeholder_token_stops_startup() {
    let out = crate::support::testbed_output(
        &["migrate"],
        &[
            ("SEAWALL_DATABASE_URL", "sqlite::memory:"),
            ("SEAWALL_ADMIN_TOKEN", "CHANGE-ME"),
        ],
    );
    crate::support::fails_naming(&out, "admin_token");
}
