//! The process: [`Application::build`] connects, migrates and provisions
//! everything a set of [`Roles`] needs for a [`Domain`], failing early with a
//! named cause; [`Application::run_until`] runs the loops (outbox relay,
//! consumers, claim sweeper, pruner, admin API) until a token is cancelled or
//! one of them fails, then stops the others cleanly. The binary, the
//! benchmarks (`seawall-bench`) and the tests all start a process this way.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use async_nats::jetstream;
use futures::FutureExt;
use metrics_exporter_prometheus::PrometheusHandle;
use sea_orm::DatabaseConnection;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use service::Registry;
use service::retention::PruneConfig;
use worker::relay::wal::{WalRelay, WalRelayConfig};
use worker::{Consumer, Relay, RelayConfig, StreamSpec, maintenance};

use crate::config::Settings;

mod consumers;
mod drain;
mod migrate;
pub mod process;
mod startup;

pub use drain::drain_wal_slot;
pub use migrate::migrate;
pub use process::{exit_code, init};

use consumers::{consumers, consumers_inbox, readiness_checks};
use startup::wait_out_broker;
pub use startup::{
    DatabaseStepError, connect_db_waiting, report_unknown, until_stopped, wait_out_database,
};

/// Which loops a process runs: `seawall run` has all three, `relay`,
/// `consume` and `api` one each, so each can be scaled on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    /// The outbox relay, with the pruner (a deployment that only produces
    /// must prune its outbox too).
    pub relay: bool,
    /// The consumers, with the claim sweeper and the pruner.
    pub consume: bool,
    /// The admin API, dashboard and metrics.
    pub api: bool,
}

impl Roles {
    /// Everything in one process (`seawall run`).
    pub const ALL: Self = Self {
        relay: true,
        consume: true,
        api: true,
    };
    /// Only the relay (`seawall relay`).
    pub const RELAY: Self = Self {
        relay: true,
        consume: false,
        api: false,
    };
    /// Only the consumers (`seawall consume`).
    pub const CONSUME: Self = Self {
        relay: false,
        consume: true,
        api: false,
    };
    /// Only the admin API (`seawall api`).
    pub const API: Self = Self {
        relay: false,
        consume: false,
        api: true,
    };

    fn workers(self) -> bool {
        self.relay || self.consume
    }
}

/// A service's messaging: the stream its subjects live in and which handler
/// consumes which subject. The platform runs any domain; the binary's is
/// built in `src/domain/` (`docs/fork.md`).
pub struct Domain {
    /// The stream the domain owns: its consumers read it (but those
    /// registered with `Registry::from_stream`), and the relay publishes
    /// into it.
    pub stream: StreamSpec,
    /// The consumers.
    pub registry: Registry,
}

/// Connections the admin API keeps to its read replica: a dashboard refresh
/// runs four requests at once.
const ADMIN_READ_POOL: u32 = 4;
/// How long an admin read waits for a replica connection (see
/// `connect_admin_reads`).
const ADMIN_READ_ACQUIRE: Duration = Duration::from_secs(3);

/// Connections of the WAL relay's own pool: its session runs one statement
/// at a time, beside the check of whether it became a synchronous standby
/// (which must find a connection while a commit of the session waits).
const WAL_RELAY_POOL: u32 = 3;
/// How long the WAL relay waits for a connection (see `connect_wal_relay`).
const WAL_RELAY_ACQUIRE: Duration = Duration::from_secs(3);

/// A process, built and ready to run.
pub struct Application {
    relay: Option<Relay>,
    wal_relay: Option<WalRelay>,
    consumers: Vec<Consumer>,
    maintenance: Option<Maintenance>,
    api: Option<(std::net::SocketAddr, api::AppState)>,
    probes: Option<(tokio::net::TcpListener, api::probes::Probes)>,
}

/// The pruner of a consuming or relaying process, and the claim sweeper of
/// a consuming one.
struct Maintenance {
    db: DatabaseConnection,
    /// The claim sweeper's policy and interval: claims are the consumers'.
    sweep: Option<(service::sweep::SweepPolicy, Duration)>,
    retention: PruneConfig,
    prune_interval: Duration,
}

impl Maintenance {
    /// The pruner (and, for consumers, the claim sweeper) of a process that
    /// relays or consumes; `None` for the API alone, which leaves cleaning
    /// up to the processes that run the loops.
    fn for_roles(
        settings: &Settings,
        roles: Roles,
        db: &DatabaseConnection,
        retention: PruneConfig,
    ) -> Option<Self> {
        // A deployment that only produces (relays, no consumers) must
        // still prune its outbox and rollup, so relays prune too.
        (roles.consume || roles.relay).then(|| Self {
            db: db.clone(),
            sweep: roles.consume.then(|| {
                (
                    settings.sweep(),
                    Duration::from_millis(settings.sweep_interval_ms),
                )
            }),
            // Markers are the consumers' to prune: a relay's settings need
            // not know their redelivery horizon.
            retention: PruneConfig {
                inbox: retention.inbox.filter(|_| roles.consume),
                ..retention
            },
            prune_interval: Duration::from_millis(settings.prune_interval_ms),
        })
    }
}

impl Application {
    /// Checks the settings, applies migrations, connects to NATS and
    /// provisions the stream and the durable consumers.
    ///
    /// # Errors
    /// Any of those failing, with the cause (an unsafe retention, an exposed
    /// API without a token, an unreachable database or broker, a duplicate
    /// window too short for the relay's lease).
    pub async fn build(
        settings: &Settings,
        roles: Roles,
        domain: Domain,
        db: DatabaseConnection,
        metrics: Option<PrometheusHandle>,
    ) -> Result<Self> {
        let retention = settings.retention()?;
        if roles.api {
            api::check_exposure(settings.api_addr, !settings.api_tokens()?.is_empty())?;
        }
        startup::ensure_schema(settings.migrations, &db).await?;
        startup::now_doing("connecting to NATS");
        // The workers cannot start without NATS; the API alone can.
        let nats = crate::nats::connect_with(settings, !roles.workers()).await?;
        let client = nats.client;
        let js = jetstream::new(client.clone());
        if roles.workers() {
            provision_stream(settings, &js, &domain.stream).await?;
        }
        let wal = settings.outbox_mode == service::OutboxMode::Wal;
        prepare_outbox_mode(settings, roles, wal, &db).await?;
        let wal_relay = if roles.relay && wal {
            Some(build_wal_relay(settings, &js, nats.server_errors.clone()).await?)
        } else {
            None
        };
        let wake = Arc::new(Notify::new());
        // In WAL mode the table relay publishes what the WAL relay handed
        // over (refused events and their keys' followers), operators'
        // retries, and rows left from table mode.
        let relay = roles.relay.then(|| {
            let config = RelayConfig {
                server_errors: Some(nats.server_errors),
                ..settings.relay()
            };
            Relay::new(db.clone(), js.clone(), config, wake.clone())
        });
        let consumers = if roles.consume {
            let inbox = consumers_inbox(settings, &domain, &db, &wake);
            consumers(settings, &domain, inbox, &js).await?
        } else {
            Vec::new()
        };
        let maintenance = Maintenance::for_roles(settings, roles, &db, retention);
        let reads = connect_admin_reads_for(settings, roles).await?;
        let checks = readiness_checks(&consumers, wal_relay.as_ref());
        let probes = bind_probes(settings, roles, &db, &client, metrics.as_ref(), &checks).await?;
        let tokens = settings.api_tokens()?;
        let api = roles.api.then(|| {
            let state = api::AppState {
                db,
                reads,
                nats: Some(client),
                jetstream: Some(js),
                relay_wake: Some(wake),
                metrics,
                stats: Default::default(),
                checks,
                config: Arc::new(api_config(settings, &domain, wal, retention, tokens)),
            };
            (settings.api_addr, state)
        });
        Ok(Self {
            relay,
            wal_relay,
            consumers,
            maintenance,
            api,
            probes,
        })
    }

    /// Runs every loop until `stop` is cancelled or one of them fails; then
    /// stops the others and waits for them (in-flight handlers finish and
    /// are acknowledged, a relay round records what it published).
    ///
    /// # Errors
    /// The first loop that failed, or panicked.
    pub async fn run_until(self, stop: CancellationToken) -> Result<()> {
        if stop.is_cancelled() {
            return Ok(());
        }
        let cancel = stop.child_token();
        let mut tasks: JoinSet<Result<()>> = JoinSet::new();
        if let Some(relay) = self.relay {
            let cancel = cancel.clone();
            tasks.spawn(async move {
                relay.run(cancel).await;
                Ok(())
            });
        }
        if let Some(wal_relay) = self.wal_relay {
            let cancel = cancel.clone();
            tasks.spawn(async move {
                wal_relay.run(cancel).await;
                Ok(())
            });
        }
        for consumer in self.consumers {
            let cancel = cancel.clone();
            tasks.spawn(async move { Ok(consumer.run(cancel).await?) });
        }
        if let Some(m) = self.maintenance {
            if let Some((policy, interval)) = m.sweep {
                let sweeper =
                    maintenance::run_sweeper(m.db.clone(), policy, interval, cancel.clone());
                tasks.spawn(sweeper.map(Ok));
            }
            let pruner =
                maintenance::run_pruner(m.db, m.retention, m.prune_interval, cancel.clone());
            tasks.spawn(pruner.map(Ok));
        }
        if let Some((addr, state)) = self.api {
            let cancel = cancel.clone();
            tasks.spawn(async move { Ok(api::serve(addr, state, cancel).await?) });
        }
        if let Some((listener, probes)) = self.probes {
            let cancel = cancel.clone();
            tasks.spawn(async move { Ok(api::probes::serve(listener, probes, cancel).await?) });
        }
        // A loop that ends first (failed, or done) stops the others; so does
        // the token. The first failure, whenever it comes, is the result.
        let mut failure = None;
        tokio::select! {
            biased;
            Some(res) = tasks.join_next() => {
                failure = res.context("worker task panicked").and_then(|r| r).err();
            }
            () = cancel.cancelled() => tracing::info!("shutdown requested"),
        }
        cancel.cancel();
        while let Some(res) = tasks.join_next().await {
            if let Err(err) = res.context("worker task panicked").and_then(|r| r) {
                tracing::error!(error = %format!("{err:#}"), "worker task failed");
                failure.get_or_insert(err);
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

/// Creates or updates the stream before the relay publishes into it or a
/// consumer reads from it, waiting out a broker that cannot answer yet; and
/// refuses a duplicate window shorter than a relay may take to republish a
/// row (its lease, its retry backoff), which would store that event twice.
async fn provision_stream(
    settings: &Settings,
    js: &jetstream::Context,
    stream: &StreamSpec,
) -> Result<()> {
    let relay = settings.relay();
    wait_out_broker("setting up the stream", || async {
        worker::ensure_stream(js, stream).await?;
        worker::check_duplicate_window(js, &stream.name, relay.lease, relay.retry_max).await
    })
    .await?;
    Ok(())
}

/// Makes sure the database is in the outbox mode the settings say before
/// this process writes an event: in the other mode its events would be
/// lost or reordered.
async fn prepare_outbox_mode(
    settings: &Settings,
    roles: Roles,
    wal: bool,
    db: &DatabaseConnection,
) -> Result<()> {
    // Events written before the slot exists would never reach it, so
    // every process that may write events makes sure it does first.
    // A process restarted while the database restarts meets the outage
    // here as at every other start-up step: it waits, not exits.
    if wal {
        wait_out_database("looking up the WAL slot's name", || {
            settings.settle_wal_slot(db)
        })
        .await?;
    }
    if wal && roles.workers() {
        let slot = settings.wal_slot();
        wait_out_database("preparing the WAL slot", || {
            worker::relay::wal::prepare(db, &slot)
        })
        .await?;
    }
    // Consumers write their handlers' events; in table mode, on a
    // database in WAL mode, they would reorder a key's events.
    if !wal && roles.consume && db.get_database_backend() == sea_orm::DbBackend::Postgres {
        wait_out_database("checking the outbox mode", || {
            service::wal::mode::check_table_mode(db)
        })
        .await?;
    }
    Ok(())
}

/// The WAL relay, on a pool of its own (see `connect_wal_relay`) and told
/// the broker's asynchronous errors, so a refused publish names its cause.
async fn build_wal_relay(
    settings: &Settings,
    js: &jetstream::Context,
    server_errors: worker::ServerErrors,
) -> Result<WalRelay> {
    let config = WalRelayConfig {
        server_errors: Some(server_errors),
        ..settings.wal_relay()
    };
    let wal_db = connect_wal_relay(&settings.database_url).await?;
    Ok(WalRelay::new(wal_db, js.clone(), config))
}

/// A process without the admin API serves its probes and metrics on
/// a listener of its own, bound here so a taken port stops start-up.
async fn bind_probes(
    settings: &Settings,
    roles: Roles,
    db: &DatabaseConnection,
    client: &async_nats::Client,
    metrics: Option<&PrometheusHandle>,
    checks: &[api::probes::RoleCheck],
) -> Result<Option<(tokio::net::TcpListener, api::probes::Probes)>> {
    match settings.metrics_addr() {
        Some(addr) if !roles.api => {
            let listener = api::probes::bind(addr)
                .await
                .context("serving probes and metrics (metrics_addr)")?;
            let probes = api::probes::Probes {
                db: db.clone(),
                nats: Some(client.clone()),
                metrics: metrics.cloned(),
                checks: checks.to_vec(),
            };
            Ok(Some((listener, probes)))
        }
        _ => Ok(None),
    }
}

/// The admin API's own settings, with what it can only learn from this
/// process: the domain's stream and replay subjects, and the WAL slot
/// whose backlog it reports.
fn api_config(
    settings: &Settings,
    domain: &Domain,
    wal: bool,
    retention: PruneConfig,
    tokens: Vec<api::auth::Token>,
) -> api::ApiConfig {
    api::ApiConfig {
        tokens,
        prune: Some(retention),
        replay_subjects: replay_subjects(domain),
        wal_slot: wal.then(|| settings.wal_slot()),
        stream: Some(domain.stream.name.clone()),
        stats_max_age: Duration::from_millis(settings.stats_max_age_ms),
        ..api::ApiConfig::default()
    }
}

/// Where the API replays each consumer's dead letters.
fn replay_subjects(domain: &Domain) -> HashMap<String, String> {
    domain
        .registry
        .registrations()
        .iter()
        .map(|r| {
            let consumer = r.consumer.to_string();
            let subject = service::dead_letter::replay_subject(&domain.stream.name, &consumer);
            (consumer, subject)
        })
        .collect()
}

/// Runs `roles` of `domain` as this process until `stop` (SIGINT/SIGTERM,
/// see [`process::main`]), with a database pool sized for them and the
/// Prometheus recorder installed. A `stop` during start-up ends it at once
/// (see [`until_stopped`]).
///
/// # Errors
/// Start-up failing (see [`Application::build`]) or a loop failing.
pub async fn serve(
    settings: &Settings,
    roles: Roles,
    domain: Domain,
    stop: CancellationToken,
) -> Result<()> {
    let pool = settings.pool_size(&roles, consumers::consumer_count(&domain))?;
    let metrics = api::metrics::install().context("installing the metrics recorder")?;
    let start = async {
        let db = connect_db_waiting(&settings.database_url, pool, settings.sqlite()).await?;
        Application::build(settings, roles, domain, db, Some(metrics)).await
    };
    let Some(app) = until_stopped(&stop, start).await? else {
        return Ok(());
    };
    let api = if roles.api {
        format!("http://{}/", settings.api_addr)
    } else {
        "off".into()
    };
    if crate::telemetry::json_logs() {
        tracing::info!(service = crate::SERVICE, relay = roles.relay, consume = roles.consume, %api, "seawall is running");
    } else {
        // "seawall is running" whatever the service is called: scripts and
        // tests wait for these words.
        eprintln!(
            "seawall is running (service: {}, relay: {}, consume: {}, admin API: {api}); Ctrl-C to stop",
            crate::SERVICE,
            roles.relay,
            roles.consume
        );
    }
    app.run_until(stop).await
}

/// Opens the database at `url` with a pool of `max` connections, naming the
/// URL (password hidden) when it fails.
///
/// # Errors
/// The database is unreachable or the URL invalid.
pub async fn connect_db(url: &str, max: u32) -> Result<DatabaseConnection> {
    service::db::connect(url, max)
        .await
        .with_context(|| connecting_to(url))
}

/// What a failed connection to `url` is reported as (password hidden).
fn connecting_to(url: &str) -> String {
    format!(
        "connecting to the database at {}",
        crate::config::redact(url)
    )
}

/// Opens the WAL relay's pool, which gives up on a server that refuses
/// connections within [`WAL_RELAY_ACQUIRE`] instead of the main pool's
/// 30 s: the relay's session then ends and lets its replication slot go. A
/// PostgreSQL shutting down (a restart, a switchover's demotion) waits for
/// the slot's client to confirm all it was sent, which a relay that cannot
/// record its windows never does; waiting out the restart for a connection
/// would hold the shutdown, and the switchover, that long.
///
/// # Errors
/// The URL is invalid.
async fn connect_wal_relay(url: &str) -> Result<DatabaseConnection> {
    let mut opts = service::db::options(url, WAL_RELAY_POOL, service::db::SqliteOptions::default());
    opts.acquire_timeout(WAL_RELAY_ACQUIRE).connect_lazy(true);
    sea_orm::Database::connect(opts)
        .await
        .with_context(|| connecting_to(url))
}

/// The admin API's read replica, when this process serves the API and
/// one is set: opened at start-up so that a replica setting that can
/// never work stops it (see `connect_admin_reads`).
async fn connect_admin_reads_for(
    settings: &Settings,
    roles: Roles,
) -> Result<Option<DatabaseConnection>> {
    match &settings.admin_database_url {
        Some(url) if roles.api => {
            let reads = connect_admin_reads(url)
                .await
                .context("connecting to the admin read replica (admin_database_url)")?;
            Ok(Some(reads))
        }
        _ => Ok(None),
    }
}

/// Opens the admin API's read replica pool. Lazily: a replica that is down
/// when the process starts must not stop its relay and consumers; its pages
/// answer 503 until it is back. A read waits at most [`ADMIN_READ_ACQUIRE`]
/// for a connection, well inside the request timeout, so a replica that is
/// down is told as a JSON 503 `database_unavailable`, not a timed-out request.
///
/// One connection is tried at once all the same: an answer that is not an
/// outage (an unknown database, a refused password) would fail every read
/// for as long as the process runs, so it stops start-up instead, as any
/// other bad setting does.
///
/// # Errors
/// The URL is invalid, or the replica answers that it can never serve it.
async fn connect_admin_reads(url: &str) -> Result<DatabaseConnection> {
    let mut opts =
        service::db::options(url, ADMIN_READ_POOL, service::db::SqliteOptions::default());
    opts.acquire_timeout(ADMIN_READ_ACQUIRE).connect_lazy(true);
    let db = sea_orm::Database::connect(opts)
        .await
        .with_context(|| connecting_to(url))?;
    match db.ping().await {
        Ok(()) => Ok(db),
        Err(err) if service::classify::is_outage(&err) => {
            tracing::warn!(
                error = %err,
                "the admin read replica is unreachable; admin reads answer 503 until it is back"
            );
            Ok(db)
        }
        Err(err) => Err(err).with_context(|| connecting_to(url)),
    }
}
