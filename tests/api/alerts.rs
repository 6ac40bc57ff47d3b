//! The alert rules that ship with seawall (`deploy/prometheus/alerts.yml`):
//! valid, each tested by promtool with series that fire it and series that
//! keep it quiet, and naming only metrics a running seawall really exports.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};

use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, http_client, wait_until};

fn rules_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus")
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(rules_dir())
        .output()
        .expect("promtool (Debian's prometheus package; scripts/test installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// The alert names in the rules file.
fn alert_names() -> Vec<String> {
    std::fs::read_to_string(rules_dir().join("alerts.yml"))
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_alert_rule_is_valid_and_fires_and_stays_quiet_as_tested() {
    assert!(promtool(&["check", "rules", "alerts.yml"]).contains("SUCCESS"));
    assert!(promtool(&["test", "rules", "alerts.test.yml"]).contains("SUCCESS"));
    // Each alert has a case where it fires and one where it stays quiet.
    let tests = std::fs::read_to_string(rules_dir().join("alerts.test.yml")).unwrap();
    let names = alert_names();
    assert!(names.len() >= 7, "{names:?}");
    for name in names {
        let cases: Vec<&str> = tests
            .split("alertname: ")
            .skip(1)
            .filter(|case| case.starts_with(&format!("{name}\n")))
            .collect();
        assert!(
            cases.iter().any(|c| c.contains("exp_alerts: []")),
            "{name} has no quiet case"
        );
        assert!(
            cases.iter().any(|c| c.contains("exp_labels")),
            "{name} has no firing case"
        );
    }
}

/// Every metric a rule names is in a running seawall's scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_metric_an_alert_names_is_exported() {
    // WAL mode on PostgreSQL exports every metric: the WAL relay's and the
    // table relay's, which also runs in that mode.
    let t = TestDb::new(Backend::Postgres).await;
    let nats = NatsServer::start().await;
    let port = crate::support::free_port();
    let mut seawall = Seawall::spawn(
        &["run"],
        &[
            ("SEAWALL_DATABASE_URL", t.url.clone()),
            ("SEAWALL_NATS_URL", nats.url()),
            ("SEAWALL_API_ADDR", format!("127.0.0.1:{port}")),
            ("SEAWALL_RELAY_POLL_MS", "100".to_owned()),
            ("SEAWALL_OUTBOX_MODE", "wal".to_owned()),
        ],
    );
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    crate::support::wait_for_stream(&js, "LEDGER").await;
    // One message, so the per-consumer counters have a series.
    let msg = PublishMessage::build()
        .payload(br#"{"account_id":"a","amount":5}"#.to_vec().into())
        .message_id("alert-metrics-1");
    js.send_publish("ledger.record", msg)
        .await
        .unwrap()
        .await
        .unwrap();
    let rules = std::fs::read_to_string(rules_dir().join("alerts.yml")).unwrap();
    let mut wanted: Vec<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("seawall_"))
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    // Exported only with a read replica (tests/api/replica.rs checks it),
    // and once a WAL slot was lost (tests/api/prometheus.rs).
    wanted.retain(|name| {
        !matches!(
            *name,
            "seawall_admin_replica_streaming" | "seawall_wal_slot_recreated_timestamp_seconds"
        )
    });
    assert!(wanted.len() >= 7, "{wanted:?}");
    let http = http_client();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let scrape = || async {
        match http.get(&url).send().await {
            Ok(resp) => resp.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    };
    let exported = |text: &str, name: &str| {
        text.lines().any(|l| {
            !l.starts_with('#') && l.starts_with(name) && l[name.len()..].starts_with(['{', ' '])
        })
    };
    wait_until(
        "every alerted metric in the scrape",
        Duration::from_secs(60),
        || async {
            let text = scrape().await;
            wanted.iter().all(|name| exported(&text, name))
        },
    )
    .await;
    seawall.assert_no_panic();
    seawall.terminate().await;
    let slot = worker::relay::wal::default_slot_name(&t.url);
    // The server ends the relay's walsender a moment after the process.
    let active =
        format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active");
    wait_until("the slot let go", Duration::from_secs(30), || async {
        crate::support::pg_count(&t.db, &active).await == 0
    })
    .await;
    assert!(worker::relay::wal::drop_slot(&t.db, &slot).await.unwrap());
}
