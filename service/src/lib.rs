//! seawall's core: exactly-once effects over at-least-once delivery.
//!
//! A handler's business writes, its inbox marker and its outgoing events commit
//! in one transaction; the database's unique index, not a prior check, decides
//! which of two racing deliveries wins. This crate knows nothing about NATS or
//! HTTP; `worker` and `api` build on it.
//!
//! # Layout
//! - [`envelope`]: validated ids ([`MessageId`], [`ConsumerName`]) and [`Envelope`].
//! - [`handler`]: what a handler sees ([`Ctx`], a decoded payload) and the [`Handle`] trait.
//! - [`inbox`]: [`Inbox::process`] and its [`Outcome`].
//! - [`outbox`]: [`NewEvent`], and [`Outbox`] for events written outside a handler.
//! - [`wal`]: the outbox in PostgreSQL's write-ahead log: the event encoding and its emit.
//! - [`claim`]: two-phase claims for effects outside the transaction.
//! - [`sweep`]: releasing or quarantining abandoned claims.
//! - [`retention`]: how long rows are kept, and pruning them.
//! - [`executor`]: [`Executor`], which re-runs whole transactions on transient errors.
//! - [`classify`]: what a database error means, per backend.
//! - [`domain`]: the domain's handlers and settings (here the example, credits; a fork replaces the folder).
//! - [`registry`]: which handler consumes which subject.
//! - [`effect`]: effects as plain async functions with a decoded payload.
//! - [`relay`]: the statements the outbox relay runs (taking, holding and marking rows).
//! - [`dead_letter`]: recording messages a consumer gave up on.
//! - [`state`]: [`OutboxState`] and [`ClaimState`], each with the one condition that selects it.
//! - [`admin`]: what operators list and change (filters, retry, replay, delete).
//! - [`stats`]: counts by table and state, for operators.
//! - [`rollup`]: per-minute throughput counted by the transactions that do the work.
//! - [`stuck`]: why a row is not moving, for a page of rows at once.
//! - [`trace`]: W3C trace context through the outbox.
//! - [`journey`]: what the database knows of a message and what it caused.
//! - [`db`]: opening a database with the settings the inbox relies on.
//! - [`millis`]: `*_ms` settings written as milliseconds or with units.

pub mod admin;
pub mod backoff;
pub mod claim;
pub mod classify;
pub mod db;
pub mod dead_letter;
pub mod domain;
pub mod effect;
pub mod envelope;
mod error;
pub mod executor;
pub mod group;
pub mod handler;
pub mod inbox;
pub mod journey;
pub mod millis;
pub mod outbox;
pub mod pg_url;
pub mod registry;
pub mod relay;
pub mod replica;
pub mod retention;
pub mod rollup;
pub mod state;
pub mod stats;
pub mod stuck;
pub mod sweep;
pub mod trace;
pub mod wal;

pub use backoff::Backoff;
pub use effect::EffectCtx;
pub use envelope::{ConsumerName, Envelope, EnvelopeError, MessageId};
pub use error::{BoxError, HandlerError, InboxError, InboxErrorKind};
pub use executor::{Executor, RetryPolicy, Savepoint, Unit, panic_message};
pub use handler::{Ctx, FromPayload, Handle, Json, handler};
pub use inbox::{FastPath, Inbox, Outcome};
pub use outbox::{EventError, NewEvent, Outbox, OutboxError, OutboxMode};
pub use registry::{Effect, HandlerKind, Registration, Registry};
pub use state::{ClaimState, OutboxState};
