//! Orders: an `orders.placed` message becomes an accepted order and an
//! `orders.accepted` event, in the inbox's transaction.

use chrono::Utc;
use futures::future::BoxFuture;
use sea_orm::ActiveValue::Set;
use sea_orm::{DatabaseTransaction, DbErr, EntityTrait};
use serde::{Deserialize, Serialize};

use entity::orders;

use crate::{Envelope, Handle, HandlerError, NewEvent, Outbox};

/// The consumer's name.
pub const ORDERS_CONSUMER: &str = "orders";
/// The stream of the orders subjects.
pub const ORDERS_STREAM: &str = "ORDERS";
/// Incoming orders.
pub const PLACED_SUBJECT: &str = "orders.placed";
/// The events this service emits.
pub const ACCEPTED_SUBJECT: &str = "orders.accepted";

/// An `orders.placed` payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderPlaced {
    /// The producer's order id.
    pub order_id: String,
    /// Positive amount in cents.
    pub amount: i64,
}

/// The `orders.accepted` payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderAccepted {
    /// The order.
    pub order_id: String,
}

/// Accepts placed orders.
#[derive(Debug, Clone, Default)]
pub struct OrderHandler;

impl Handle<()> for OrderHandler {
    fn handle<'a>(
        &'a self,
        txn: &'a DatabaseTransaction,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let order: OrderPlaced = serde_json::from_slice(&envelope.payload)
                .map_err(|e| HandlerError::Rejected(format!("malformed order: {e}")))?;
            if order.amount <= 0 {
                return Err(HandlerError::Rejected("amount must be positive".into()));
            }
            orders::Entity::insert(orders::ActiveModel {
                order_id: Set(order.order_id.clone()),
                amount: Set(order.amount),
                accepted_at: Set(Utc::now()),
            })
            .exec_without_returning(txn)
            .await?;
            let accepted = OrderAccepted {
                order_id: order.order_id.clone(),
            };
            let payload = serde_json::to_vec(&accepted).map_err(|e| DbErr::Json(e.to_string()))?;
            Outbox::enqueue(
                txn,
                NewEvent::new(ACCEPTED_SUBJECT, payload).with_ordering_key(order.order_id),
            )
            .await?;
            Ok(())
        })
    }
}
