//! Two-phase claims, the claim sweeper and retention pruning, on SQLite files
//! and PostgreSQL, with a real nats-server and a real HTTP receiver.

#[path = "../support/mod.rs"]
mod support;

mod crashes;
mod lifecycle;
mod prune;
mod states;
mod takeover;
