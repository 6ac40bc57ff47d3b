//! The consumers of a process: one durable JetStream consumer per
//! registration on the domain's own stream, or two for a registration that
//! reads a stream another service owns (its deliveries there, its replays
//! on the domain's stream).

use std::sync::Arc;

use anyhow::{Result, bail};
use async_nats::jetstream;
use sea_orm::DatabaseConnection;
use tokio::sync::Notify;

use service::registry::Registration;
use service::{Executor, Inbox};
use worker::{Consumer, ConsumerConfig, Reads};

use super::Domain;
use super::startup::wait_out_broker;
use crate::config::Settings;

/// The inbox every consumer shares: one executor whose commits wake the
/// relay, so a handler's events are published without waiting for a poll,
/// and one batching policy sized for all the consumers' lanes.
pub(super) fn consumers_inbox(
    settings: &Settings,
    domain: &Domain,
    db: &DatabaseConnection,
    wake: &Arc<Notify>,
) -> Inbox {
    Inbox::new(Executor::new(db.clone()).with_commit_signal(wake.clone()))
        .with_outbox(service::Outbox::new(settings.outbox_mode))
        .with_batching(
            settings.inbox_batch(db.get_database_backend()),
            settings.inbox_lanes(consumer_count(domain)),
        )
}

/// How many consumers the domain runs: one per registration, two for one
/// that reads another service's stream (see [`configs`]); what the pool and
/// the inbox's lanes are sized for.
pub(super) fn consumer_count(domain: &Domain) -> usize {
    let own = &domain.stream.name;
    domain
        .registry
        .registrations()
        .iter()
        .map(|r| match &r.stream {
            Some(stream) if stream != own => 2,
            _ => 1,
        })
        .sum()
}

/// The consumers of every registration, their durable consumers
/// provisioned; a stream another service owns is looked for, never made.
///
/// # Errors
/// A stream another service owns that does not exist, or JetStream
/// refusing a durable consumer (or not answering within start-up's wait).
pub(super) async fn consumers(
    settings: &Settings,
    domain: &Domain,
    inbox: Inbox,
    js: &jetstream::Context,
) -> Result<Vec<Consumer>> {
    let own = settings.consumer(&domain.stream.name);
    let mut consumers = Vec::new();
    for registration in domain.registry.registrations() {
        for config in configs(&own, registration) {
            if config.reads == Reads::Deliveries {
                require_stream(js, &config.stream, registration).await?;
            }
            let consumer = Consumer::new(inbox.clone(), js.clone(), registration.clone(), config);
            wait_out_broker("setting up the consumers", || consumer.ensure()).await?;
            consumers.push(consumer);
        }
    }
    Ok(consumers)
}

/// The durable consumers `registration` needs: one on the domain's stream
/// (`own`), or, when it reads another service's stream, one there for its
/// deliveries and one of the same name on the domain's stream for the
/// dead letters replayed to it (that stream is not seawall's to add a
/// replay subject to).
fn configs(own: &ConsumerConfig, registration: &Registration) -> Vec<ConsumerConfig> {
    match &registration.stream {
        Some(stream) if *stream != own.stream => vec![
            ConsumerConfig {
                stream: stream.clone(),
                reads: Reads::Deliveries,
                durable_name: Some(foreign_durable_name(&own.stream, registration)),
                ..own.clone()
            },
            ConsumerConfig {
                reads: Reads::Replays,
                ..own.clone()
            },
        ],
        _ => vec![own.clone()],
    }
}

/// The durable consumer's name on a stream another service owns: this
/// service's stream and the consumer (`ORDERS-payments`), not the bare
/// consumer name, which could be one of the owner's own durable consumers
/// (creating one that exists would change its filter and its limits).
pub(super) fn foreign_durable_name(own_stream: &str, registration: &Registration) -> String {
    format!("{own_stream}-{}", registration.consumer)
}

/// Stops start-up when `stream`, which `registration` reads and another
/// service owns, does not exist: seawall never creates it (it would with
/// its own settings, not its owner's), and a consumer cannot wait for it
/// without a name to report.
async fn require_stream(
    js: &jetstream::Context,
    stream: &str,
    registration: &Registration,
) -> Result<()> {
    let what = format!("looking up stream {stream}");
    if !wait_out_broker(&what, || worker::stream_exists(js, stream)).await? {
        bail!(
            "stream {stream}, which consumer {} reads (Registry::from_stream), does not exist: seawall never creates a stream another service owns; create it, or correct its name",
            registration.consumer
        );
    }
    Ok(())
}

/// Each consumer's readiness (not paused for an outage), and the WAL
/// relay's (not stepped aside as a synchronous standby), for /readyz.
pub(super) fn readiness_checks(
    consumers: &[Consumer],
    wal_relay: Option<&worker::relay::wal::WalRelay>,
) -> Vec<api::probes::RoleCheck> {
    consumers
        .iter()
        .map(|c| {
            let health = c.health();
            Arc::new(move || health.problem()) as api::probes::RoleCheck
        })
        .chain(wal_relay.map(worker::relay::wal::WalRelay::readiness))
        .collect()
}
