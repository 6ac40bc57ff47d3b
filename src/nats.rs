//! Connecting to NATS from a URL setting.

use std::time::Duration;

use anyhow::{Context, Result};

/// The servers of a NATS URL setting: one URL, or several separated by
/// commas (the seeds of a cluster, so a process can start while one node is
/// down).
///
/// # Errors
/// A URL that does not parse, named.
pub fn servers(url: &str) -> Result<Vec<async_nats::ServerAddr>> {
    url.split(',')
        .map(|u| {
            u.trim()
                .parse::<async_nats::ServerAddr>()
                .with_context(|| format!("invalid NATS URL {u:?}"))
        })
        .collect()
}

/// Connects to NATS, naming the URL when it is unreachable.
///
/// # Errors
/// No server answered within 5 s, or the URL is invalid.
pub async fn connect(url: &str) -> Result<async_nats::Client> {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(servers(url)?)
        .await
        .with_context(|| format!("connecting to NATS at {url}"))
}

/// Connects to NATS in the background: returns at once and keeps trying, so
/// a process that can work without NATS (the admin API alone) starts while
/// the broker is down and reports it as not ready until it connects.
///
/// # Errors
/// The URL is invalid.
pub async fn connect_eventually(url: &str) -> Result<async_nats::Client> {
    async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(servers(url)?)
        .await
        .with_context(|| format!("connecting to NATS at {url}"))
}
