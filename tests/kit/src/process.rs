//! `seawall` child processes for black-box tests, killed on drop.

use std::path::Path;
use std::process::{ExitStatus, Stdio};

use tokio::process::{Child, Command};

use crate::binary;

pub struct Seawall {
    child: Child,
    pub log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// Settings every spawned process starts with; a test's own environment
/// overrides them.
/// - A nak schedule of 0.1 s to 2 s instead of the production one (10 s
///   doubling to 5 min): a failing message reaches its dead letter within
///   seconds, and a test of a failure that must not spend deliveries (an
///   outage, a downstream that is down) fails fast and surely if it does.
/// - Probes on a port of the system's choosing: tests run many `relay` and
///   `consume` processes on one host at once (the address is logged).
/// - Statistics read afresh at every call: a test asserts what it just did.
pub const TEST_SETTINGS: [(&str, &str); 4] = [
    ("SEAWALL_NAK_BASE_MS", "100"),
    ("SEAWALL_NAK_MAX_MS", "2000"),
    ("SEAWALL_STATS_MAX_AGE_MS", "0"),
    ("SEAWALL_METRICS_ADDR", "127.0.0.1:0"),
];

impl Seawall {
    /// Starts `seawall-testbed <args>` (the platform's command line on the
    /// kit's [`crate::ledger`], see `tests/testbed`) with the given
    /// environment (plus `SEAWALL_LOG=info` and [`TEST_SETTINGS`]): what
    /// the platform's tests run, whatever a fork's domain requires.
    pub fn spawn(args: &[&str], env: &[(&str, String)]) -> Self {
        Self::spawn_binary(&binary::path("seawall-testbed"), args, env)
    }

    /// Starts `program <args>` (a service's binary, see
    /// [`crate::binary::path`]) as [`Seawall::spawn`] starts the testbed.
    pub fn spawn_binary(program: &Path, args: &[&str], env: &[(&str, String)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("seawall.log");
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(program);
        cmd.args(args).env("SEAWALL_LOG", "info");
        for (k, v) in TEST_SETTINGS {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::null()).stderr(file).kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self {
            child: cmd.spawn().expect("spawn seawall"),
            log,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    fn signal(&self, sig: &str) {
        let status = std::process::Command::new("kill")
            .arg(sig)
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// SIGTERM, then waits for the exit.
    pub async fn terminate(&mut self) -> ExitStatus {
        self.signal("-TERM");
        self.child.wait().await.unwrap()
    }

    /// SIGSTOP: the process holds what it holds (deliveries, transactions,
    /// claims) but sends nothing, so JetStream redelivers its messages to
    /// others after the ack wait.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`Seawall::freeze`]: it carries on where it stopped.
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// SIGKILL, then waits for the exit.
    pub async fn kill9(&mut self) {
        self.signal("-KILL");
        let _ = self.child.wait().await;
    }

    /// Waits for the process to exit on its own.
    pub async fn wait(&mut self) -> ExitStatus {
        self.child.wait().await.unwrap()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Asserts the process has not panicked.
    pub fn assert_no_panic(&self) {
        let log = self.log_text();
        assert!(!log.contains("panicked"), "seawall panicked:\n{log}");
    }
}
