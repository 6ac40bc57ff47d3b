//! The list of consumers a worker runs: which handler reads which subject.
//!
//! A team adds a consumer by writing one [`Handle`] type and registering it;
//! the worker then creates the durable JetStream consumer, feeds it messages
//! through the inbox and acks, naks or dead-letters by the outcome.

use std::marker::PhantomData;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use sea_orm::DatabaseTransaction;

use crate::claim::ClaimPolicy;
use crate::envelope::{ConsumerName, Envelope};
use crate::error::HandlerError;
use crate::inbox::Handle;

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
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("consumer", &self.consumer)
            .field("subject", &self.subject)
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

    /// Registers `handler` as `consumer` of `subject`. Several consumers may
    /// read the same subject; each applies a message once for itself.
    pub fn register<T, H>(
        mut self,
        consumer: ConsumerName,
        subject: impl Into<String>,
        handler: H,
    ) -> Self
    where
        T: Send + 'static,
        H: Handle<T> + 'static,
    {
        self.registrations.push(Registration {
            consumer,
            subject: subject.into(),
            kind: HandlerKind::Transaction(Arc::new(Discard {
                inner: handler,
                _out: PhantomData,
            })),
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
        });
        self
    }

    /// The registrations, in registration order.
    pub fn registrations(&self) -> &[Registration] {
        &self.registrations
    }
}

/// Adapts a handler with an output to the registry's `Handle<()>`.
struct Discard<H, T> {
    inner: H,
    _out: PhantomData<fn() -> T>,
}

impl<H, T> Handle<()> for Discard<H, T>
where
    T: Send + 'static,
    H: Handle<T>,
{
    fn handle<'a>(
        &'a self,
        txn: &'a DatabaseTransaction,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        self.inner
            .handle(txn, envelope)
            .map(|r| r.map(|_| ()))
            .boxed()
    }
}
