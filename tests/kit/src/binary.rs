//! The workspace's binaries, found next to the running test.
//!
//! Cargo builds a package's binaries before its integration tests and puts
//! both in the same target directory (`target/debug/<service>`,
//! `target/debug/deps/<test>-<hash>`); the kit finds them there, as
//! `env!("CARGO_BIN_EXE_...")` would in the test's own crate.

use std::path::PathBuf;

/// The path of binary `name` beside the running test executable.
///
/// # Panics
/// When it is not there: the test was not built by cargo alongside the
/// package that owns the binary.
pub fn path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("tests run from target/<profile>/deps");
    let bin = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: build the workspace's binaries (`cargo build --workspace`)",
        bin.display()
    );
    bin
}

/// [`binary_output`] for `seawall-testbed`: the platform's command line
/// on the kit's domain, whatever a fork's domain requires of its service.
pub fn testbed_output(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    binary_output("seawall-testbed", args, env)
}

/// Runs the workspace's binary `program` to its end with `args` and extra
/// environment variables, for start-up checks that never reach a server.
/// A domain's tests name the service's binary `env!("CARGO_PKG_NAME")`, so
/// they follow a renamed package.
pub fn binary_output(program: &str, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(path(program));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
        .unwrap_or_else(|err| panic!("run {program}: {err}"))
}

/// Asserts that a run failed, named `needle` on stderr, and did not panic.
pub fn fails_naming(out: &std::process::Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure");
    assert!(
        stderr.contains(needle),
        "stderr should name {needle}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
