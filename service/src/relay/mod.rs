//! The outbox relay's statements: which rows a round takes and how it holds
//! them while they are published ([`Batch`]: row locks, or a lease on
//! SQLite), and how it records each row's outcome ([`store`]). The relay's
//! loop and its NATS side live in `worker::relay`; every statement it runs
//! is here, beside the row states they change ([`crate::state`]).

pub mod batch;
pub mod store;

pub use batch::Batch;
