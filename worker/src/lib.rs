//! seawall's long-running loops: the outbox relay and the JetStream consumer.
//!
//! Each loop takes a cancellation token, finishes the unit in flight when it
//! fires, and exposes one step (`Relay::relay_once`, `Consumer::handle`) so
//! tests can drive it deterministically.
//!
//! # Layout
//! - [`relay`]: outbox rows -> JetStream, with leases, pipelining and ordering keys.
//! - [`consumer`]: JetStream -> inbox handlers -> ack / nak / dead letter.
//! - [`streams`]: stream provisioning and the duplicate-window check.
//! - [`notify`]: PostgreSQL `LISTEN/NOTIFY` wake-ups for the relay.
//! - [`maintenance`]: the claim sweeper and the retention pruner loops.
//! - [`drain`]: wait until everything in flight has settled (for tests).
//! - [`fault`]: fault points crash tests arm through the configuration.
//! - [`server_errors`]: what the NATS server reported on its own (permission violations).

pub mod consumer;
pub mod drain;
pub mod fault;
pub mod maintenance;
pub mod notify;
pub mod relay;
pub mod server_errors;
pub mod streams;

pub use consumer::{Consumer, ConsumerConfig, ConsumerHealth, Reads};
pub use drain::drain;
pub use fault::FaultPoint;
pub use relay::{Relay, RelayConfig, RelayReport};
pub use server_errors::ServerErrors;
pub use streams::{StreamError, StreamSpec, check_duplicate_window, ensure_stream, stream_exists};
