//! Errors of units of work and of the inbox.

use std::fmt;

use sea_orm::DbErr;

use crate::envelope::{ConsumerName, MessageId};

/// Boxed error for handler failures that carry their own type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a unit of work (a handler inside the inbox, or any unit given to the
/// executor) did not commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// A database statement failed. Transient ones are retried by the executor.
    #[error("database error: {0}")]
    Database(#[source] DbErr),
    /// The message can never succeed (malformed payload, invalid values):
    /// retrying is pointless, it belongs in `dead_letter`.
    #[error("rejected: {0}")]
    Rejected(String),
    /// The handler failed in a way a later delivery may not (a downstream call).
    #[error("handler failed: {0}")]
    Failed(#[source] BoxError),
    /// What the handler calls is down or overloaded (connection refused or
    /// reset, a timeout, HTTP 429 or 5xx): not the message's fault. A
    /// consumer holds the delivery and tries again, as for a database that
    /// cannot do the work, without spending its deliveries or attempts.
    #[error("unavailable: {reason}")]
    Unavailable {
        /// What failed, for the log and, past the patience, the dead letter.
        reason: String,
        /// How long the target asked to be left alone (`Retry-After`).
        retry_after: Option<std::time::Duration>,
    },
    /// The handler panicked; its transaction was rolled back.
    #[error("handler panicked: {0}")]
    Panicked(String),
    /// The connection was lost while `COMMIT` was under way: the unit may or
    /// may not have committed, and running it again could apply it twice, so
    /// the executor does not. Only units guarded by an inbox marker (see
    /// [`crate::Unit::guarded_by_marker`]) are re-run after such a loss.
    #[error("commit outcome unknown: the connection was lost during COMMIT: {0}")]
    CommitUnknown(#[source] DbErr),
}

/// Why [`crate::Inbox::process`] did not process a message. A duplicate is not
/// an error: it is [`crate::Outcome::Duplicate`].
///
/// It names the message and the consumer once; [`InboxError::kind`] says
/// what went wrong, and the underlying error (the database's, the
/// handler's) is its [`std::error::Error::source`].
#[derive(Debug)]
pub struct InboxError {
    message_id: MessageId,
    consumer: ConsumerName,
    /// Boxed: a database error is large, and this error travels in every
    /// `Result` of the inbox.
    kind: Box<InboxErrorKind>,
}

/// What went wrong in an [`InboxError`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxErrorKind {
    /// A unique constraint other than the inbox index rejected a write. This is
    /// a real conflict in the business data, never "already processed".
    #[error("unique constraint {constraint} rejected a write")]
    Constraint {
        /// Index name, or the column list where the engine reports only that.
        constraint: String,
        /// The database error.
        #[source]
        source: DbErr,
    },
    /// Any other database failure (after the executor's retries).
    #[error("database error: {0}")]
    Database(#[source] DbErr),
    /// The handler refused the message for good, for this reason.
    #[error("rejected: {0}")]
    Rejected(String),
    /// The handler failed; a redelivery may succeed.
    #[error("handler failed: {0}")]
    Handler(#[source] BoxError),
    /// What the handler calls is down or overloaded (see
    /// [`HandlerError::Unavailable`]): not the message's fault.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The handler panicked, with this message; nothing was committed.
    #[error("handler panicked: {0}")]
    Panicked(String),
}

impl InboxError {
    pub(crate) fn new(message_id: MessageId, consumer: ConsumerName, kind: InboxErrorKind) -> Self {
        Self {
            message_id,
            consumer,
            kind: Box::new(kind),
        }
    }

    /// The message that was not processed.
    pub fn message_id(&self) -> &MessageId {
        &self.message_id
    }

    /// The consumer it was not processed for.
    pub fn consumer(&self) -> &ConsumerName {
        &self.consumer
    }

    /// What went wrong.
    pub fn kind(&self) -> &InboxErrorKind {
        &self.kind
    }

    /// True when redelivering the same message cannot succeed, so a consumer
    /// should dead-letter it now instead of waiting for the delivery limit.
    pub fn is_permanent(&self) -> bool {
        matches!(
            *self.kind,
            InboxErrorKind::Rejected(_) | InboxErrorKind::Constraint { .. }
        )
    }

    /// Whose fault it is (see [`crate::classify::Blame`]): an outage or a
    /// resource failure is not the message's, so its deliveries should not
    /// be spent on it.
    pub fn blame(&self) -> crate::classify::Blame {
        match &*self.kind {
            InboxErrorKind::Database(source) => crate::classify::blame(source),
            InboxErrorKind::Unavailable(_) => crate::classify::Blame::Resource,
            _ => crate::classify::Blame::Message,
        }
    }

    /// True when the database was unreachable (see [`crate::classify::is_outage`]).
    pub fn is_outage(&self) -> bool {
        self.blame() == crate::classify::Blame::Outage
    }
}

impl fmt::Display for InboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message {} (consumer {}): {}",
            self.message_id, self.consumer, self.kind
        )
    }
}

/// The source is the kind's: the database's or the handler's error itself,
/// so a caller can downcast it.
impl std::error::Error for InboxError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.kind.source()
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    fn inbox_error(kind: InboxErrorKind) -> InboxError {
        InboxError::new(
            MessageId::parse("m-1").unwrap(),
            ConsumerName::parse("credits").unwrap(),
            kind,
        )
    }

    #[test]
    fn a_database_failure_is_the_source_of_the_inbox_error() {
        let err = inbox_error(InboxErrorKind::Database(DbErr::Custom("gone".into())));
        let source = err.source().expect("the database error is the source");
        assert!(
            matches!(source.downcast_ref::<DbErr>(), Some(DbErr::Custom(text)) if text == "gone"),
            "{source:?}"
        );
        assert_eq!(
            err.to_string(),
            "message m-1 (consumer credits): database error: Custom Error: gone"
        );
    }

    #[test]
    fn a_constraint_violation_keeps_the_database_error_and_names_the_constraint() {
        let err = inbox_error(InboxErrorKind::Constraint {
            constraint: "ix_credit_reference".into(),
            source: DbErr::Custom("duplicate key".into()),
        });
        assert!(
            err.source()
                .and_then(|s| s.downcast_ref::<DbErr>())
                .is_some()
        );
        assert_eq!(
            err.to_string(),
            "message m-1 (consumer credits): unique constraint ix_credit_reference rejected a write"
        );
        assert!(err.is_permanent());
    }

    #[test]
    fn a_rejection_has_no_source() {
        let err = inbox_error(InboxErrorKind::Rejected("malformed".into()));
        assert!(err.source().is_none());
        assert_eq!(err.message_id().as_str(), "m-1");
        assert_eq!(err.consumer().as_str(), "credits");
        assert!(err.is_permanent() && !err.is_outage());
    }
}
