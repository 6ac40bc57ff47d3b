//! `admin_database_url`: the admin API reads from a replica of the Patroni
//! cluster (`scripts/services start ha`) and writes to the primary, so its
//! pages answer while the primary is down and its writes say why they fail.
//! The process's own replica pool: a replica that is down does not stop
//! start-up, a replica URL that can never work does.

use std::process::Command;
use std::time::Duration;

use chrono::Duration as Age;
use sea_orm::{ConnectionTrait, DbBackend, EntityTrait, Statement};

use entity::{dead_letter, outbox_message};

use crate::harness::{TOKEN, TestApi, dead, outbox_row};
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, connect, free_port, http_client, server_url, wait_until};

/// The cluster's leader with its PostgreSQL stopped and Patroni paused (so
/// nothing fails over); resumed on drop, whatever the test did.
struct StoppedPrimary {
    config: String,
}

impl StoppedPrimary {
    fn stop() -> Self {
        let dir = server_url("SEAWALL_HA_DIR");
        let config = format!("{dir}/pg1/patroni.yml");
        let list = patronictl(&config, &["list", "-f", "json"]);
        let members: Vec<serde_json::Value> = serde_json::from_str(&list).expect("patronictl list");
        let leader = members
            .iter()
            .find(|m| m["Role"] == "Leader")
            .and_then(|m| m["Member"].as_str())
            .expect("the cluster has a leader")
            .to_owned();
        patronictl(&config, &["pause", "--wait"]);
        let stopped = Self { config };
        crate::support::postgres::as_postgres(&[
            &format!("{}/pg_ctl", crate::support::postgres::BIN),
            "-D",
            &format!("{dir}/{leader}/data"),
            "-m",
            "fast",
            "-w",
            "stop",
        ]);
        stopped
    }
}

impl Drop for StoppedPrimary {
    fn drop(&mut self) {
        // Patroni starts the stopped node again (or promotes the replica).
        patronictl(&self.config, &["resume", "--wait"]);
    }
}

fn patronictl(config: &str, args: &[&str]) -> String {
    let out = Command::new("patronictl")
        .args(["-c", config])
        .args(args)
        .output()
        .expect("patronictl runs");
    assert!(
        out.status.success(),
        "patronictl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn pages_answer_from_the_replica_while_the_primary_is_stopped_and_writes_get_503() {
    let t = TestDb::on_ha_cluster().await;
    outbox_message::Entity::insert(outbox_row(
        "r-1",
        "ledger.recorded",
        "dead",
        Age::minutes(5),
    ))
    .exec(&t.db)
    .await
    .unwrap();
    dead_letter::Entity::insert(dead("ledger", Some("r-2")))
        .exec(&t.db)
        .await
        .unwrap();
    let name = t.url.rsplit('/').next().unwrap().to_owned();
    let reads = connect(
        &format!("{}/{name}", server_url("SEAWALL_HA_PG_REPLICA_URL")),
        4,
    )
    .await;
    let primary = t.db.clone();
    wait_until("the replica has the rows", Duration::from_secs(30), || {
        let reads = reads.clone();
        async move {
            matches!(dead_letter::Entity::find().all(&reads).await, Ok(rows) if rows.len() == 1)
        }
    })
    .await;
    let api = TestApi::start_on(t, Some(TOKEN), Some(reads)).await;

    let (status, stats) = api.get("/api/v1/stats").await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["replica"]["in_recovery"], true, "{stats}");
    assert_eq!(stats["replica"]["streaming"], true, "{stats}");
    assert!(stats["replica"]["behind_bytes"].is_i64(), "{stats}");
    let id = api.get("/api/v1/outbox").await.1["items"][0]["id"]
        .as_i64()
        .expect("the row is listed");

    let stopped = StoppedPrimary::stop();
    assert!(
        primary
            .execute_raw(Statement::from_string(DbBackend::Postgres, "SELECT 1"))
            .await
            .is_err(),
        "the primary is down"
    );
    let (status, page) = api.get("/api/v1/outbox").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["items"][0]["message_id"], "r-1", "{page}");
    let (status, detail) = api.get(&format!("/api/v1/outbox/{id}")).await;
    assert_eq!(status, 200, "{detail}");
    let (status, letters) = api.get("/api/v1/dead-letters").await;
    assert_eq!(status, 200, "{letters}");
    assert_eq!(letters["items"][0]["message_id"], "r-2", "{letters}");
    let (status, stats) = api.get("/api/v1/stats").await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["outbox"]["dead"], 1, "{stats}");
    assert!(
        stats["replica"]["behind_bytes"].is_null(),
        "the primary's position is unknown while it is down: {stats}"
    );
    // The stopped primary closed its WAL senders; the replica's receiver
    // retries without streaming, and the card must say nothing new arrives.
    wait_until(
        "the replica reports it is not streaming",
        Duration::from_secs(90),
        || {
            let api = &api;
            async move { api.get("/api/v1/stats").await.1["replica"]["streaming"] == false }
        },
    )
    .await;
    // The API's job (showing what is stuck) goes on: it stays ready.
    let ready = crate::support::http_client()
        .get(format!("{}/readyz", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap());
    // The metrics say so too, and leave the lag out: a replica cut off has
    // replayed all it received, so its lag would read 0.
    let (_, metrics) = api.metrics().await;
    assert!(
        metrics.contains("\nseawall_admin_replica_streaming 0\n"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("\nseawall_admin_replica_lag_seconds "),
        "{metrics}"
    );

    let (status, err) = api.post(&format!("/api/v1/outbox/{id}/retry"), None).await;
    assert_eq!(status, 503, "{err}");
    assert_eq!(err["error"]["code"], "database_unavailable", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("failover")),
        "{err}"
    );

    drop(stopped);
    wait_until(
        "the cluster takes writes again",
        Duration::from_secs(90),
        || {
            let primary = primary.clone();
            async move {
                primary
                    .execute_raw(Statement::from_string(
                        DbBackend::Postgres,
                        "SELECT 1 WHERE NOT pg_is_in_recovery()",
                    ))
                    .await
                    .is_ok_and(|r| r.rows_affected() == 1)
            }
        },
    )
    .await;
    let (status, row) = api.post(&format!("/api/v1/outbox/{id}/retry"), None).await;
    assert_eq!(
        status, 200,
        "the write works again after the failover: {row}"
    );
    // SeawallAdminReplicaCutOff's runbook: the primary back (or a new one
    // elected), the metric the alert reads is 0 no more. Patroni drops the
    // leader key of a paused leader whose PostgreSQL is stopped, so on
    // resume either node may lead: the old leader again, and the replica
    // streams from it (1); or the replica, promoted, and the pool's
    // connections (which HAProxy sends to the leader while no replica runs)
    // read from a primary, which has no receiver (absent).
    wait_until(
        "the replica streams again or the reads are on the new primary",
        Duration::from_secs(120),
        || {
            let api = &api;
            async move {
                let metrics = api.metrics().await.1;
                metrics.contains("\nseawall_admin_replica_streaming 1\n")
                    || (!metrics.contains("\nseawall_admin_replica_streaming ")
                        && api.get("/api/v1/stats").await.1["replica"]["in_recovery"] == false)
            }
        },
    )
    .await;
}

/// `seawall api` with `admin_database_url` set: the process itself, so the
/// replica pool is the one start-up opens.
fn api_with_replica(t: &TestDb, replica_url: String, port: u16) -> Seawall {
    Seawall::spawn(
        &["api"],
        &[
            ("SEAWALL_DATABASE_URL", t.url.clone()),
            ("SEAWALL_ADMIN_DATABASE_URL", replica_url),
            ("SEAWALL_API_ADDR", format!("127.0.0.1:{port}")),
            ("SEAWALL_ADMIN_TOKEN", TOKEN.into()),
            ("SEAWALL_NATS_URL", server_url("SEAWALL_TEST_NATS_URL")),
        ],
    )
}

#[tokio::test]
async fn with_the_replica_down_the_api_starts_is_ready_and_its_reads_answer_503() {
    let t = TestDb::new(Backend::Postgres).await;
    let port = free_port();
    // A port nobody listens on: the replica's machine is down.
    let api = api_with_replica(
        &t,
        format!("postgres://postgres@127.0.0.1:{}/x", free_port()),
        port,
    );
    let http = http_client();
    let base = format!("http://127.0.0.1:{port}");
    wait_until("the API is ready", Duration::from_secs(60), || {
        let req = http.get(format!("{base}/readyz"));
        async move { req.send().await.is_ok_and(|r| r.status() == 200) }
    })
    .await;
    let res = http
        .get(format!("{base}/api/v1/outbox"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("a JSON answer, not a timed-out request");
    assert_eq!(res.status(), 503);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "database_unavailable", "{body}");
    // Writes go to the primary, which is up.
    let res = http
        .post(format!("{base}/api/v1/prune"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        api.log_text()
            .contains("the admin read replica is unreachable"),
        "{}",
        api.log_text()
    );
    api.assert_no_panic();
}

#[tokio::test]
async fn a_replica_url_that_can_never_work_stops_startup_naming_the_key() {
    let t = TestDb::new(Backend::Postgres).await;
    let (server, _) = t.url.rsplit_once('/').expect("a database URL");
    let mut api = api_with_replica(&t, format!("{server}/no_such_database"), free_port());
    let status = tokio::time::timeout(Duration::from_secs(60), api.wait())
        .await
        .expect("start-up refuses the replica instead of serving");
    assert!(!status.success());
    let log = api.log_text();
    assert!(
        log.contains("admin_database_url") && log.contains("no_such_database"),
        "{log}"
    );
    api.assert_no_panic();
}
