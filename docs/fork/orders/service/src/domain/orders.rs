//! Orders: an `orders.placed` message becomes an accepted order and an
//! `orders.accepted` event, in the inbox's transaction; the `shipping`
//! consumer then POSTs each `orders.accepted` event to the shipping service.

use chrono::Utc;
use sea_orm::ActiveValue::Set;
use sea_orm::EntityTrait;
use serde::{Deserialize, Serialize};

use entity::domain::orders;

use super::Settings;
use crate::{Ctx, HandlerError, Json, NewEvent};

/// The consumer that accepts placed orders.
pub const ORDERS_CONSUMER: &str = "orders";
/// The consumer that hands accepted orders to the shipping service.
pub const SHIPPING_CONSUMER: &str = "shipping";
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

/// Accepts a placed order: the order row and the `orders.accepted` event.
///
/// # Errors
/// A rejection for an amount out of range; database errors.
pub async fn place(
    ctx: &Ctx<'_>,
    settings: &Settings,
    Json(order): Json<OrderPlaced>,
) -> Result<(), HandlerError> {
    let max = settings.orders_max_amount;
    if order.amount <= 0 || (max > 0 && order.amount > max) {
        return Err(HandlerError::Rejected(format!(
            "amount {} is out of range",
            order.amount
        )));
    }
    orders::Entity::insert(orders::ActiveModel {
        order_id: Set(order.order_id.clone()),
        amount: Set(order.amount),
        accepted_at: Set(Utc::now()),
    })
    .exec_without_returning(ctx.txn())
    .await?;
    let accepted = OrderAccepted {
        order_id: order.order_id.clone(),
    };
    ctx.emit(NewEvent::json(ACCEPTED_SUBJECT, &accepted)?.with_ordering_key(order.order_id))
        .await?;
    Ok(())
}
