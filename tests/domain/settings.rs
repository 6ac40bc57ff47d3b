//! The example domain's settings: read from the file's `[domain]` table and
//! from `SEAWALL_<KEY>` variables, and checked at start-up.

use std::process::Output;

fn migrate(file_text: &str, env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("s.db").display());
    let file = dir.path().join("seawall.toml");
    std::fs::write(&file, file_text).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_seawall"));
    cmd.args(["--config", file.to_str().unwrap(), "migrate"])
        .env("SEAWALL_DATABASE_URL", &url);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run seawall")
}

fn fails_naming(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure");
    assert!(
        stderr.contains(needle),
        "stderr should name {needle}: {stderr}"
    );
}

#[test]
fn the_domain_settings_are_read_and_checked_from_the_file_and_the_environment() {
    fails_naming(
        &migrate("[domain]\ndemo_work_ms = \"slow\"\n", &[]),
        "demo_work_ms",
    );
    fails_naming(
        &migrate("", &[("SEAWALL_NOTIFY_WEBHOOK_URL", "ftp://example")]),
        "notify_webhook_url",
    );
    let out = migrate(
        "[domain]\nnotify_webhook_url = \"http://127.0.0.1:9/\"\n",
        &[("SEAWALL_DEMO_WORK_MS", "5")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
