//! The example domain: crediting accounts from `credits.requested` messages.
//!
//! This is what domain logic looks like on the platform: a handler that
//! makes several business writes (one of them a bulk `update_many`) and
//! emits an event, all on the transaction of the context it is given.

use std::future::Future;

use chrono::Utc;
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ActiveValue::{NotSet, Set},
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter,
};
use serde::{Deserialize, Serialize};

use entity::domain::{account, credit};

use super::Settings;
use crate::envelope::MessageId;
use crate::error::HandlerError;
use crate::handler::{Ctx, FromPayload, Handle};
use crate::outbox::NewEvent;

/// Consumer name of the demo credit handler.
pub const CREDIT_CONSUMER: &str = "credit";
/// Stream holding the demo subjects.
pub const CREDITS_STREAM: &str = "CREDITS";
/// Subject of incoming credit requests.
pub const REQUESTED_SUBJECT: &str = "credits.requested";
/// Subject of the events the handler emits.
pub const APPLIED_SUBJECT: &str = "credits.applied";
/// Longest accepted account id.
pub const MAX_ACCOUNT_ID_LEN: usize = 255;

/// A request to add `amount` cents to an account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreditRequest {
    /// The account to credit; created on first use.
    pub account_id: String,
    /// Positive integer cents.
    pub amount: i64,
    /// Optional business reference, unique across all credits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

impl CreditRequest {
    /// Parses and validates a JSON payload.
    ///
    /// # Errors
    /// A readable reason: the JSON error, or which field is out of range.
    pub fn parse(payload: &[u8]) -> Result<Self, String> {
        let req: Self = serde_json::from_slice(payload)
            .map_err(|e| format!("malformed credit request: {e}"))?;
        if req.account_id.trim().is_empty() || req.account_id.len() > MAX_ACCOUNT_ID_LEN {
            return Err(format!(
                "invalid credit request: account_id must be 1 to {MAX_ACCOUNT_ID_LEN} bytes"
            ));
        }
        if req.amount <= 0 {
            return Err(format!(
                "invalid credit request: amount must be a positive integer number of cents, got {}",
                req.amount
            ));
        }
        Ok(req)
    }
}

/// Decoded and checked by the platform before [`credit`] runs; a request
/// that fails [`CreditRequest::parse`] is dead-lettered with its reason.
impl FromPayload for CreditRequest {
    fn from_payload(bytes: &[u8]) -> Result<Self, String> {
        Self::parse(bytes)
    }
}

/// The `credits.applied` event payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreditApplied {
    /// Id of the `credits.requested` message that caused it.
    pub message_id: String,
    /// The credited account.
    pub account_id: String,
    /// Cents added.
    pub amount: i64,
    /// Balance after the credit, in cents.
    pub balance: i64,
}

/// Applies a credit on the context's transaction: the credit row, the
/// account balance (created if needed) and the `credits.applied` event.
///
/// # Errors
/// Database errors, including a unique violation of `ix_credit_reference`
/// when the reference was used before.
pub async fn apply_credit(
    ctx: &Ctx<'_>,
    req: &CreditRequest,
) -> Result<CreditApplied, HandlerError> {
    let (txn, message_id) = (ctx.txn(), &ctx.envelope().message_id);
    let now = Utc::now();
    credit::Entity::insert(credit::ActiveModel {
        id: NotSet,
        message_id: Set(message_id.to_string()),
        account_id: Set(req.account_id.clone()),
        amount: Set(req.amount),
        reference: Set(req.reference.clone()),
        created_at: Set(now),
    })
    .exec_without_returning(txn)
    .await?;
    let balance = add_to_balance(txn, &req.account_id, req.amount).await?;
    let applied = CreditApplied {
        message_id: message_id.to_string(),
        account_id: req.account_id.clone(),
        amount: req.amount,
        balance,
    };
    let event =
        NewEvent::json(APPLIED_SUBJECT, &applied)?.with_ordering_key(req.account_id.clone());
    ctx.emit(event).await?;
    Ok(applied)
}

/// Adds `amount` to the account's balance and returns the new balance. The
/// account is created if missing; the increment is one bulk `update_many`
/// on the caller's connection, so on a transaction it commits or rolls back
/// with everything else.
///
/// # Errors
/// Database errors.
pub async fn add_to_balance<C: ConnectionTrait>(
    conn: &C,
    account_id: &str,
    amount: i64,
) -> Result<i64, DbErr> {
    let now = Utc::now();
    account::Entity::insert(account::ActiveModel {
        account_id: Set(account_id.to_owned()),
        balance: Set(0),
        updated_at: Set(now),
    })
    .on_conflict_do_nothing_on([account::Column::AccountId])
    .exec_without_returning(conn)
    .await?;
    account::Entity::update_many()
        .col_expr(
            account::Column::Balance,
            Expr::col(account::Column::Balance).add(amount),
        )
        .col_expr(account::Column::UpdatedAt, Expr::value(now))
        .filter(account::Column::AccountId.eq(account_id))
        .exec(conn)
        .await?;
    let row = account::Entity::find_by_id(account_id.to_owned())
        .one(conn)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound(format!("account {account_id}")))?;
    Ok(row.balance)
}

/// The `credit` consumer: a decoded request, applied on the context's
/// transaction, then the configured simulated work (`demo_work_ms`, to make
/// races between instances observable).
///
/// # Errors
/// As [`apply_credit`].
pub async fn credit(
    ctx: &Ctx<'_>,
    settings: &Settings,
    req: CreditRequest,
) -> Result<(), HandlerError> {
    apply_credit(ctx, &req).await?;
    if settings.demo_work_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(settings.demo_work_ms)).await;
    }
    Ok(())
}

/// [`credit`] with `settings`, for running it through
/// [`crate::Inbox::process`] directly (tools, benchmarks).
pub fn credit_handler(settings: Settings) -> impl Handle {
    crate::handler::from_fn_with(settings, credit)
}

/// The hazard the inbox exists to prevent, kept as a teaching example: "have I
/// credited this message before?" checked, then the credit written, with no
/// unique index deciding. `both_checked` resolves once every racing instance
/// has done its check, which is exactly the interleaving that happens in
/// production when a redelivery reaches a second instance.
///
/// Returns whether this call applied the credit.
///
/// # Errors
/// Database errors.
pub async fn naive_apply_credit<C, F>(
    conn: &C,
    message_id: &MessageId,
    req: &CreditRequest,
    both_checked: F,
) -> Result<bool, DbErr>
where
    C: ConnectionTrait,
    F: Future<Output = ()>,
{
    let seen = credit::Entity::find()
        .filter(credit::Column::MessageId.eq(message_id.as_str()))
        .one(conn)
        .await?
        .is_some();
    both_checked.await;
    if seen {
        return Ok(false);
    }
    credit::Entity::insert(credit::ActiveModel {
        id: NotSet,
        message_id: Set(message_id.to_string()),
        account_id: Set(req.account_id.clone()),
        amount: Set(req.amount),
        reference: Set(None),
        created_at: Set(Utc::now()),
    })
    .exec_without_returning(conn)
    .await?;
    add_to_balance(conn, &req.account_id, req.amount).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn requests_are_validated() {
        assert!(CreditRequest::parse(br#"{"account_id":"a","amount":5}"#).is_ok());
        for bad in [
            &br#"{"account_id":"a","amount":-5}"#[..],
            br#"{"account_id":"a","amount":1.5}"#,
            br#"{"account_id":"","amount":5}"#,
            br#"{"amount":5}"#,
            b"not json",
        ] {
            assert!(
                CreditRequest::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

    /// Arbitrary payloads never panic the credit parser; what it accepts is valid.
        #[test]
        fn credit_payloads_from_arbitrary_bytes_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(req) = CreditRequest::parse(&payload) {
                prop_assert!(req.amount > 0);
                prop_assert!(!req.account_id.trim().is_empty());
            }
        }

        /// JSON-shaped payloads too (closer to what a producer sends).
        #[test]
        fn credit_payloads_shaped_like_json_never_panic(account in ".{0,300}", amount in any::<i64>(), extra in ".{0,20}") {
            // Digits right after the amount would only make it another number.
            prop_assume!(!extra.starts_with(|c: char| c.is_ascii_digit()));
            let payload = format!("{{\"account_id\":{},\"amount\":{amount}{extra}}}", serde_json::to_string(&account).unwrap_or_default());
            if let Ok(req) = CreditRequest::parse(payload.as_bytes()) {
                prop_assert_eq!(req.amount, amount);
                prop_assert!(amount > 0);
            }
        }
    }
}
