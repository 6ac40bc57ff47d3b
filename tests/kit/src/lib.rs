//! seawall's test kit: the test-only domain the platform proves itself on,
//! and (with the `harness` feature) the helpers its tests share.
//!
//! The platform's tests, the testbed binary and the benchmarks run on the
//! [`ledger`], never on the domain a fork replaces, so a fork keeps every
//! one of them (see `docs/fork.md`). The harness is a feature so that the
//! product build, which needs the ledger only for the testbed, compiles none
//! of the test servers' dependencies.
//!
//! # Layout
//! - [`ledger`]: entries added to accounts, a `ledger.recorded` event per
//!   entry, and the tables they live in.
//! - `db`: a fresh migrated database per test on SQLite, PostgreSQL or
//!   MariaDB, and [`on_backends!`] to run a test on each.
//! - `binary`, `process`: the workspace's binaries as child processes.
//! - `nats`, `postgres`, `proxy`, `webhook`, `tls`: a private nats-server,
//!   a private PostgreSQL server, a TCP proxy that cuts connections, a
//!   webhook receiver, test certificates.
//! - `rows`: outbox rows and markers written as a busy service leaves them.
//! - `wait`, `net`: conditions instead of sleeps; HTTP clients and ports.
//! - `ahead`: a schema one expand step ahead of the tree's migrations.
//! - `app`: [`app::spawn_app`], a service under test with its own database
//!   and nats-server, for a domain's end-to-end tests.

pub mod ledger;

#[cfg(feature = "harness")]
pub mod ahead;
#[cfg(feature = "harness")]
pub mod app;
#[cfg(feature = "harness")]
pub mod binary;
#[cfg(feature = "harness")]
mod db;
#[cfg(feature = "harness")]
pub mod nats;
#[cfg(feature = "harness")]
mod net;
#[cfg(feature = "harness")]
pub mod postgres;
#[cfg(feature = "harness")]
pub mod process;
#[cfg(feature = "harness")]
pub mod proxy;
#[cfg(feature = "harness")]
pub mod rows;
#[cfg(feature = "harness")]
pub mod tls;
#[cfg(feature = "harness")]
mod wait;
#[cfg(feature = "harness")]
pub mod webhook;

#[cfg(feature = "harness")]
pub use app::{App, spawn_app};
#[cfg(feature = "harness")]
pub use binary::{binary_output, fails_naming, testbed_output};
#[cfg(feature = "harness")]
pub use db::{Backend, TestDb, backend_named, charted, connect, pg_count, server_url};
#[cfg(feature = "harness")]
pub use net::{free_port, http_client};
#[cfg(feature = "harness")]
pub use wait::{wait_for_stream, wait_until};

/// The ledger under the name the tests give the domain they run on.
pub use ledger as domain;
pub use ledger::entry_envelope;
