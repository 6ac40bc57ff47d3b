//! A service under test, started the way its domain's tests need it:
//! [`spawn_app`] runs the service's binary (named after its package) with `run` on a fresh database and a nats-server of the test's
//! own, the admin API on a free port, and hands the test what it works
//! with: the database, a JetStream context, the API's address, a drain, and
//! the process's log when the test fails.
//!
//! A child process, not the service in the test's own process: the metrics
//! recorder is process-global (a second service in one test binary cannot
//! install it), settings come from the environment (which tests running in
//! parallel share), and a process is what the domain's tests need to
//! kill, stop or restart. The kit starts and stops it: it is killed when
//! the [`App`] is dropped.

use std::time::Duration;

use async_nats::jetstream;

use crate::db::{Backend, TestDb};
use crate::nats::NatsServer;
use crate::process::Seawall;
use crate::{binary, free_port, wait_until};

/// How long [`spawn_app`] waits for the service to be running and
/// [`App::drain`] for it to have nothing left: a cold debug build on a
/// loaded CI machine takes seconds to start.
const PATIENCE: Duration = Duration::from_secs(60);

/// A running service and what its test works with.
pub struct App {
    /// Its database (one of its own), with a connection the test may use.
    pub db: TestDb,
    /// A JetStream context on its nats-server.
    pub js: jetstream::Context,
    /// Its admin API, `http://127.0.0.1:<port>`.
    pub api: String,
    /// The process (signals, its log).
    pub process: Seawall,
    /// The service's nats-server, stopped with the app.
    pub nats: NatsServer,
}

/// Starts `binary run` (a binary of the workspace: a domain's tests pass
/// `env!("CARGO_PKG_NAME")`, the service's, which follows a rename) on a
/// fresh `backend` database and a private nats-server, with `env` on top,
/// and waits until it is running.
///
/// # Panics
/// When it is not running within a minute (it exited, say), with its log.
pub async fn spawn_app(binary: &str, backend: Backend, env: &[(&str, &str)]) -> App {
    let db = TestDb::new(backend).await;
    let nats = NatsServer::start().await;
    let api = format!("127.0.0.1:{}", free_port());
    let mut all = vec![
        ("SEAWALL_DATABASE_URL", db.url.clone()),
        ("SEAWALL_NATS_URL", nats.url()),
        ("SEAWALL_API_ADDR", api.clone()),
    ];
    all.extend(env.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let process = Seawall::spawn_binary(&binary::path(binary), &["run"], &all);
    let js = nats.jetstream().await;
    let app = App {
        db,
        js,
        api: format!("http://{api}"),
        process,
        nats,
    };
    wait_until("the service running", PATIENCE, || async {
        app.process.log_text().contains("seawall is running")
    })
    .await;
    app
}

impl App {
    /// Waits until the outbox is relayed and `consumers` of `stream` have
    /// nothing pending or unacknowledged (see [`worker::drain`]).
    ///
    /// # Panics
    /// When that takes over a minute, with the service's log.
    pub async fn drain(&self, stream: &str, consumers: &[&str]) {
        if let Err(err) = worker::drain(&self.db.db, &self.js, stream, consumers, PATIENCE).await {
            panic!("{err}\nthe service's log:\n{}", self.process.log_text());
        }
    }
}

impl Drop for App {
    /// A failing test shows what the service logged.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the service's log:\n{}", self.process.log_text());
        }
    }
}
