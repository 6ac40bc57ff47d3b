//! Test support: wait until everything in flight has settled, instead of
//! sleeping in tests.

use std::time::Duration;

use async_nats::jetstream;
use sea_orm::DatabaseConnection;

/// What was still moving when [`drain`] gave up.
#[derive(Debug, thiserror::Error)]
#[error(
    "not drained after {timeout:?}: {pending_outbox} outbox rows pending, {consumer_backlog} messages unacknowledged"
)]
pub struct DrainTimeout {
    /// The timeout.
    pub timeout: Duration,
    /// Outbox rows neither published nor dead.
    pub pending_outbox: u64,
    /// Messages pending or awaiting ack across the consumers.
    pub consumer_backlog: u64,
}

/// Waits until the outbox has no pending rows and each named durable consumer
/// on `stream` has nothing pending and nothing awaiting an ack.
///
/// # Errors
/// [`DrainTimeout`] with what was still in flight.
pub async fn drain(
    db: &DatabaseConnection,
    js: &jetstream::Context,
    stream: &str,
    consumers: &[&str],
    timeout: Duration,
) -> Result<(), DrainTimeout> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let pending_outbox = crate::relay::pending_count(db).await.unwrap_or(u64::MAX);
        let mut consumer_backlog = 0u64;
        for name in consumers {
            consumer_backlog += match js
                .get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(*name, stream)
                .await
            {
                Ok(mut c) => match c.info().await {
                    Ok(info) => info.num_pending + info.num_ack_pending as u64,
                    Err(_) => u64::MAX / 4,
                },
                Err(_) => u64::MAX / 4,
            };
        }
        if pending_outbox == 0 && consumer_backlog == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(DrainTimeout {
                timeout,
                pending_outbox,
                consumer_backlog,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
