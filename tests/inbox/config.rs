//! Start-up refuses bad configuration, naming the key.

use std::process::Output;

use crate::support::{fails_naming, testbed_output as seawall};

#[test]
fn a_non_numeric_setting_stops_startup_naming_the_key() {
    let out = seawall(&["migrate"], &[("SEAWALL_ACK_WAIT_MS", "soon")]);
    fails_naming(&out, "ack_wait_ms");
}

#[test]
fn an_inbox_batch_past_the_cap_stops_startup_naming_the_key() {
    let out = seawall(&["migrate"], &[("SEAWALL_INBOX_BATCH", "33")]);
    fails_naming(&out, "inbox_batch");
    fails_naming(&out, "must be at most 32");
}

#[test]
fn an_unknown_log_format_or_filter_stops_startup_naming_the_variable() {
    let out = seawall(&["migrate"], &[("SEAWALL_LOG_FORMAT", "xml")]);
    fails_naming(
        &out,
        "SEAWALL_LOG_FORMAT must be `text` or `json`, got \"xml\"",
    );
    let out = seawall(&["migrate"], &[("SEAWALL_LOG", "worker=loud")]);
    fails_naming(&out, "SEAWALL_LOG is not a log filter");
}

#[test]
fn wal_mode_off_postgresql_or_a_bad_slot_name_stops_startup_naming_the_key() {
    let out = seawall(
        &["migrate"],
        &[
            ("SEAWALL_OUTBOX_MODE", "wal"),
            ("SEAWALL_DATABASE_URL", "sqlite://x.db"),
        ],
    );
    fails_naming(&out, "outbox_mode");
    let out = seawall(&["migrate"], &[("SEAWALL_OUTBOX_MODE", "rows")]);
    fails_naming(&out, "outbox_mode");
    let out = seawall(
        &["migrate"],
        &[
            ("SEAWALL_DATABASE_URL", "postgres://127.0.0.1:1/x"),
            ("SEAWALL_WAL_SLOT", "Bad-Name"),
        ],
    );
    fails_naming(&out, "wal_slot");
}

#[test]
fn an_admin_replica_on_another_engine_stops_startup_naming_the_key() {
    let out = seawall(
        &["migrate"],
        &[
            ("SEAWALL_DATABASE_URL", "postgres://127.0.0.1:1/x"),
            ("SEAWALL_ADMIN_DATABASE_URL", "mysql://127.0.0.1:1/x"),
        ],
    );
    fails_naming(&out, "admin_database_url");
}

#[test]
fn an_unsupported_database_url_stops_startup_naming_the_key() {
    let out = seawall(
        &["migrate"],
        &[("SEAWALL_DATABASE_URL", "redis://localhost")],
    );
    fails_naming(&out, "database_url");
}

/// A connection option neither the pool nor the WAL relay would honour
/// (here a silent downgrade from channel binding) stops start-up naming
/// the key and the option, before any connection is tried.
#[test]
fn a_postgresql_option_no_connection_honours_stops_startup_naming_it() {
    for (url, named) in [
        (
            "postgres://127.0.0.1:1/x?channel_binding=require",
            "channel_binding",
        ),
        ("postgres://a:1,b:1/x", "several hosts"),
    ] {
        let out = seawall(&["migrate"], &[("SEAWALL_DATABASE_URL", url)]);
        fails_naming(&out, "database_url");
        fails_naming(&out, named);
    }
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

/// JetStream reads a max age of zero as "keep forever": markers must then
/// not be pruned by a derived age, which would be the ack horizon alone.
#[test]
fn a_stream_kept_forever_needs_an_explicit_inbox_retention() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
    let out = refused_at_start_up(
        "api",
        &[
            ("SEAWALL_DATABASE_URL", &url),
            ("SEAWALL_API_ADDR", "127.0.0.1:0"),
            ("SEAWALL_STREAM_MAX_AGE_MS", "0"),
        ],
    );
    fails_naming(&out, "inbox_retention_ms");
    fails_naming(&out, "stream_max_age_ms = 0");
}

/// A pool smaller than the handlers and rounds in flight makes them queue
/// on each other until the acquire timeout: refused, naming the keys.
#[test]
fn a_pool_smaller_than_the_work_in_flight_stops_startup() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
    let out = refused_at_start_up(
        "consume",
        &[
            ("SEAWALL_DATABASE_URL", &url),
            ("SEAWALL_NATS_URL", "nats://127.0.0.1:1"),
            ("SEAWALL_DB_MAX_CONNECTIONS", "4"),
        ],
    );
    fails_naming(&out, "db_max_connections");
    fails_naming(&out, "consumer_concurrency");
}

/// Runs `seawall <command>` and returns its output once it exits. Start-up
/// either refuses at once or goes on to serve; a process still running after
/// a generous bound has accepted the settings, and the test fails.
fn refused_at_start_up(command: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(crate::support::binary::path("seawall-testbed"));
    cmd.arg(command)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("seawall {command} accepted settings it should refuse: {env:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_misspelt_environment_variable_stops_startup_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("s.db").display());
    let out = seawall(
        &["migrate"],
        &[
            ("SEAWALL_DATABASE_URL", &url),
            ("SEAWALL_RELAY_BATCHSIZE", "5"),
        ],
    );
    fails_naming(&out, "SEAWALL_RELAY_BATCHSIZE");
    // The scripts' and tests' own variables are not settings, and pass.
    let out = seawall(
        &["migrate"],
        &[
            ("SEAWALL_DATABASE_URL", &url),
            ("SEAWALL_TEST_ANYTHING", "1"),
            ("SEAWALL_KEEP_SERVICES", "1"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_unknown_key_in_the_domain_table_stops_startup_naming_it() {
    // Whatever the domain is, its settings refuse a key they do not have.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("s.db").display());
    let file = dir.path().join("seawall.toml");
    std::fs::write(&file, "[domain]\nno_such_domain_key = 1\n").unwrap();
    let out = seawall(
        &["--config", file.to_str().unwrap(), "migrate"],
        &[("SEAWALL_DATABASE_URL", &url)],
    );
    fails_naming(&out, "no_such_domain_key");
}

#[test]
fn durations_may_be_written_with_units() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("s.db").display());
    let file = dir.path().join("seawall.toml");
    std::fs::write(
        &file,
        "inbox_retention_ms = \"9days\"\nstream_max_age_ms = \"7days\"\noutbox_retention_ms = 3600000\n",
    )
    .unwrap();
    let migrated = seawall(&["migrate"], &[("SEAWALL_DATABASE_URL", &url)]);
    assert!(migrated.status.success());
    let out = seawall(
        &["--config", file.to_str().unwrap(), "prune", "--dry-run"],
        &[
            ("SEAWALL_DATABASE_URL", &url),
            ("SEAWALL_ACK_WAIT_MS", "30s"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("\"inbox_retention_ms\":777600000"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\"outbox_retention_ms\":3600000"),
        "{stdout}"
    );
    let out = seawall(
        &["migrate"],
        &[
            ("SEAWALL_DATABASE_URL", &url),
            ("SEAWALL_ACK_WAIT_MS", "30 fortnights"),
        ],
    );
    fails_naming(&out, "ack_wait_ms");
}

#[test]
fn an_infra_patience_outside_the_ack_wait_and_the_stream_age_stops_startup() {
    let out = seawall(
        &["migrate"],
        &[
            ("SEAWALL_INFRA_PATIENCE_MS", "10s"),
            ("SEAWALL_ACK_WAIT_MS", "30s"),
        ],
    );
    fails_naming(&out, "infra_patience_ms");
    fails_naming(&out, "shorter than ack_wait_ms");
    let out = seawall(
        &["migrate"],
        &[
            ("SEAWALL_INFRA_PATIENCE_MS", "2h"),
            ("SEAWALL_STREAM_MAX_AGE_MS", "1h"),
        ],
    );
    fails_naming(&out, "not shorter than stream_max_age_ms");
    let out = seawall(&["migrate"], &[("SEAWALL_SQLITE_SYNCHRONOUS", "off")]);
    fails_naming(&out, "sqlite_synchronous");
}

#[test]
fn a_claim_lease_shorter_than_the_handling_time_stops_startup_naming_both() {
    let out = seawall(
        &["migrate"],
        &[
            ("SEAWALL_CLAIM_LEASE_MS", "30s"),
            ("SEAWALL_MAX_HANDLING_MS", "5m"),
        ],
    );
    fails_naming(&out, "claim_lease_ms");
    fails_naming(&out, "shorter than max_handling_ms");
}

#[test]
fn a_nak_schedule_that_shrinks_stops_startup_naming_the_key() {
    let out = seawall(
        &["migrate"],
        &[("SEAWALL_NAK_BASE_MS", "1m"), ("SEAWALL_NAK_MAX_MS", "10s")],
    );
    fails_naming(&out, "nak_max_ms");
    fails_naming(&out, "shorter than nak_base_ms");
    let out = seawall(&["migrate"], &[("SEAWALL_NAK_BASE_MS", "0")]);
    fails_naming(&out, "nak_base_ms");
    // Twenty deliveries with naks up to an hour outlast a stream that keeps
    // messages for two: a failing message would vanish undead-lettered.
    let out = seawall(
        &["migrate"],
        &[
            ("SEAWALL_MAX_DELIVER", "20"),
            ("SEAWALL_NAK_MAX_MS", "1h"),
            ("SEAWALL_STREAM_MAX_AGE_MS", "2h"),
            ("SEAWALL_INFRA_PATIENCE_MS", "1h"),
            ("SEAWALL_ALLOW_SHORT_RETENTION", "true"),
        ],
    );
    fails_naming(&out, "before its dead letter is written");
}

#[test]
fn a_metrics_address_that_is_not_one_stops_startup_naming_the_key() {
    let out = seawall(&["migrate"], &[("SEAWALL_METRICS_ADDR", "everywhere")]);
    fails_naming(&out, "metrics_addr");
}

/// A NATS URL's password (or token) never reaches the log or the error:
/// start-up that cannot reach NATS names the URL with its secrets hidden.
#[test]
fn a_nats_password_is_not_printed_when_nats_cannot_be_reached() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("n.db").display());
    let nats = format!(
        "nats://seawall:s3cret@127.0.0.1:{},nats://t0ken-s3cret@127.0.0.1:{}",
        crate::support::free_port(),
        crate::support::free_port()
    );
    let out = crate::support::testbed_output(
        &["consume"],
        &[
            ("SEAWALL_DATABASE_URL", &url),
            ("SEAWALL_NATS_URL", &nats),
            ("SEAWALL_LOG", "info"),
        ],
    );
    fails_naming(&out, "connecting to NATS at nats://seawall:***@127.0.0.1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

/// The platform's tests run the testbed (the platform's command line on the
/// test kit's domain), never `seawall` itself, whose domain is the one a
/// fork replaces: a fork whose domain requires a setting would otherwise
/// fail them.
#[test]
fn the_platform_tests_never_run_the_seawall_binary() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let forbidden = [
        "binary_output(",
        "CARGO_PKG_NAME",
        "CARGO_BIN_EXE_seawall\"",
        "path(\"seawall\")",
    ];
    let mut found = Vec::new();
    for suite in [
        "tests/api",
        "tests/claims",
        "tests/flow",
        "tests/inbox",
        "bench/tests",
    ] {
        for file in rust_files(&root.join(suite)) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                // This test's own list of what it looks for.
                if line.trim_start().starts_with('"') {
                    continue;
                }
                if forbidden.iter().any(|needle| line.contains(needle)) {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "platform tests run seawall:\n{}",
        found.join("\n")
    );
}

/// The `.rs` files under `dir`, at any depth.
fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files
}
