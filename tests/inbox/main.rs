//! Inbox integration tests: the guarantees of docs/architecture.md rules 1-7 on real
//! SQLite files, PostgreSQL and MariaDB.

use testkit as support;
use testkit::on_backends;

mod bad_input;
mod batch;
mod commit;
mod config;
mod constraints;
mod dead_letters;
mod handler_fn;
mod load;
mod migrate;
mod overlap;
mod races;
mod retry;
mod rollback;
mod sqlite;
mod throughput;
