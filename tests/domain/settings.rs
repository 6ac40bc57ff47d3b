//! The example domain's settings: read from the file's `[domain]` table and
//! from `SEAWALL_<KEY>` variables, and checked at start-up.

use std::process::Output;

use crate::support::{binary_output, fails_naming};

fn migrate(file_text: &str, env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("s.db").display());
    let file = dir.path().join("seawall.toml");
    std::fs::write(&file, file_text).unwrap();
    let mut all = vec![("SEAWALL_DATABASE_URL", url.as_str())];
    all.extend_from_slice(env);
    binary_output(
        env!("CARGO_PKG_NAME"),
        &["--config", file.to_str().unwrap(), "migrate"],
        &all,
    )
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
