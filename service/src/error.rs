//! Errors of units of work and of the inbox.

use sea_orm::DbErr;

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
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// A unique constraint other than the inbox index rejected a write. This is
    /// a real conflict in the business data, never "already processed".
    #[error(
        "message {message_id} (consumer {consumer}): unique constraint {constraint} rejected a write"
    )]
    Constraint {
        /// The message.
        message_id: String,
        /// The consumer.
        consumer: String,
        /// Index name, or the column list where the engine reports only that.
        constraint: String,
        /// The database error.
        #[source]
        source: Box<DbErr>,
    },
    /// Any other database failure (after the executor's retries).
    #[error("message {message_id} (consumer {consumer}): database error: {source}")]
    Database {
        /// The message.
        message_id: String,
        /// The consumer.
        consumer: String,
        /// The database error.
        #[source]
        source: Box<DbErr>,
    },
    /// The handler refused the message for good.
    #[error("message {message_id} (consumer {consumer}) rejected: {reason}")]
    Rejected {
        /// The message.
        message_id: String,
        /// The consumer.
        consumer: String,
        /// Why.
        reason: String,
    },
    /// The handler failed; a redelivery may succeed.
    #[error("message {message_id} (consumer {consumer}): handler failed: {source}")]
    Handler {
        /// The message.
        message_id: String,
        /// The consumer.
        consumer: String,
        /// The handler's error.
        #[source]
        source: BoxError,
    },
    /// The handler panicked; nothing was committed.
    #[error("message {message_id} (consumer {consumer}): handler panicked: {panic}")]
    Panicked {
        /// The message.
        message_id: String,
        /// The consumer.
        consumer: String,
        /// The panic message.
        panic: String,
    },
}

impl InboxError {
    /// True when redelivering the same message cannot succeed, so a consumer
    /// should dead-letter it now instead of waiting for the delivery limit.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Rejected { .. } | Self::Constraint { .. })
    }

    /// True when the database was unreachable (see [`crate::classify::is_outage`]):
    /// the message is not at fault, so its deliveries should not be spent.
    pub fn is_outage(&self) -> bool {
        matches!(self, Self::Database { source, .. } if crate::classify::is_outage(source))
    }
}
