//! Waiting for conditions instead of sleeping for fixed times.

use std::time::Duration;

/// Waits until a seawall process has provisioned `stream`.
pub async fn wait_for_stream(js: &async_nats::jetstream::Context, stream: &str) {
    wait_until(
        &format!("the {stream} stream"),
        Duration::from_secs(30),
        || async { js.get_stream(stream).await.is_ok() },
    )
    .await;
}

/// Polls `check` until it is true, failing the test after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
