//! What a handler sees: a [`Ctx`] (the inbox's transaction, the message, and
//! where the events it emits go) and, for handlers registered as plain async
//! functions, a payload the platform has already decoded.
//!
//! Everything a handler's events depend on travels in the context, so two
//! handlers in one process (or one test binary) can record events in
//! different outbox modes, and an event always names the message that caused
//! it, whatever task the handler runs on.

use std::future::Future;
use std::marker::PhantomData;

use futures::FutureExt;
use futures::future::BoxFuture;
use sea_orm::DatabaseTransaction;
use serde::de::DeserializeOwned;

use crate::envelope::{ConsumerName, Envelope};
use crate::error::HandlerError;
use crate::outbox::{Cause, NewEvent, Outbox, OutboxError, OutboxMode};

/// The context of one run of a handler: a fresh one for every attempt the
/// executor makes, since every attempt has its own transaction.
pub struct Ctx<'a> {
    txn: &'a DatabaseTransaction,
    envelope: &'a Envelope,
    consumer: &'a ConsumerName,
    outbox: Outbox,
    cause: Cause,
}

impl<'a> Ctx<'a> {
    /// The context of `envelope` handled by `consumer` on `txn`, emitting
    /// through `outbox`.
    pub fn new(
        txn: &'a DatabaseTransaction,
        envelope: &'a Envelope,
        consumer: &'a ConsumerName,
        outbox: Outbox,
    ) -> Self {
        let cause = Cause::of(envelope, consumer);
        Self {
            txn,
            envelope,
            consumer,
            outbox,
            cause,
        }
    }

    /// The inbox's transaction: every business write goes on it (bulk
    /// statements included), so it commits with the marker or not at all.
    /// Handlers never open transactions of their own.
    pub fn txn(&self) -> &'a DatabaseTransaction {
        self.txn
    }

    /// The message being handled, headers and raw payload included.
    pub fn envelope(&self) -> &'a Envelope {
        self.envelope
    }

    /// The consumer handling it.
    pub fn consumer(&self) -> &'a ConsumerName {
        self.consumer
    }

    /// Where [`Ctx::emit`] records events.
    pub fn outbox_mode(&self) -> OutboxMode {
        self.outbox.mode()
    }

    /// Records `event` on the transaction, caused by this message: it
    /// carries the message's conversation and trace, and its journey links
    /// back here. Published once the transaction commits, never if it rolls
    /// back.
    ///
    /// # Errors
    /// [`OutboxError::Invalid`] for an event NATS cannot carry (a rejection
    /// once `?` turns it into a [`HandlerError`]), or the database error.
    pub async fn emit(&self, event: NewEvent) -> Result<(), OutboxError> {
        self.emit_all([event]).await
    }

    /// Records several events, in the order given (also their publishing
    /// order per ordering key), as [`Ctx::emit`] does one.
    ///
    /// # Errors
    /// As [`Ctx::emit`]; none of the events is recorded once the
    /// transaction rolls back.
    pub async fn emit_all(
        &self,
        events: impl IntoIterator<Item = NewEvent>,
    ) -> Result<(), OutboxError> {
        self.outbox
            .enqueue_caused(self.txn, events, Some(&self.cause))
            .await
    }
}

/// A message handler: business writes on the context's transaction.
///
/// It may be called more than once for one message when a transient error
/// forces a retry, each time with a fresh context and transaction. Most
/// handlers are plain async functions registered with
/// [`crate::Registry::register`]; implement this trait for a handler that
/// reads the raw envelope or returns a value to its caller.
pub trait Handle<T = ()>: Send + Sync {
    /// Applies the context's message.
    fn handle<'a>(&'a self, ctx: &'a Ctx<'a>) -> BoxFuture<'a, Result<T, HandlerError>>;
}

impl<T, F> Handle<T> for F
where
    F: for<'a> Fn(&'a Ctx<'a>) -> BoxFuture<'a, Result<T, HandlerError>> + Send + Sync,
{
    fn handle<'a>(&'a self, ctx: &'a Ctx<'a>) -> BoxFuture<'a, Result<T, HandlerError>> {
        self(ctx)
    }
}

/// Lets the compiler see a closure as a [`Handle`]r: a closure's
/// higher-ranked signature is only inferred where a bound names it.
pub fn handler<T, F>(f: F) -> F
where
    F: for<'a> Fn(&'a Ctx<'a>) -> BoxFuture<'a, Result<T, HandlerError>> + Send + Sync,
{
    f
}

/// A payload a handler takes, decoded by the platform before the handler
/// runs. A payload that does not decode is rejected with the reason, and
/// so dead-lettered, the same way for every consumer.
pub trait FromPayload: Sized + Send + 'static {
    /// Decodes and checks `bytes`.
    ///
    /// # Errors
    /// Why the payload can never be handled, for the dead letter.
    fn from_payload(bytes: &[u8]) -> Result<Self, String>;
}

/// A JSON payload, decoded with serde (the usual case).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Json<T>(pub T);

impl<T: DeserializeOwned + Send + 'static> FromPayload for Json<T> {
    fn from_payload(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes)
            .map(Json)
            .map_err(|e| format!("malformed payload: {e}"))
    }
}

/// The raw bytes, for a handler that reads them itself.
impl FromPayload for Vec<u8> {
    fn from_payload(bytes: &[u8]) -> Result<Self, String> {
        Ok(bytes.to_vec())
    }
}

/// An async function `fn(&Ctx, P) -> Result<(), HandlerError>`: what
/// [`crate::Registry::register`] takes. Implemented for every such function;
/// it exists because a bound cannot otherwise say that the function's
/// future borrows the context and is `Send`.
pub trait HandlerFn<'a, P>: Send + Sync {
    /// The function's future.
    type Future: Future<Output = Result<(), HandlerError>> + Send + 'a;
    /// Calls the function.
    fn call(&self, ctx: &'a Ctx<'a>, payload: P) -> Self::Future;
}

impl<'a, P, F, Fut> HandlerFn<'a, P> for F
where
    F: Fn(&'a Ctx<'a>, P) -> Fut + Send + Sync,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'a,
{
    type Future = Fut;
    fn call(&self, ctx: &'a Ctx<'a>, payload: P) -> Fut {
        self(ctx, payload)
    }
}

/// An async function that also takes state the domain built at start-up
/// (its settings, a client): `fn(&Ctx, &S, P) -> Result<(), HandlerError>`,
/// what [`crate::Registry::register_with`] takes.
pub trait StatefulHandlerFn<'a, S: 'a, P>: Send + Sync {
    /// The function's future.
    type Future: Future<Output = Result<(), HandlerError>> + Send + 'a;
    /// Calls the function.
    fn call(&self, ctx: &'a Ctx<'a>, state: &'a S, payload: P) -> Self::Future;
}

impl<'a, S: 'a, P, F, Fut> StatefulHandlerFn<'a, S, P> for F
where
    F: Fn(&'a Ctx<'a>, &'a S, P) -> Fut + Send + Sync,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'a,
{
    type Future = Fut;
    fn call(&self, ctx: &'a Ctx<'a>, state: &'a S, payload: P) -> Fut {
        self(ctx, state, payload)
    }
}

/// A [`HandlerFn`] as a [`Handle`]: decodes the payload, then calls it.
/// What [`crate::Registry::register`] registers; also how a test or a tool
/// runs such a function through [`crate::Inbox::process`] directly.
pub fn from_fn<P, F>(f: F) -> Decoding<F, P>
where
    P: FromPayload,
    F: for<'a> HandlerFn<'a, P>,
{
    Decoding {
        f,
        _payload: PhantomData,
    }
}

/// [`from_fn`] for a [`StatefulHandlerFn`] and its state.
pub fn from_fn_with<S, P, F>(state: S, f: F) -> DecodingWith<F, S, P>
where
    S: Send + Sync,
    P: FromPayload,
    F: for<'a> StatefulHandlerFn<'a, S, P>,
{
    DecodingWith {
        f,
        state,
        _payload: PhantomData,
    }
}

/// The [`Handle`] [`from_fn`] makes.
pub struct Decoding<F, P> {
    f: F,
    _payload: PhantomData<fn(P)>,
}

impl<F, P> Handle for Decoding<F, P>
where
    P: FromPayload,
    F: for<'a> HandlerFn<'a, P>,
{
    fn handle<'a>(&'a self, ctx: &'a Ctx<'a>) -> BoxFuture<'a, Result<(), HandlerError>> {
        match P::from_payload(&ctx.envelope().payload) {
            Ok(payload) => self.f.call(ctx, payload).boxed(),
            Err(reason) => futures::future::ready(Err(HandlerError::Rejected(reason))).boxed(),
        }
    }
}

/// The [`Handle`] [`from_fn_with`] makes.
pub struct DecodingWith<F, S, P> {
    f: F,
    state: S,
    _payload: PhantomData<fn(P)>,
}

impl<F, S, P> Handle for DecodingWith<F, S, P>
where
    S: Send + Sync,
    P: FromPayload,
    F: for<'a> StatefulHandlerFn<'a, S, P>,
{
    fn handle<'a>(&'a self, ctx: &'a Ctx<'a>) -> BoxFuture<'a, Result<(), HandlerError>> {
        match P::from_payload(&ctx.envelope().payload) {
            Ok(payload) => self.f.call(ctx, &self.state, payload).boxed(),
            Err(reason) => futures::future::ready(Err(HandlerError::Rejected(reason))).boxed(),
        }
    }
}

/// Adapts a handler with an output to the registry's `Handle<()>`.
pub(crate) struct Discard<H, T> {
    inner: H,
    _out: PhantomData<fn() -> T>,
}

impl<H, T> Discard<H, T> {
    pub(crate) fn new(inner: H) -> Self {
        Self {
            inner,
            _out: PhantomData,
        }
    }
}

impl<H, T> Handle for Discard<H, T>
where
    T: Send + 'static,
    H: Handle<T>,
{
    fn handle<'a>(&'a self, ctx: &'a Ctx<'a>) -> BoxFuture<'a, Result<(), HandlerError>> {
        self.inner.handle(ctx).map(|r| r.map(|_| ())).boxed()
    }
}
