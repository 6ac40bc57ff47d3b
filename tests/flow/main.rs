//! Message flow tests: a real nats-server (one per test), SQLite files and
//! PostgreSQL, with seawall running in-process or as separate processes.

use testkit as support;
use testkit::on_backends;

mod bad_day;
mod deliveries;
mod e2e;
mod helpers;
mod journey;
mod manifests;
mod nats_secure;
mod operate;
mod ordering;
mod otel;
mod poison;
mod probes;
mod races;
mod relay;
mod relay_edges;
mod replay;
mod shutdown;
mod sqlite_processes;
mod start_up;
mod streams;
mod upgrade;
mod wal;
mod wal_connection;
mod wal_fence;
mod wal_mode;
mod wal_names;
mod wal_outage;
mod wal_slot;
mod wal_standby;
mod wal_windows;
