//! A Prometheus server for the tests, run with the shipped scrape config
//! and alert rules (waits shortened), and the questions the tests ask it
//! through its HTTP API: what a query returns, which alerts are active.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::support::{free_port, http_client, wait_until};

pub(crate) fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// The shipped rules with every wait cut to seconds: `for:` to 3 s, the
/// five-minute and longer range windows to 15 s; and the WAL thresholds
/// lowered.
pub(crate) fn test_rules() -> String {
    let rules = std::fs::read_to_string(deploy_dir().join("prometheus/alerts.yml")).unwrap();
    let mut out = String::new();
    for line in rules.lines() {
        let line = match line.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 3s", &line[..line.len() - line.trim_start().len()]),
            None => line
                .replace("[5m]", "[15s]")
                .replace("[15m]", "[15s]")
                .replace("[1h]", "[15s]"),
        };
        out.push_str(&line);
        out.push('\n');
    }
    assert!(out.contains("for: 3s") && !out.contains("[5m]"));
    // An hour after a lost WAL slot is half a minute here, and a large WAL
    // backlog 256 MiB instead of 1 GiB.
    let shorter = out
        .replace("< 3600", "< 30")
        .replace("> 1073741824", "> 268435456");
    assert!(!shorter.contains("< 3600") && !shorter.contains("> 1073741824"));
    shorter
}

/// The shipped scrape config with the test's processes as targets, scraped
/// and evaluated every second. `targets` holds (job, namespace, addresses):
/// each job's shipped `static_configs` entries are replaced by one entry per
/// deployment of the test, its targets labelled with the deployment's
/// `namespace`, as the shipped file shows.
pub(crate) fn test_config(targets: &[(&str, &str, Vec<String>)]) -> String {
    let shipped = std::fs::read_to_string(deploy_dir().join("prometheus/prometheus.yml")).unwrap();
    let mut out = String::new();
    let mut job: Option<String> = None;
    let mut written: Vec<String> = Vec::new();
    // Whether the line before was a `- targets:` line: its `labels:` line
    // goes with it.
    let mut after_targets = false;
    for line in shipped.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if let Some(name) = trimmed.strip_prefix("- job_name: ") {
            job = Some(name.to_owned());
        }
        if trimmed.starts_with("scrape_interval:") || trimmed.starts_with("evaluation_interval:") {
            out.push_str(&line.replace("15s", "1s"));
            out.push('\n');
        } else if trimmed.starts_with("- targets:") {
            after_targets = true;
            let job = job.clone().unwrap();
            if written.contains(&job) {
                continue;
            }
            let entries: Vec<&(&str, &str, Vec<String>)> =
                targets.iter().filter(|(name, _, _)| *name == job).collect();
            assert!(!entries.is_empty(), "no targets for the shipped job {job}");
            for (_, namespace, addrs) in entries {
                out.push_str(&format!("{indent}- targets: {addrs:?}\n"));
                out.push_str(&format!("{indent}  labels: {{namespace: {namespace}}}\n"));
            }
            written.push(job);
        } else if after_targets && trimmed.starts_with("labels:") {
            after_targets = false;
        } else {
            after_targets = false;
            out.push_str(line);
            out.push('\n');
        }
    }
    for (name, _, _) in targets {
        assert!(
            written.iter().any(|job| job == name),
            "the shipped config has no job {name}"
        );
    }
    out
}

/// A Prometheus server, killed on drop.
pub(crate) struct Prometheus {
    child: std::process::Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    pub(crate) fn start(config: &str, rules: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        std::fs::write(dir.path().join("alerts.yml"), rules).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = std::process::Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian's prometheus package; scripts/test installs it)");
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    async fn get(&self, path: &str, query: &[(&str, &str)]) -> Option<Value> {
        let url = reqwest::Url::parse_with_params(&format!("{}{path}", self.base), query).ok()?;
        let resp = http_client().get(url).send().await.ok()?;
        let body: Value = resp.json().await.ok()?;
        (body["status"] == "success").then(|| body["data"].clone())
    }

    /// The instant vector `expr` evaluates to now.
    pub(crate) async fn query(&self, expr: &str) -> Vec<Value> {
        self.get("/api/v1/query", &[("query", expr)])
            .await
            .and_then(|d| d["result"].as_array().cloned())
            .unwrap_or_default()
    }

    /// Active alerts as (name, state) pairs.
    pub(crate) async fn alerts(&self) -> BTreeSet<(String, String)> {
        self.active_in()
            .await
            .into_iter()
            .map(|(name, _, state)| (name, state))
            .collect()
    }

    /// Active alerts as (name, namespace, state) triples: which deployment
    /// each is about ("" for an alert without a namespace).
    pub(crate) async fn active_in(&self) -> BTreeSet<(String, String, String)> {
        self.get("/api/v1/alerts", &[])
            .await
            .and_then(|d| d["alerts"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|a| {
                (
                    a["labels"]["alertname"].as_str().unwrap_or("").to_owned(),
                    a["labels"]["namespace"].as_str().unwrap_or("").to_owned(),
                    a["state"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }

    /// Waits until the active alerts are exactly `expected`, as (name,
    /// namespace) pairs, all firing: each fault's alerts come from its own
    /// deployment, and none from another.
    pub(crate) async fn expect_firing_in(&self, expected: &[(&str, &str)]) {
        let wanted: BTreeSet<(String, String, String)> = expected
            .iter()
            .map(|(name, namespace)| {
                (
                    (*name).to_owned(),
                    (*namespace).to_owned(),
                    "firing".to_owned(),
                )
            })
            .collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let active = self.active_in().await;
            if active == wanted {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not only {expected:?} firing; active (alert, namespace, state): {active:?}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Asserts that every active alert names its deployment: a rule that
    /// aggregates the `namespace` label away fails here.
    async fn assert_namespaced(&self) {
        let bare: Vec<(String, String, String)> = self
            .active_in()
            .await
            .into_iter()
            .filter(|(_, namespace, _)| namespace.is_empty())
            .collect();
        assert!(
            bare.is_empty(),
            "alerts without their deployment's namespace: {bare:?}"
        );
    }

    pub(crate) async fn active(&self) -> BTreeSet<String> {
        self.alerts()
            .await
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    /// Waits until every alert of `expected` fires, then asserts that no
    /// other alert is pending or firing.
    pub(crate) async fn expect_firing(&self, expected: &[&str]) {
        let (fired, alerts) = self
            .poll(|alerts: &BTreeSet<(String, String)>| {
                expected
                    .iter()
                    .all(|name| alerts.contains(&((*name).to_owned(), "firing".to_owned())))
            })
            .await;
        assert!(
            fired,
            "{expected:?} not all firing; active: {alerts:?}\n{}",
            self.log()
        );
        let active = self.active().await;
        let wanted: BTreeSet<String> = expected.iter().map(|n| (*n).to_owned()).collect();
        assert_eq!(active, wanted, "only the fault's alerts are active");
        self.assert_namespaced().await;
    }

    /// Waits until exactly the alerts of `expected` are active, all
    /// firing: for a fault that follows another, whose alerts take a few
    /// evaluations to resolve.
    pub(crate) async fn expect_only(&self, expected: &[&str]) {
        let wanted: BTreeSet<(String, String)> = expected
            .iter()
            .map(|name| ((*name).to_owned(), "firing".to_owned()))
            .collect();
        let (fired, alerts) = self.poll(|alerts| *alerts == wanted).await;
        assert!(
            fired,
            "not only {expected:?} firing; active: {alerts:?}\n{}",
            self.log()
        );
        self.assert_namespaced().await;
    }

    /// Waits until no alert is pending or firing.
    pub(crate) async fn expect_quiet(&self) {
        let (quiet, alerts) = self.poll(BTreeSet::is_empty).await;
        assert!(quiet, "alerts still active: {alerts:?}\n{}", self.log());
    }

    /// Polls the active alerts until `done` holds (up to 90 s): whether it
    /// did, and the alerts seen last.
    async fn poll(
        &self,
        done: impl Fn(&BTreeSet<(String, String)>) -> bool,
    ) -> (bool, BTreeSet<(String, String)>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let alerts = self.alerts().await;
            if done(&alerts) {
                return (true, alerts);
            }
            if tokio::time::Instant::now() > deadline {
                return (false, alerts);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Every panel query of `deploy/grafana/seawall.json`, with Grafana's
/// `$__rate_interval` as one minute, returns at least one series.
pub(crate) async fn dashboard_panels_have_data(prom: &Prometheus) {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy_dir().join("grafana/seawall.json")).unwrap(),
    )
    .unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
        })
        .collect();
    assert!(exprs.len() >= 15, "{exprs:?}");
    for expr in &exprs {
        wait_until(
            &format!("data for the panel query {expr}"),
            Duration::from_secs(30),
            || async { !prom.query(expr).await.is_empty() },
        )
        .await;
    }
}
