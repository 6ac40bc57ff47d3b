//! Two-phase claims, the claim sweeper and retention pruning, on SQLite files
//! and PostgreSQL, with a real nats-server and a real HTTP receiver.

use testkit as support;
use testkit::on_backends;

mod crashes;
mod lifecycle;
mod prune;
mod states;
mod takeover;
