//! The list of consumers a worker runs: which handler reads which subject.
//!
//! A team adds a consumer by writing one async function and registering it;
//! the worker then creates the durable JetStream consumer, feeds it messages
//! through the inbox and acks, naks or dead-letters by the outcome.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::claim::ClaimPolicy;
use crate::effect::{DecodingEffect, EffectFn};
use crate::envelope::{ConsumerName, Envelope};
use crate::error::HandlerError;
use crate::handler::{
    Discard, FromPayload, Handle, HandlerFn, StatefulHandlerFn, from_fn, from_fn_with,
};

/// A side effect that cannot join a database transaction (an HTTP call, an
/// email). It runs behind a two-phase claim and receives the message id as its
/// idempotency key, identical on every attempt, so the receiver can recognise
/// a repeat after a crash.
pub trait Effect: Send + Sync {
    /// Performs the effect; `Ok` may carry a short result to record.
    fn perform<'a>(
        &'a self,
        envelope: &'a Envelope,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, HandlerError>>;
}

/// How a consumer applies a message.
#[derive(Clone)]
pub enum HandlerKind {
    /// Business writes in the inbox transaction (the usual case).
    Transaction(Arc<dyn Handle<()>>),
    /// An effect outside the transaction, behind a two-phase claim.
    Effect(Arc<dyn Effect>, ClaimPolicy),
}

/// One consumer: its name (also the inbox key part and the durable name), the
/// subject filter it reads, and its handler.
#[derive(Clone)]
pub struct Registration {
    /// Consumer name.
    pub consumer: ConsumerName,
    /// Subject filter within the stream (for example `credits.requested`).
    pub subject: String,
    /// The handler.
    pub kind: HandlerKind,
    /// Whether its messages may share a transaction with others (group
    /// commit, when the process batches); see [`Registry::unbatched`].
    pub batched: bool,
    /// The stream it reads when that is not the domain's own: one another
    /// service owns, which seawall never creates or changes; see
    /// [`Registry::from_stream`]. `None`: the domain's own stream.
    pub stream: Option<String>,
    /// Whether its messages are handled one at a time, in stream order,
    /// across every process; see [`Registry::ordered`].
    pub ordered: bool,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("consumer", &self.consumer)
            .field("subject", &self.subject)
            .field("stream", &self.stream)
            .field("ordered", &self.ordered)
            .finish_non_exhaustive()
    }
}

/// The consumers of one worker process.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    registrations: Vec<Registration>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the async function `handler` as `consumer` of `subject`:
    /// `async fn(ctx: &Ctx<'_>, payload: P) -> Result<(), HandlerError>`,
    /// where the platform decodes `P` from the payload ([`Json`] for JSON)
    /// and dead-letters a payload that does not decode. Several consumers
    /// may read the same subject; each applies a message once for itself.
    ///
    /// [`Json`]: crate::Json
    pub fn register<P, F>(
        self,
        consumer: ConsumerName,
        subject: impl Into<String>,
        handler: F,
    ) -> Self
    where
        P: FromPayload,
        F: for<'a> HandlerFn<'a, P> + 'static,
    {
        self.push(consumer, subject, Arc::new(from_fn(handler)))
    }

    /// [`Registry::register`] for a function that also takes `state` built
    /// at start-up (the domain's settings, a client):
    /// `async fn(ctx: &Ctx<'_>, state: &S, payload: P)`.
    pub fn register_with<S, P, F>(
        self,
        consumer: ConsumerName,
        subject: impl Into<String>,
        state: S,
        handler: F,
    ) -> Self
    where
        S: Send + Sync + 'static,
        P: FromPayload,
        F: for<'a> StatefulHandlerFn<'a, S, P> + 'static,
    {
        self.push(consumer, subject, Arc::new(from_fn_with(state, handler)))
    }

    /// Registers a [`Handle`] implementation (one that reads the raw
    /// envelope, or returns a value its direct callers use).
    pub fn register_handler<T, H>(
        self,
        consumer: ConsumerName,
        subject: impl Into<String>,
        handler: H,
    ) -> Self
    where
        T: Send + 'static,
        H: Handle<T> + 'static,
    {
        self.push(consumer, subject, Arc::new(Discard::new(handler)))
    }

    /// Adds a transactional consumer. Functions registered with
    /// [`Registry::register`] already return `()`, so they skip the
    /// [`Discard`] adapter (and its second boxed future per message).
    fn push(
        mut self,
        consumer: ConsumerName,
        subject: impl Into<String>,
        handler: Arc<dyn Handle<()>>,
    ) -> Self {
        self.registrations.push(Registration {
            consumer,
            subject: subject.into(),
            kind: HandlerKind::Transaction(handler),
            batched: true,
            stream: None,
            ordered: false,
        });
        self
    }

    /// Registers a side effect as `consumer` of `subject`, run behind a
    /// two-phase claim with `policy`.
    pub fn register_effect<E>(
        mut self,
        consumer: ConsumerName,
        subject: impl Into<String>,
        effect: E,
        policy: ClaimPolicy,
    ) -> Self
    where
        E: Effect + 'static,
    {
        self.registrations.push(Registration {
            consumer,
            subject: subject.into(),
            kind: HandlerKind::Effect(Arc::new(effect), policy),
            batched: true,
            stream: None,
            ordered: false,
        });
        self
    }

    /// Registers the async function `effect` as `consumer` of `subject`,
    /// run behind a two-phase claim with `policy`:
    /// `async fn(ctx: EffectCtx<'_>, state: &S, payload: P) ->
    /// Result<Option<String>, HandlerError>`, where `state` was built at
    /// start-up (a client, a URL) and the platform decodes `P` from the
    /// payload ([`crate::Json`] for JSON); a payload that does not decode
    /// is dead-lettered with the reason (its claim recorded as failed)
    /// without the function being called.
    pub fn register_effect_with<S, P, F>(
        self,
        consumer: ConsumerName,
        subject: impl Into<String>,
        state: S,
        effect: F,
        policy: ClaimPolicy,
    ) -> Self
    where
        S: Send + Sync + 'static,
        P: FromPayload,
        F: for<'a> EffectFn<'a, S, P> + 'static,
    {
        self.register_effect(
            consumer,
            subject,
            DecodingEffect::new(state, effect),
            policy,
        )
    }

    /// Commits each message of the consumer registered last in a
    /// transaction of its own, even when the process batches (see
    /// [`crate::group`]). For a handler that relies on what lasts to its
    /// transaction's end and cannot be reset between a batch's units: a
    /// temporary table `ON COMMIT DROP` (the next unit's `CREATE` would
    /// fail), a transaction-level advisory lock (held until the whole batch
    /// commits). Settings made with `SET LOCAL` need not: a batch resets
    /// them between units.
    pub fn unbatched(self) -> Self {
        self.with_last(|last| last.batched = false)
    }

    /// Handles the messages of the consumer registered last one at a time,
    /// in the order of its stream, across every process that runs it: a
    /// `release` published right after its `reserve` is never handled
    /// first. JetStream hands out its next message only once the one
    /// before is acknowledged or dead-lettered (`max_ack_pending` = 1), so
    /// a failing message holds every message after it for its nak delays,
    /// up to `MAX_DELIVER` deliveries, and the consumer's throughput is one
    /// transaction at a time. Without it a consumer is unordered (see
    /// docs/guarantees.md).
    pub fn ordered(self) -> Self {
        self.with_last(|last| last.ordered = true)
    }

    /// Reads the consumer registered last from `stream`, a stream another
    /// service owns, instead of the domain's own. seawall never creates or
    /// changes such a stream (its limits, retention and subjects are its
    /// owner's): start-up refuses to go on while it does not exist, and
    /// the consumer's durable JetStream consumer on it (named after the
    /// domain's stream and the consumer, so never one of the owner's)
    /// filters on the consumer's subject alone. Its dead letters are replayed through the
    /// domain's own stream, which a second durable consumer of the same
    /// name reads for that consumer's replay subject only.
    pub fn from_stream(self, stream: impl Into<String>) -> Self {
        let stream = stream.into();
        self.with_last(|last| last.stream = Some(stream))
    }

    /// Changes the registration made last (none yet: nothing to change).
    fn with_last(mut self, change: impl FnOnce(&mut Registration)) -> Self {
        if let Some(last) = self.registrations.last_mut() {
            change(last);
        }
        self
    }

    /// The registrations, in registration order.
    pub fn registrations(&self) -> &[Registration] {
        &self.registrations
    }
}
