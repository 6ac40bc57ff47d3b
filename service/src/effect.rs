//! Effects as plain async functions: `async fn(ctx: EffectCtx<'_>, state:
//! &S, payload: P) -> Result<Option<String>, HandlerError>`, the payload
//! decoded by the platform (`Json<T>`) as a handler's is, registered with
//! [`crate::Registry::register_effect_with`]. An effect that reads the raw
//! envelope implements [`crate::Effect`] instead.

use std::future::Future;
use std::marker::PhantomData;

use futures::FutureExt;
use futures::future::BoxFuture;

use crate::envelope::Envelope;
use crate::error::HandlerError;
use crate::handler::FromPayload;
use crate::registry::Effect;

/// What an effect function sees besides its payload: the message, and the
/// key the receiver dedupes on.
#[derive(Debug, Clone, Copy)]
pub struct EffectCtx<'a> {
    envelope: &'a Envelope,
    idempotency_key: &'a str,
}

impl<'a> EffectCtx<'a> {
    /// The message being handled, headers and raw payload included.
    pub fn envelope(&self) -> &'a Envelope {
        self.envelope
    }

    /// The same on every attempt for this message and consumer (the
    /// message id): send it to the receiver (an `Idempotency-Key` header),
    /// so a repeat after a crash between performing and recording is
    /// recognised there.
    pub fn idempotency_key(&self) -> &'a str {
        self.idempotency_key
    }
}

/// An async function `fn(EffectCtx, &S, P) -> Result<Option<String>,
/// HandlerError>`: what [`crate::Registry::register_effect_with`] takes.
/// `Ok` may carry a short result to record with the claim. Implemented for
/// every such function; it exists because a bound cannot otherwise say
/// that the function's future borrows its arguments and is `Send`.
pub trait EffectFn<'a, S: 'a, P>: Send + Sync {
    /// The function's future.
    type Future: Future<Output = Result<Option<String>, HandlerError>> + Send + 'a;
    /// Calls the function.
    fn call(&self, ctx: EffectCtx<'a>, state: &'a S, payload: P) -> Self::Future;
}

impl<'a, S: 'a, P, F, Fut> EffectFn<'a, S, P> for F
where
    F: Fn(EffectCtx<'a>, &'a S, P) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Option<String>, HandlerError>> + Send + 'a,
{
    type Future = Fut;
    fn call(&self, ctx: EffectCtx<'a>, state: &'a S, payload: P) -> Fut {
        self(ctx, state, payload)
    }
}

/// An [`EffectFn`] and its state as an [`Effect`]: decodes the payload,
/// then calls the function; a payload that does not decode is rejected
/// (dead-lettered with the reason) without it.
pub struct DecodingEffect<F, S, P> {
    f: F,
    state: S,
    _payload: PhantomData<fn(P)>,
}

impl<F, S, P> DecodingEffect<F, S, P>
where
    S: Send + Sync,
    P: FromPayload,
    F: for<'a> EffectFn<'a, S, P>,
{
    /// `f` with `state`, as [`crate::Registry::register_effect_with`]
    /// registers it.
    pub fn new(state: S, f: F) -> Self {
        Self {
            f,
            state,
            _payload: PhantomData,
        }
    }
}

impl<F, S, P> Effect for DecodingEffect<F, S, P>
where
    S: Send + Sync,
    P: FromPayload,
    F: for<'a> EffectFn<'a, S, P>,
{
    fn perform<'a>(
        &'a self,
        envelope: &'a Envelope,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, HandlerError>> {
        match P::from_payload(&envelope.payload) {
            Ok(payload) => {
                let ctx = EffectCtx {
                    envelope,
                    idempotency_key,
                };
                self.f.call(ctx, &self.state, payload).boxed()
            }
            Err(reason) => futures::future::ready(Err(HandlerError::Rejected(reason))).boxed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde::Deserialize;

    use super::*;
    use crate::Json;
    use crate::envelope::MessageId;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Shipment {
        order: String,
    }

    /// What the effect function was called with: the order and the key.
    type Calls = Mutex<Vec<(String, String)>>;

    async fn ship(
        ctx: EffectCtx<'_>,
        calls: &Calls,
        Json(shipment): Json<Shipment>,
    ) -> Result<Option<String>, HandlerError> {
        let key = ctx.idempotency_key().to_owned();
        calls.lock().unwrap().push((shipment.order.clone(), key));
        Ok(Some(format!("shipped {}", shipment.order)))
    }

    fn envelope(payload: &str) -> Envelope {
        Envelope::new(MessageId::parse("m-1").unwrap(), "orders.placed", payload)
    }

    #[tokio::test]
    async fn an_effect_function_gets_its_decoded_payload_and_the_key() {
        let effect = DecodingEffect::new(Calls::default(), ship);
        let done = effect
            .perform(&envelope(r#"{"order":"o-7"}"#), "key-9")
            .await
            .unwrap();
        assert_eq!(done.as_deref(), Some("shipped o-7"));
        assert_eq!(
            *effect.state.lock().unwrap(),
            vec![("o-7".to_owned(), "key-9".to_owned())]
        );
    }

    #[tokio::test]
    async fn a_payload_that_does_not_decode_is_rejected_without_calling_the_effect() {
        let effect = DecodingEffect::new(Calls::default(), ship);
        let refused = effect.perform(&envelope("{not json"), "m-1").await;
        assert!(
            matches!(&refused, Err(HandlerError::Rejected(reason)) if reason.starts_with("malformed payload")),
            "{refused:?}"
        );
        assert!(effect.state.lock().unwrap().is_empty());
    }
}
