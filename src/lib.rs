//! The seawall process, shared by the `seawall` binary, the benchmarks
//! (`seawall-bench`, in `bench/`) and the tests, so that all three start
//! exactly the same thing.
//!
//! # Contents
//! - [`config`]: the [`Settings`] (defaults, TOML file, `SEAWALL_*`
//!   variables) and the typed views each part takes ([`Settings::relay`],
//!   [`Settings::consumer`], [`Settings::claim_policy`], ...).
//! - [`app`]: the [`Application`], which builds a process for some [`Roles`] and
//!   a [`Domain`] and runs it until told to stop.
//! - [`cli`]: the command line every service built on seawall shares
//!   (`seawall`'s, and the test kit's `seawall-testbed`), given a
//!   [`cli::Service`].
//! - [`telemetry`]: logs (text or JSON) and OpenTelemetry traces over OTLP.
//! - [`nats`]: connecting to NATS from a URL setting.
//! - [`webhook`]: an effect that POSTs events to a URL, for two-phase claims.
//! - [`domain`]: the domain's wiring, settings and commands (here the
//!   example; a fork replaces the folder, see `docs/fork.md`).
//!
//! The platform itself lives in the library crates: `service` (inbox,
//! outbox, claims, states), `worker` (relay, consumers) and `api`; see
//! `docs/architecture.md`. This crate only assembles them, so its errors are
//! `anyhow` errors that the binary prints with their causes.

pub mod app;
pub mod cli;
pub mod config;
pub mod domain;
pub mod nats;
pub mod telemetry;
pub mod webhook;

/// The service's name: its package's (the root `Cargo.toml`), which is also
/// its binary's. The command line, the default OpenTelemetry service name
/// and the benchmarks' default binary use it, so renaming the package
/// renames the service everywhere it is not the platform speaking
/// (`SEAWALL_` settings, `seawall_` metrics and the library stay seawall's).
pub const SERVICE: &str = env!("CARGO_PKG_NAME");

pub use app::{Application, Domain, Roles};
pub use config::Settings;
