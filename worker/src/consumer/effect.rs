//! The claim path: side effects outside the transaction (docs/architecture.md,
//! rule 8). Claim, perform, complete; each ending is a [`Handled`], like the
//! transactional path's, for the consumer to decide on.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use chrono::Utc;
use futures::FutureExt;
use sea_orm::DatabaseConnection;

use service::claim::{ClaimError, ClaimErrorKind, ClaimGuard, ClaimOutcome, ClaimPolicy, claim};
use service::classify::Blame;
use service::{ConsumerName, Effect, Envelope, HandlerError};

use super::Handled;
use crate::fault::FaultPoint;

/// Where the claim path ended.
pub(super) enum Step {
    /// A final ending.
    Handled(Handled),
    /// The effect was performed; the consumer records it with this same
    /// guard, outside the handling deadline, waiting out whatever keeps the
    /// database from writing it (handling the delivery again would find its
    /// own live claim and, once the lease ran out, perform the effect a
    /// second time).
    Performed {
        /// The claim this instance still holds.
        guard: ClaimGuard,
        /// The effect's result, to record.
        result: Option<String>,
    },
}

/// What the claim path needs from its consumer.
pub(super) struct Claimer<'a> {
    pub(super) db: &'a DatabaseConnection,
    pub(super) consumer: &'a ConsumerName,
    pub(super) policy: &'a ClaimPolicy,
    pub(super) fault: Option<FaultPoint>,
}

impl Claimer<'_> {
    /// Claims, performs, completes.
    pub(super) async fn apply(&self, envelope: &Envelope, effect: &dyn Effect) -> Step {
        let guard = match claim(self.db, envelope, self.consumer, self.policy).await {
            Ok(ClaimOutcome::Acquired(guard)) => guard,
            Ok(ClaimOutcome::AlreadyProcessed) => {
                return Step::Handled(Handled::Done { duplicate: true });
            }
            Ok(ClaimOutcome::Quarantined) => return Step::Handled(Handled::Parked),
            Ok(ClaimOutcome::InProgress { lease_until }) => {
                let wait = (lease_until - Utc::now()).to_std().unwrap_or_default();
                tracing::info!(
                    ?wait,
                    "claim held by another instance; holding the delivery until it finishes or its lease ends"
                );
                return Step::Handled(Handled::Held(wait.max(Duration::from_millis(50))));
            }
            Err(err) => return Step::Handled(unavailable_or_failed(&err)),
        };
        FaultPoint::ClaimAfterCommit.hit(self.fault);
        // A panicking effect is a failed attempt of this claim, not a lost task.
        let performed = AssertUnwindSafe(effect.perform(envelope, guard.idempotency_key()))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(HandlerError::Panicked(service::panic_message(&*panic))));
        match performed {
            Ok(result) => {
                FaultPoint::ClaimAfterCall.hit(self.fault);
                Step::Performed { guard, result }
            }
            Err(HandlerError::Unavailable {
                reason,
                retry_after,
            }) => {
                if let Err(release) = guard.release_unattempted(&reason).await {
                    tracing::warn!(error = %release, "could not release the claim; it will expire");
                }
                Step::Handled(Handled::Resource(reason, retry_after))
            }
            Err(err) => {
                let reason = err.to_string();
                if let Err(release) = guard.fail(&reason).await {
                    tracing::warn!(error = %release, "could not release the claim; it will expire");
                }
                Step::Handled(match err {
                    HandlerError::Rejected(_) => Handled::Failed {
                        reason,
                        permanent: true,
                    },
                    _ => Handled::failed(reason),
                })
            }
        }
    }

    /// What recording a performed effect came to.
    pub(super) fn completed(&self, completed: Result<(), ClaimError>) -> Handled {
        match completed {
            Ok(()) => Handled::Done { duplicate: false },
            // Another instance holds the claim under a live lease. Its
            // message must not be settled here: should that instance die
            // too, a redelivery is what takes the claim over.
            Err(err) if matches!(err.kind(), ClaimErrorKind::LeaseLost) => {
                tracing::info!(error = %err, "claim taken over while the effect ran; holding the delivery until the other instance finishes or its lease ends");
                Handled::Held(self.policy.lease)
            }
            // Quarantined meanwhile: its dead letter is written.
            Err(err) if matches!(err.kind(), ClaimErrorKind::Quarantined) => Handled::Parked,
            Err(err) => unavailable_or_failed(&err),
        }
    }
}

/// A claim error as the consumer treats it: the infrastructure's (an outage
/// or a resource failure) or the message's.
fn unavailable_or_failed(err: &ClaimError) -> Handled {
    match err.blame() {
        Blame::Outage => Handled::Outage(err.to_string()),
        Blame::Resource => Handled::Resource(err.to_string(), None),
        Blame::Message => Handled::failed(err.to_string()),
    }
}

/// Records `guard`'s effect, waiting out database outages and resource
/// failures with `wait` (given whose fault it is and how many times it
/// waited; it returns `false` when the consumer is stopping).
pub(super) async fn record<W, F>(
    claimer: &Claimer<'_>,
    guard: &ClaimGuard,
    result: Option<String>,
    mut wait: W,
) -> Handled
where
    W: FnMut(Blame, u32) -> F,
    F: std::future::Future<Output = bool>,
{
    let mut waits = 0;
    loop {
        match guard.complete(result.clone()).await {
            Err(err) if err.blame() != Blame::Message => {
                waits += 1;
                if waits == 1 {
                    tracing::warn!(error = %err, "effect performed, not yet recorded: the database cannot write it now; waiting to record it");
                }
                // An outage that recurs while the database answers the probe
                // is waited out with growing pauses, not a pause per try.
                let blame = match err.blame() {
                    Blame::Outage if waits > super::MAX_HOLDS => Blame::Resource,
                    blame => blame,
                };
                if !wait(blame, waits).await {
                    // Stopping: the effect happened and its record did not.
                    // The claim stays open; once its lease ends a redelivery
                    // performs the effect again under the same idempotency
                    // key. Say which, so a person can tell the receiver.
                    tracing::error!(
                        claim = guard.id(),
                        message_id = guard.idempotency_key(),
                        error = %err,
                        "stopping with an effect performed but not recorded; a redelivery will perform it again under the same idempotency key"
                    );
                    return unavailable_or_failed(&err);
                }
            }
            completed => return claimer.completed(completed),
        }
    }
}
