//! Settling a delivery: what handling came to, and which delivery this was,
//! become one verdict; the outcome is counted; JetStream is told, and a
//! dead letter is recorded before a message is terminated.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};

use service::HandlerKind;
use service::dead_letter::{DeadLetter, Recorded};

use super::Consumer;

/// What handling one delivery came to, whichever path handled it; one
/// function (`Consumer::verdict`) turns it and the delivery count into what
/// JetStream is told.
#[derive(Debug)]
pub(super) enum Handled {
    /// Applied now, or found applied before.
    Done {
        /// Found applied before.
        duplicate: bool,
    },
    /// Failed for a reason of the message's own.
    Failed {
        /// Why, for the log and the dead letter.
        reason: String,
        /// No redelivery can succeed (malformed, rejected, a business
        /// constraint): dead-letter now.
        permanent: bool,
    },
    /// Another instance holds its claim: look again after at most this long
    /// (the rest of its lease). Not a failure: the delivery is held meanwhile
    /// (`Consumer::hold_or_settle`), and nak'ed only past the infra patience.
    Held(Duration),
    /// Its claim is quarantined: a person decides; the dead letter exists.
    Parked,
    /// The database was unreachable: not the message's fault.
    Outage(String),
    /// The database answered but could not do the work now (a lock or
    /// statement timeout, a full disk, read-only), or an effect's target is
    /// down or overloaded: not the message's fault. The consumer holds the
    /// delivery and tries again, up to its patience, waiting at least as
    /// long as the target asked (`Retry-After`).
    Resource(String, Option<Duration>),
}

impl Handled {
    /// A failure a redelivery may not meet.
    pub(super) fn failed(reason: String) -> Self {
        Self::Failed {
            reason,
            permanent: false,
        }
    }
}

/// What to tell JetStream about a message.
#[derive(Debug)]
enum Verdict {
    /// Done (processed or duplicate).
    Ack,
    /// Redeliver after the delay.
    Nak(Duration),
    /// Never redeliver; the reason is already recorded elsewhere.
    Term,
    /// Record a dead letter with this reason, then term.
    DeadLetter(String),
    /// The database is unreachable: hold the delivery and try again once it
    /// answers, without spending a delivery.
    Outage(String),
}

/// The database could not be reached while settling a delivery.
#[derive(Debug)]
pub(super) struct Unreachable;

impl Consumer {
    /// The one decision: what handling came to, and which delivery this was,
    /// become what JetStream is told.
    fn verdict(&self, handled: Handled, delivered: i64) -> Verdict {
        match handled {
            Handled::Done { .. } => Verdict::Ack,
            Handled::Failed {
                reason,
                permanent: true,
            } => Verdict::DeadLetter(reason),
            Handled::Failed { reason, .. } if delivered >= self.max_deliver() => {
                Verdict::DeadLetter(format!("gave up after {delivered} deliveries: {reason}"))
            }
            Handled::Failed { reason, .. } => {
                let delay = self.nak_delay(delivered);
                tracing::warn!(
                    error = reason,
                    ?delay,
                    "handling failed; nak for redelivery"
                );
                Verdict::Nak(delay)
            }
            Handled::Held(wait) => Verdict::Nak(wait),
            Handled::Parked => Verdict::Term,
            Handled::Outage(reason) => Verdict::Outage(reason),
            // `Consumer::handle` holds these up to its patience and turns
            // them into failures after it, so it never settles one; should
            // one be settled, it is redelivered later, without a failure
            // counted or a dead letter.
            Handled::Resource(reason, _) => {
                let delay = self.nak_delay(delivered);
                tracing::warn!(
                    error = reason,
                    ?delay,
                    "the database cannot do the work now; nak for redelivery"
                );
                Verdict::Nak(delay)
            }
        }
    }

    /// Counts the outcome and tells JetStream the verdict. `Err` when the
    /// database was unreachable, so nothing was settled and the caller holds
    /// the delivery.
    pub(super) async fn settle(
        &self,
        msg: &jetstream::Message,
        handled: Handled,
        subject: &str,
        message_id: Option<&str>,
        headers: &BTreeMap<String, String>,
        delivered: i64,
    ) -> Result<(), Unreachable> {
        match &handled {
            Handled::Done { duplicate: true } => self.count("duplicate"),
            Handled::Done { duplicate: false } => {
                self.count("processed");
                self.record_latency(msg, headers);
            }
            Handled::Failed { .. } => self.count("failed"),
            Handled::Held(_) | Handled::Parked | Handled::Outage(_) | Handled::Resource(..) => {}
        }
        let verdict = self.verdict(handled, delivered);
        tracing::debug!(?verdict, delivered, "settling the delivery");
        match verdict {
            Verdict::Ack => {
                if let Err(err) = msg.double_ack().await {
                    tracing::warn!(error = %err, "ack not confirmed; a redelivery will be a Duplicate");
                }
            }
            Verdict::Nak(delay) => {
                if let Err(err) = msg.ack_with(AckKind::Nak(Some(delay))).await {
                    tracing::warn!(error = %err, "nak failed; the ack wait will redeliver");
                }
            }
            Verdict::Term => {
                if let Err(err) = msg.double_ack_with(AckKind::Term).await {
                    tracing::warn!(error = %err, "term not confirmed");
                }
            }
            Verdict::DeadLetter(reason) => {
                return self
                    .dead_letter(msg, subject, message_id, headers, &reason, delivered)
                    .await;
            }
            Verdict::Outage(reason) => {
                tracing::warn!(reason, "database unreachable; holding the delivery");
                return Err(Unreachable);
            }
        }
        Ok(())
    }

    pub(super) fn nak_delay(&self, delivered: i64) -> Duration {
        let failures = u32::try_from(delivered.max(1)).unwrap_or(u32::MAX);
        service::Backoff::new(self.config.nak_base, self.config.nak_max).delay(failures)
    }

    async fn dead_letter(
        &self,
        msg: &jetstream::Message,
        subject: &str,
        message_id: Option<&str>,
        headers: &BTreeMap<String, String>,
        reason: &str,
        delivered: i64,
    ) -> Result<(), Unreachable> {
        let row = DeadLetter {
            consumer: self.registration.consumer.as_str(),
            message_id,
            subject,
            payload: &msg.payload,
            headers,
            error: reason,
            deliveries: i32::try_from(delivered).unwrap_or(i32::MAX),
        };
        let db = self.inbox.executor().db();
        let recorded = match &self.registration.kind {
            // A claim row must not outlive its message unfinished.
            HandlerKind::Effect(..) => service::claim::give_up(db, &row).await,
            HandlerKind::Transaction(_) => row.record(db).await,
        };
        match recorded {
            Ok(recorded) => {
                if recorded == Recorded::Written {
                    metrics::counter!("seawall_dead_letters_total", "consumer" => self.registration.consumer.to_string()).increment(1);
                    tracing::warn!(reason, "dead-lettered");
                } else {
                    tracing::info!(
                        reason,
                        "already dead-lettered (an earlier copy was given up on); this copy is terminated without a second row"
                    );
                }
                if let Err(err) = msg.double_ack_with(AckKind::Term).await {
                    tracing::warn!(error = %err, "term not confirmed; a redelivery may dead-letter it again");
                }
            }
            Err(err) if service::classify::is_outage(&err) => return Err(Unreachable),
            // A resource failure (read-only, disk full) falls through to the
            // nak below: the message comes back and is recorded once the
            // database can write.
            Err(err) => {
                // JetStream redelivers without limit, so the message comes
                // back and is recorded once the insert succeeds.
                tracing::error!(error = %err, reason, "could not record the dead letter; nak instead");
                if let Err(err) = msg
                    .ack_with(AckKind::Nak(Some(self.nak_delay(delivered))))
                    .await
                {
                    tracing::warn!(error = %err, "nak failed; the ack wait will redeliver");
                }
            }
        }
        Ok(())
    }
}
