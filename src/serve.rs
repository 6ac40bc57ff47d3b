//! Wiring for the long-running commands (`run`, `relay`, `consume`): connect,
//! provision, start the loops, and stop them cleanly on SIGINT/SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use async_nats::jetstream;
use sea_orm::DatabaseConnection;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use futures::FutureExt;
use metrics_exporter_prometheus::PrometheusHandle;
use service::claim::ClaimPolicy;
use service::credits::{
    APPLIED_SUBJECT, CREDIT_CONSUMER, CREDITS_STREAM, CreditHandler, REQUESTED_SUBJECT,
};
use service::sweep::SweepPolicy;
use service::{ConsumerName, Executor, Inbox, Registry};
use worker::{Consumer, ConsumerConfig, Relay, RelayConfig, StreamSpec, maintenance};

use crate::config::Settings;
use crate::webhook::Webhook;

/// Which loops a process runs.
#[derive(Debug, Clone, Copy)]
pub struct Roles {
    pub relay: bool,
    pub consume: bool,
    pub api: bool,
}

/// The demo service's consumers. A team's fork registers its own here.
pub fn registry(settings: &Settings) -> Result<Registry> {
    let mut registry = Registry::new().register(
        ConsumerName::parse(CREDIT_CONSUMER)?,
        REQUESTED_SUBJECT,
        CreditHandler {
            work: Duration::from_millis(settings.demo_work_ms),
        },
    );
    if let Some(url) = &settings.notify_webhook_url {
        registry = registry.register_effect(
            ConsumerName::parse(NOTIFY_CONSUMER)?,
            APPLIED_SUBJECT,
            Webhook::new(url.clone(), settings.webhook_ca_file.as_deref())?,
            claim_policy(settings),
        );
    }
    Ok(registry)
}

/// The demo `notify` consumer's name.
pub const NOTIFY_CONSUMER: &str = "notify";

fn claim_policy(settings: &Settings) -> ClaimPolicy {
    ClaimPolicy {
        lease: Duration::from_millis(settings.claim_lease_ms),
        max_attempts: i32::try_from(settings.claim_max_attempts).unwrap_or(i32::MAX),
        ..ClaimPolicy::default()
    }
}

/// The streams this worker provisions.
pub fn streams(settings: &Settings) -> Vec<StreamSpec> {
    vec![StreamSpec {
        name: CREDITS_STREAM.into(),
        subjects: vec!["credits.>".into()],
        duplicate_window: Duration::from_millis(settings.duplicate_window_ms),
        max_age: Duration::from_millis(settings.stream_max_age_ms),
        replicas: settings.stream_replicas,
    }]
}

/// The servers of a NATS URL setting: one URL, or several separated by
/// commas (the seeds of a cluster, so a process can start while one node is
/// down).
pub fn nats_servers(url: &str) -> Result<Vec<async_nats::ServerAddr>> {
    url.split(',')
        .map(|u| {
            u.trim()
                .parse::<async_nats::ServerAddr>()
                .with_context(|| format!("invalid NATS URL {u:?}"))
        })
        .collect()
}

/// Connects to NATS, naming the URL when it is unreachable.
pub async fn connect_nats(url: &str) -> Result<async_nats::Client> {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(nats_servers(url)?)
        .await
        .with_context(|| format!("connecting to NATS at {url}"))
}

/// Runs the given roles until SIGINT/SIGTERM.
pub async fn serve(
    settings: &Settings,
    db: DatabaseConnection,
    roles: Roles,
    metrics: Option<PrometheusHandle>,
) -> Result<()> {
    let retention = settings.retention()?;
    if roles.api {
        api::check_exposure(settings.api_addr, settings.admin_token.as_deref())?;
    }
    migration::apply(&db).await.context("applying migrations")?;
    let workers = roles.relay || roles.consume;
    // The workers cannot start without NATS; the API alone can, and reports
    // NATS as not ready until it connects.
    let client = if workers {
        connect_nats(&settings.nats_url).await?
    } else {
        async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(nats_servers(&settings.nats_url)?)
            .await
            .with_context(|| format!("connecting to NATS at {}", settings.nats_url))?
    };
    let js = jetstream::new(client.clone());
    let lease = Duration::from_millis(settings.relay_lease_ms);
    let retry_max = Duration::from_millis(settings.relay_retry_max_ms);
    if workers {
        for spec in streams(settings) {
            worker::ensure_stream(&js, &spec).await?;
            worker::check_duplicate_window(&js, &spec.name, lease, retry_max).await?;
        }
    }
    let wake = Arc::new(Notify::new());
    let inbox = Inbox::new(Executor::new(db.clone()).with_commit_signal(wake.clone()));
    let cancel = CancellationToken::new();
    let mut tasks: JoinSet<Result<()>> = JoinSet::new();
    if roles.relay {
        let relay = Relay::new(
            db.clone(),
            js.clone(),
            RelayConfig {
                lease,
                batch_size: settings.relay_batch_size,
                concurrency: settings.relay_concurrency,
                poll_interval: Duration::from_millis(settings.relay_poll_ms),
                max_attempts: i32::try_from(settings.relay_max_attempts).unwrap_or(i32::MAX),
                retry_max,
                fault: settings.fault_point(),
                ..RelayConfig::default()
            },
            wake.clone(),
        );
        let cancel = cancel.clone();
        tasks.spawn(async move {
            relay.run(cancel).await;
            Ok(())
        });
    }
    if roles.consume {
        let config = ConsumerConfig {
            stream: CREDITS_STREAM.into(),
            ack_wait: Duration::from_millis(settings.ack_wait_ms),
            max_deliver: settings.max_deliver,
            concurrency: settings.consumer_concurrency,
            max_handling: Duration::from_millis(settings.max_handling_ms),
            fault: settings.fault_point(),
            ..ConsumerConfig::default()
        };
        let sweep = SweepPolicy {
            default_max_attempts: claim_policy(settings).max_attempts,
            ..SweepPolicy::default()
        };
        tasks.spawn(
            maintenance::run_sweeper(
                db.clone(),
                sweep,
                Duration::from_millis(settings.sweep_interval_ms),
                cancel.clone(),
            )
            .map(Ok),
        );
        tasks.spawn(
            maintenance::run_pruner(
                db.clone(),
                retention,
                Duration::from_millis(settings.prune_interval_ms),
                cancel.clone(),
            )
            .map(Ok),
        );
        for registration in registry(settings)?.registrations() {
            let consumer = Consumer::new(
                inbox.clone(),
                js.clone(),
                registration.clone(),
                config.clone(),
            );
            consumer.ensure().await?;
            let cancel = cancel.clone();
            tasks.spawn(async move { Ok(consumer.run(cancel).await?) });
        }
    }
    if roles.api {
        let state = api::AppState {
            db: db.clone(),
            nats: Some(client.clone()),
            jetstream: Some(js.clone()),
            relay_wake: Some(wake.clone()),
            metrics,
            config: Arc::new(api::ApiConfig {
                token: settings.admin_token.clone(),
                prune: Some(retention),
                replay_subjects: registry(settings)?
                    .registrations()
                    .iter()
                    .map(|r| {
                        let consumer = r.consumer.to_string();
                        let subject =
                            service::dead_letter::replay_subject(CREDITS_STREAM, &consumer);
                        (consumer, subject)
                    })
                    .collect(),
                ..api::ApiConfig::default()
            }),
        };
        let (addr, cancel) = (settings.api_addr, cancel.clone());
        tasks.spawn(async move { Ok(api::serve(addr, state, cancel).await?) });
    }
    eprintln!(
        "seawall is running (relay: {}, consume: {}, admin API: {}); Ctrl-C to stop",
        roles.relay,
        roles.consume,
        if roles.api {
            format!("http://{}/", settings.api_addr)
        } else {
            "off".into()
        }
    );
    let mut failure = None;
    tokio::select! {
        () = shutdown_signal() => tracing::info!("shutdown requested"),
        Some(res) = tasks.join_next() => {
            failure = Some(res.context("worker task panicked").and_then(|r| r));
        }
    }
    cancel.cancel();
    while let Some(res) = tasks.join_next().await {
        if let Err(err) = res.context("worker task panicked").and_then(|r| r) {
            tracing::error!(error = %format!("{err:#}"), "worker task failed");
        }
    }
    match failure {
        Some(Err(err)) => Err(err),
        _ => Ok(()),
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
