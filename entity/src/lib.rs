//! SeaORM table definitions for seawall.
//!
//! Only table shapes live here; behaviour belongs to `service`. The schema
//! itself (indexes, constraints, their names) is created by `migration`, which
//! is the contract the database enforces.
//!
//! # Layout
//! - [`inbox_message`]: one row per (message, consumer) handled or claimed.
//! - [`outbox_message`]: events waiting for, or done with, publication.
//! - [`dead_letter`]: messages a consumer gave up on, with the reason.
//! - [`throughput_minute`]: per-minute counts the dashboard reads.
//! - [`domain`]: the domain's tables (a fork replaces this folder; see
//!   `docs/fork.md`).

pub mod dead_letter;
pub mod domain;
pub mod inbox_message;
pub mod outbox_message;
pub mod prelude;
pub mod throughput_minute;
