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
    wait_until("the audit line", Duration::from_secs(10), || async {
        api.log_text().contains("admin action")
    })
    .await;
    let log = api.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("admin action")).collect();
    assert_eq!(lines.len(), 1, "only the delete is audited:\n{log}");
    let line = lines[0];
    let action = format!("DELETE /api/v1/dead-letters/{id}");
    for needle in [
        action.as_str(),
        "rows=1",
        "status=204",
        "client=127.0.0.1:",
        "admin token",
    ] {
        assert!(line.contains(needle), "{needle} missing in {line}");
    }
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log file:\n{log}"
    );
    api.assert_no_panic();
}
