//! PostgreSQL `LISTEN/NOTIFY` wake-ups for the relay.
//!
//! A trigger on `outbox_message` notifies channel `seawall_outbox` when a
//! transaction that inserted rows commits, so a relay in another process
//! publishes without waiting for its poll interval.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::DatabaseConnection;
use sea_orm::sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The channel the outbox trigger notifies.
pub const OUTBOX_CHANNEL: &str = "seawall_outbox";

/// Listens on [`OUTBOX_CHANNEL`] and wakes `wake` per notification. Lost
/// connections are re-established; meanwhile polling covers the gap.
pub fn spawn_pg_listener(
    db: &DatabaseConnection,
    wake: Arc<Notify>,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    let pool = db.get_postgres_connection_pool().clone();
    tokio::spawn(async move {
        loop {
            let listener = async {
                let mut listener = PgListener::connect_with(&pool).await?;
                listener.listen(OUTBOX_CHANNEL).await?;
                loop {
                    listener.recv().await?;
                    wake.notify_one();
                }
                #[allow(unreachable_code)]
                Ok::<(), sea_orm::sqlx::Error>(())
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                res = listener => {
                    if let Err(err) = res {
                        tracing::debug!(error = %err, "outbox LISTEN connection lost; reconnecting");
                    }
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    })
}
