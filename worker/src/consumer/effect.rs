//! The claim path: side effects outside the transaction (docs/architecture.md, rule 8).

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use chrono::Utc;
use futures::FutureExt;

use async_nats::jetstream;

use service::claim::{ClaimError, ClaimGuard, ClaimOutcome, ClaimPolicy, claim};
use service::{Effect, Envelope, HandlerError};

use super::{Consumer, Verdict};
use crate::fault::FaultPoint;

/// Records a performed effect. The effect happened, so a database outage
/// here is waited out and the completion tried again with the same guard:
/// handling the delivery again would find this instance's own live claim and,
/// once its lease ran out, perform the effect a second time.
async fn record(
    consumer: &Consumer,
    msg: &jetstream::Message,
    guard: &ClaimGuard,
    result: Option<String>,
) -> Result<(), ClaimError> {
    loop {
        match guard.complete(result.clone()).await {
            Err(err) if err.is_outage() => {
                tracing::warn!(error = %err, "effect performed, not yet recorded: database unreachable; waiting to record it");
                consumer.pause();
                if !consumer.wait_for_database(msg).await {
                    return Err(err);
                }
            }
            other => return other,
        }
    }
}

/// Claims, performs, completes; turns each outcome into a verdict.
pub(super) async fn apply(
    consumer: &Consumer,
    msg: &jetstream::Message,
    envelope: &Envelope,
    effect: &dyn Effect,
    policy: &ClaimPolicy,
    delivered: i64,
) -> Verdict {
    let db = consumer.inbox.executor().db();
    let guard = match claim(db, envelope, &consumer.registration.consumer, policy).await {
        Ok(ClaimOutcome::Acquired(guard)) => guard,
        Ok(ClaimOutcome::AlreadyProcessed) => {
            consumer.count("duplicate");
            return Verdict::Ack;
        }
        Ok(ClaimOutcome::Quarantined) => return Verdict::Term,
        Ok(ClaimOutcome::InProgress { lease_until }) => {
            let wait = (lease_until - Utc::now()).to_std().unwrap_or_default();
            tracing::info!(
                ?wait,
                "claim held by another instance; nak until its lease ends"
            );
            return Verdict::Nak(wait.max(Duration::from_millis(50)));
        }
        Err(err) if err.is_outage() => return Verdict::Outage(err.to_string()),
        Err(err) => return consumer.retry_or_give_up(&err.to_string(), delivered),
    };
    FaultPoint::ClaimAfterCommit.hit(consumer.config.fault);
    // A panicking effect is a failed attempt of this claim, not a lost task.
    let performed = AssertUnwindSafe(effect.perform(envelope, guard.idempotency_key()))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| Err(HandlerError::Panicked(service::panic_message(&*panic))));
    match performed {
        Ok(result) => {
            FaultPoint::ClaimAfterCall.hit(consumer.config.fault);
            match record(consumer, msg, &guard, result).await {
                Ok(()) => {
                    consumer.count("processed");
                    Verdict::Ack
                }
                // Another instance holds the claim under a live lease. Its
                // message must not be settled here: should that instance
                // die too, a redelivery is what takes the claim over.
                Err(err @ ClaimError::LeaseLost { .. }) => {
                    tracing::info!(error = %err, "claim taken over while the effect ran; nak until the other lease ends");
                    Verdict::Nak(policy.lease)
                }
                // Quarantined meanwhile: its dead letter is written.
                Err(ClaimError::Quarantined { .. }) => Verdict::Term,
                Err(err) if err.is_outage() => Verdict::Outage(err.to_string()),
                Err(err) => consumer.retry_or_give_up(&err.to_string(), delivered),
            }
        }
        Err(err) => {
            consumer.count("failed");
            let reason = err.to_string();
            if let Err(release) = guard.fail(&reason).await {
                tracing::warn!(error = %release, "could not release the claim; it will expire");
            }
            match err {
                HandlerError::Rejected(_) => Verdict::DeadLetter(reason),
                _ => consumer.retry_or_give_up(&reason, delivered),
            }
        }
    }
}
