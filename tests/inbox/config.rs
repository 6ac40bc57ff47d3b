//! Start-up refuses bad configuration, naming the key.

use std::process::Output;

fn seawall(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_seawall"));
    cmd.args(args);
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
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_non_numeric_setting_stops_startup_naming_the_key() {
    let out = seawall(&["migrate"], &[("SEAWALL_ACK_WAIT_MS", "soon")]);
    fails_naming(&out, "ack_wait_ms");
}

#[test]
fn an_unsupported_database_url_stops_startup_naming_the_key() {
    let out = seawall(
        &["migrate"],
        &[("SEAWALL_DATABASE_URL", "redis://localhost")],
    );
    fails_naming(&out, "database_url");
}

#[test]
fn a_missing_config_file_and_an_unknown_key_are_reported() {
    let out = seawall(&["--config", "/nonexistent/seawall.toml", "migrate"], &[]);
    fails_naming(&out, "/nonexistent/seawall.toml");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("seawall.toml");
    std::fs::write(&file, "max_delivr = 3\n").unwrap();
    let out = seawall(&["--config", file.to_str().unwrap(), "migrate"], &[]);
    fails_naming(&out, "max_delivr");
    std::fs::write(&file, "max_deliver = 0\n").unwrap();
    let out = seawall(&["--config", file.to_str().unwrap(), "migrate"], &[]);
    fails_naming(&out, "max_deliver");
}

#[test]
fn migrate_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("m.db").display());
    for _ in 0..2 {
        let out = seawall(&["migrate"], &[("SEAWALL_DATABASE_URL", &url)]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
