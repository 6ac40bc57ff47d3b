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

use crate::envelope::{ConsumerName, Envelope};
use crate::error::HandlerError;
use crate::inbox::Handle;

/// One consumer: its name (also the inbox key part and the durable name), the
/// subject filter it reads, and its handler.
#[derive(Clone)]
pub struct Registration {
    /// Consumer name.
    pub consumer: ConsumerName,
    /// Subject filter within the stream (for example `credits.requested`).
    pub subject: String,
    /// The handler, its output discarded.
    pub handler: Arc<dyn Handle<()>>,
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
            handler: Arc::new(Discard {
                inner: handler,
                _out: PhantomData,
            }),
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
