//! Inbox integration tests: the guarantees of docs/architecture.md rules 1-7 on real
//! SQLite files, PostgreSQL and MariaDB.

#[path = "../support/mod.rs"]
mod support;

mod bad_input;
mod commit;
mod config;
mod constraints;
mod handler_fn;
mod load;
mod migrate;
mod overlap;
mod races;
mod retry;
mod rollback;
mod throughput;
