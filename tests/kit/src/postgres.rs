//! A PostgreSQL server of a test's own, for settings the shared server of
//! `scripts/services` must not take: they would reach every other test's
//! databases (a tiny `max_slot_wal_keep_size` invalidates every lagging
//! slot on the server, not just the test's).

use std::process::Command;

use crate::net::free_port;

/// Where Debian's PostgreSQL 15 keeps its server programs.
pub const BIN: &str = "/usr/lib/postgresql/15/bin";

/// A running server in a temporary directory, stopped (and removed) on
/// drop. Durability is off, as on the shared server.
pub struct PrivatePostgres {
    dir: tempfile::TempDir,
    /// `postgres://postgres@127.0.0.1:<port>`: append `/<database>`.
    pub url: String,
}

impl PrivatePostgres {
    /// Creates a cluster and starts it with `settings` (`name=value`, as
    /// `postgres -c` takes them).
    pub fn start(settings: &[&str]) -> Self {
        let dir = owned_tempdir();
        let data = data_of(&dir);
        as_postgres(&[
            &format!("{BIN}/initdb"),
            "-D",
            &data,
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]);
        Self::launch(dir, settings)
    }

    /// A streaming standby of this server, its `application_name` `name`
    /// (what `synchronous_standby_names` lists), started with `settings`.
    /// The primary needs `max_wal_senders` (10 by default) and trust for
    /// replication from 127.0.0.1 (initdb's default `pg_hba.conf` has it).
    pub fn standby(&self, name: &str, settings: &[&str]) -> Self {
        let dir = owned_tempdir();
        let data = data_of(&dir);
        let port = self.url.rsplit(':').next().expect("a port");
        as_postgres(&[
            &format!("{BIN}/pg_basebackup"),
            "-D",
            &data,
            "-h",
            "127.0.0.1",
            "-p",
            port,
            "-U",
            "postgres",
            "-X",
            "stream",
            "--no-sync",
            // An immediate checkpoint: a spread one paces its writes over
            // most of checkpoint_timeout, a minute and more on a primary
            // that has written anything.
            "--checkpoint=fast",
        ]);
        let data = std::path::Path::new(&data);
        std::fs::write(data.join("standby.signal"), "").expect("standby.signal");
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.auto.conf"))
            .expect("postgresql.auto.conf");
        std::io::Write::write_all(
            &mut conf,
            format!(
                "primary_conninfo = 'host=127.0.0.1 port={port} user=postgres application_name={name}'\n"
            )
            .as_bytes(),
        )
        .expect("primary_conninfo");
        Self::hand_over(data);
        Self::launch(dir, settings)
    }

    /// Starts the cluster in `dir` on a port of its own.
    fn launch(dir: tempfile::TempDir, settings: &[&str]) -> Self {
        let data = data_of(&dir);
        let port = free_port();
        let mut options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off",
            dir.path().display()
        );
        for setting in settings {
            options.push_str(" -c ");
            options.push_str(setting);
        }
        let log = dir.path().join("server.log");
        as_postgres(&[
            &format!("{BIN}/pg_ctl"),
            "-D",
            &data,
            "-o",
            &options,
            "-l",
            &log.display().to_string(),
            "-w",
            "start",
        ]);
        Self {
            dir,
            url: format!("postgres://postgres@127.0.0.1:{port}"),
        }
    }
}

/// A temporary directory the server's user owns.
fn owned_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    PrivatePostgres::hand_over(dir.path());
    dir
}

impl PrivatePostgres {
    /// Replaces the server's `pg_hba.conf` with `lines` and reloads it:
    /// connections opened before keep going, new ones meet the new rules.
    pub fn set_hba(&self, lines: &str) {
        let path = std::path::Path::new(&data_of(&self.dir)).join("pg_hba.conf");
        std::fs::write(&path, lines).expect("pg_hba.conf");
        as_postgres(&[
            &format!("{BIN}/pg_ctl"),
            "-D",
            &data_of(&self.dir),
            "reload",
        ]);
    }

    /// Stops the server with a fast shutdown (clients disconnected, a
    /// checkpoint written), waiting at most `seconds`; whether it stopped.
    pub fn stop_fast(&self, seconds: u32) -> bool {
        Command::new("setpriv")
            .current_dir("/")
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .arg(format!("{BIN}/pg_ctl"))
            .args(["-D", &data_of(&self.dir), "-m", "fast", "-w", "-t"])
            .arg(seconds.to_string())
            .arg("stop")
            .status()
            .expect("pg_ctl")
            .success()
    }

    /// A directory the server's user owns, for files it must read (a TLS
    /// key it accepts only when no one else can read it).
    pub fn private_dir(&self) -> std::path::PathBuf {
        let dir = self.dir.path().join("private");
        std::fs::create_dir_all(&dir).expect("private dir");
        dir
    }

    /// Hands `path` (and what is in it) to the server's user, readable by
    /// it alone.
    pub fn hand_over(path: &std::path::Path) {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(path)
            .status()
            .expect("chown");
        assert!(status.success(), "handing {} to postgres", path.display());
        let status = Command::new("chmod")
            .args(["-R", "go-rwx"])
            .arg(path)
            .status()
            .expect("chmod");
        assert!(status.success());
    }
}

/// The cluster's data directory in `dir`.
fn data_of(dir: &tempfile::TempDir) -> String {
    dir.path().join("data").display().to_string()
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // Not `as_postgres`: a failed stop must not panic during a panic.
        let _ = Command::new("setpriv")
            .current_dir("/")
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .arg(format!("{BIN}/pg_ctl"))
            .args(["-D", &data_of(&self.dir), "-m", "immediate", "-w", "stop"])
            .status();
    }
}

/// Runs `args` as the postgres user, from `/` (a checkout only root can
/// enter is no working directory for it), and asserts it succeeded.
pub fn as_postgres(args: &[&str]) {
    let out = Command::new("setpriv")
        .current_dir("/")
        .args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ])
        .args(args)
        .output()
        .expect("setpriv");
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
