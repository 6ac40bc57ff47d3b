//! Configuration: defaults, then a TOML file (`--config`), then `SEAWALL_*`
//! environment variables. A bad or missing value stops start-up with a message
//! naming the key, rather than surfacing later as a confusing runtime error.
//!
//! Here: the platform's [`Settings`], their defaults, checks and the typed
//! views each part takes. [`load`] (in `load.rs`) reads them, with a
//! domain's own [`DomainSettings`], and refuses unknown variables.

mod checks;
mod load;
mod redact;
mod service_links;
mod wal;

pub use load::{DomainSettings, Loaded, NoSettings, load};
pub use redact::{redact, redact_servers};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use service::claim::ClaimPolicy;
use service::retention::{BrokerSettings, PruneConfig, check_inbox_retention};
use service::sweep::SweepPolicy;

use serde::{Deserialize, Serialize};

/// Every setting, with the names used in the TOML file. The environment
/// variable is the name upper-cased with a `SEAWALL_` prefix. Each part of
/// the process takes its own typed view ([`Settings::relay`],
/// [`Settings::consumer`], ...) rather than reading fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub database_url: String,
    pub db_max_connections: Option<u32>,
    pub nats_url: String,
    pub nats_creds_file: Option<PathBuf>,
    pub nats_nkey_seed: Option<String>,
    pub nats_user: Option<String>,
    pub nats_password: Option<String>,
    pub nats_token: Option<String>,
    pub nats_ca_file: Option<PathBuf>,
    pub nats_cert_file: Option<PathBuf>,
    pub nats_key_file: Option<PathBuf>,
    pub nats_tls_first: bool,
    pub api_addr: SocketAddr,
    /// Where a `relay` or `consume` process (which has no admin API)
    /// serves `/metrics`, `/healthz` and `/readyz`: an address, or `off`.
    pub metrics_addr: String,
    pub admin_token: Option<String>,
    /// More tokens, each named for the audit trail and read-only or not:
    /// `name:read:secret,name:write:secret` (see [`Settings::api_tokens`]).
    pub admin_tokens: Option<String>,
    /// A read replica of `database_url` for the admin API's lists, details
    /// and stats; its writes still go to `database_url`.
    pub admin_database_url: Option<String>,
    /// How long one reading of the table statistics (behind `/metrics`
    /// and `GET /api/v1/stats`) is shared by every caller before the next
    /// caller refreshes it: scrapes from several Prometheus servers and
    /// dashboards cost one set of queries, not one each.
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub stats_max_age_ms: u64,
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub ack_wait_ms: u64,
    pub max_deliver: i64,
    /// The nak delay after a message's first failed delivery; it doubles
    /// per delivery up to `nak_max_ms`.
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub nak_base_ms: u64,
    /// The longest nak delay: the doubling stops here.
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub nak_max_ms: u64,
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub max_handling_ms: u64,
    /// How long a resource failure (a lock or statement timeout, a full
    /// disk, a read-only database) may recur for one delivery before it
    /// counts against the message.
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub infra_patience_ms: u64,
    /// `full` (every commit synced) or `normal` (synced at checkpoints; a
    /// power cut may lose acked messages).
    pub sqlite_synchronous: service::db::SqliteSync,
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub duplicate_window_ms: u64,
    pub webhook_ca_file: Option<std::path::PathBuf>,
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub relay_lease_ms: u64,
    pub relay_batch_size: u64,
    pub relay_concurrency: usize,
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub relay_poll_ms: u64,
    pub relay_max_attempts: u64,
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub relay_retry_max_ms: u64,
    pub consumer_concurrency: usize,
    pub inbox_batch: Option<usize>,
    pub stream_replicas: usize,
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub stream_max_age_ms: u64,
    #[serde(default, deserialize_with = "service::millis::option")]
    pub inbox_retention_ms: Option<u64>,
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub retention_margin_ms: u64,
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub outbox_retention_ms: u64,
    pub allow_short_retention: bool,
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub prune_interval_ms: u64,
    pub prune_batch_size: u64,
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub sweep_interval_ms: u64,
    #[serde(deserialize_with = "service::millis::deserialize")]
    pub claim_lease_ms: u64,
    pub claim_max_attempts: u64,
    /// Where events are recorded: `table` rows, or the PostgreSQL `wal`.
    pub outbox_mode: service::OutboxMode,
    /// Whether a long-running process applies pending migrations at
    /// start-up or waits for a migration job to apply them.
    pub migrations: Migrations,
    /// The WAL relay's replication slot (and publication); derived from the
    /// database name when unset.
    pub wal_slot: Option<String>,
    /// The slot [`Settings::settle_wal_slot`] found, not a setting.
    #[serde(skip)]
    pub settled_wal_slot: std::sync::OnceLock<String>,
    /// Events per WAL relay window (and per piece of a larger transaction).
    pub wal_window: u64,
    /// How long NATS may be unreachable before the WAL relay hands its
    /// windows to the outbox table, so the slot stops retaining WAL.
    pub wal_handoff_ms: u64,
    /// Crash tests only: a fault point to abort at (see `worker::FaultPoint`).
    /// Not a setting (no key or variable sets it): only the test kit's
    /// `seawall-testbed` arms it, from `TESTBED_FAULT`, with
    /// [`Settings::arm_fault`].
    #[serde(skip)]
    pub fault: Option<String>,
    /// The `[domain]` table of the file as written; the domain's typed
    /// settings are read from it (see [`DomainSettings`]). Never serialized,
    /// so it is not a platform key.
    #[serde(default, skip_serializing)]
    pub domain: figment::value::Dict,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            database_url: "sqlite://seawall.db?mode=rwc".into(),
            db_max_connections: None,
            nats_url: "nats://127.0.0.1:4222".into(),
            nats_creds_file: None,
            nats_nkey_seed: None,
            nats_user: None,
            nats_password: None,
            nats_token: None,
            nats_ca_file: None,
            nats_cert_file: None,
            nats_key_file: None,
            nats_tls_first: false,
            api_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            metrics_addr: DEFAULT_METRICS_ADDR.to_owned(),
            admin_token: None,
            admin_tokens: None,
            admin_database_url: None,
            stats_max_age_ms: 5_000,
            ack_wait_ms: 30_000,
            max_deliver: 5,
            nak_base_ms: 10_000,
            nak_max_ms: 300_000,
            max_handling_ms: 300_000,
            infra_patience_ms: 15 * 60_000,
            sqlite_synchronous: service::db::SqliteSync::Full,
            duplicate_window_ms: 120_000,
            webhook_ca_file: None,
            relay_lease_ms: 30_000,
            relay_batch_size: 500,
            relay_concurrency: 2,
            relay_poll_ms: 1_000,
            relay_max_attempts: 10,
            relay_retry_max_ms: 60_000,
            consumer_concurrency: 16,
            inbox_batch: None,
            stream_replicas: 1,
            stream_max_age_ms: 7 * DAY_MS,
            inbox_retention_ms: None,
            retention_margin_ms: DAY_MS,
            outbox_retention_ms: 7 * DAY_MS,
            allow_short_retention: false,
            prune_interval_ms: 60_000,
            prune_batch_size: 1_000,
            sweep_interval_ms: 5_000,
            claim_lease_ms: 300_000,
            claim_max_attempts: 5,
            outbox_mode: service::OutboxMode::Table,
            migrations: Migrations::Apply,
            wal_slot: None,
            settled_wal_slot: std::sync::OnceLock::new(),
            // A window's last PubAck is waited for once per window: small
            // windows leave the relay idle between them (0.44x the plain
            // publisher at 500 events, 0.58x at 5,000).
            wal_window: 5_000,
            wal_handoff_ms: 300_000,
            fault: None,
            domain: figment::value::Dict::new(),
        }
    }
}

const DAY_MS: u64 = 24 * 3600 * 1000;

/// Who applies the migrations a long-running process (`run`, `relay`,
/// `consume`, `api`) needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Migrations {
    /// The process applies them at start-up, one process at a time under
    /// the database's lock: what one `seawall run`, or a deployment
    /// without a migration step, wants.
    Apply,
    /// The process waits until they are applied by `seawall migrate` (a
    /// Kubernetes Job or init container before the rollout), and never
    /// changes the schema itself: replicas do not race to migrate, and a
    /// long migration is not killed by a pod's probes half-way.
    Wait,
}

/// Deliveries committed together by default (`INBOX_BATCH`) on PostgreSQL.
/// End to end on a durable server (`seawall-bench e2e`) batches of 16 ran
/// fastest: 3,042 msg/s against 2,625 with 8, 2,609 with 4 and 2,337 one
/// commit per message; where a commit's flush takes 3.3 ms (the slow-flush
/// rows), 2,417 against 2,179, 895 and 384: the dearer the flush, the more
/// a large batch saves.
const DEFAULT_PG_INBOX_BATCH: usize = 16;

/// The same on MySQL, where large batches lose to small ones at 16 handler
/// slots (`seawall-bench inbox` on MariaDB flushing its log at every commit:
/// 3,601 msg/s in batches of 4, 3,312 of 8, 2,243 of 16, 3,329 unbatched).
const DEFAULT_MYSQL_INBOX_BATCH: usize = 4;

/// The same on SQLite, which has one writer: one lane of large batches
/// (`seawall-bench inbox`, synchronous = FULL: 2,429 msg/s in batches of
/// 16 against 1,807 of 8, 1,443 of 4 and 1,354 unbatched).
const DEFAULT_SQLITE_INBOX_BATCH: usize = 16;

/// Pool of `migrate` and `load` when `db_max_connections` is unset.
const DEFAULT_TOOL_POOL: u32 = 16;

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {0} does not exist")]
    MissingFile(String),
    #[error("configuration key `{key}` (env SEAWALL_{env}): {problem}")]
    Parse {
        key: String,
        env: String,
        problem: String,
    },
    #[error("configuration key `{key}` (env SEAWALL_{env}): {problem}")]
    Invalid {
        key: &'static str,
        env: String,
        problem: String,
    },
    #[error(
        "environment variable {0} is not a setting (a misspelt key?); the settings are listed in docs/configuration.md"
    )]
    UnknownVariable(String),
    #[error("the domain's setting `{0}` has the name of a platform setting; rename it")]
    DomainKeyClash(String),
}

/// A configuration error about `key`.
pub(crate) fn invalid(key: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        env: key.to_uppercase(),
        problem: problem.into(),
    }
}

/// The probes' default address: OpenTelemetry's Prometheus exporter port, on
/// loopback. Two processes on one host need their own (`SEAWALL_METRICS_ADDR`).
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";

impl Settings {
    /// The admin API's tokens: `admin_token` (named `admin`, full access)
    /// and each entry of `admin_tokens`, `name:access:secret` with access
    /// `read` (GET only) or `write`, separated by commas.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `admin_tokens` for an entry that is
    /// not of that shape, a name or secret used twice, or an empty secret.
    pub fn api_tokens(&self) -> Result<Vec<api::auth::Token>, ConfigError> {
        let mut tokens: Vec<api::auth::Token> = Vec::new();
        if let Some(secret) = &self.admin_token {
            tokens.push(api::auth::Token::admin(secret.clone()));
        }
        let entries = self.admin_tokens.as_deref().unwrap_or("");
        for (i, entry) in entries
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .enumerate()
        {
            let mut parts = entry.splitn(3, ':');
            let (Some(name), Some(access), Some(secret)) =
                (parts.next(), parts.next(), parts.next())
            else {
                return Err(invalid(
                    "admin_tokens",
                    format!("entry {} is not `name:read|write:secret`", i + 1),
                ));
            };
            let access = match access {
                "read" => api::auth::Access::Read,
                "write" => api::auth::Access::Write,
                other => {
                    return Err(invalid(
                        "admin_tokens",
                        format!(
                            "entry {:?}: access {other:?} is neither `read` nor `write`",
                            name
                        ),
                    ));
                }
            };
            // HTTP drops the spaces around a header's value: a secret kept
            // with them would never match.
            let (name, secret) = (name.trim(), secret.trim());
            if secret.eq_ignore_ascii_case(checks::PLACEHOLDER) {
                return Err(invalid(
                    "admin_tokens",
                    format!("{name:?} still has the placeholder secret CHANGE-ME"),
                ));
            }
            if name.is_empty() || secret.is_empty() {
                return Err(invalid(
                    "admin_tokens",
                    format!("entry {} needs a name and a secret", i + 1),
                ));
            }
            if tokens.iter().any(|t| t.name == name) {
                return Err(invalid(
                    "admin_tokens",
                    format!("the name {name:?} is used twice"),
                ));
            }
            if tokens.iter().any(|t| t.secret == secret) {
                return Err(invalid(
                    "admin_tokens",
                    format!("{name:?} has the secret of another token"),
                ));
            }
            tokens.push(api::auth::Token {
                name: name.to_owned(),
                access,
                secret: secret.to_owned(),
            });
        }
        Ok(tokens)
    }

    /// Where a process without the admin API serves its probes and metrics;
    /// `None` when `metrics_addr = "off"`.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr.parse().ok()
    }

    /// The broker settings that bound redelivery.
    pub fn broker(&self) -> BrokerSettings {
        BrokerSettings {
            ack_wait: Duration::from_millis(self.ack_wait_ms),
            max_deliver: u32::try_from(self.max_deliver).unwrap_or(u32::MAX),
            stream_max_age: Duration::from_millis(self.stream_max_age_ms),
        }
    }

    /// What the pruner keeps: the configured inbox retention (checked against
    /// the broker's redelivery horizon) or the derived one.
    pub fn retention(&self) -> Result<PruneConfig, ConfigError> {
        let broker = self.broker();
        let inbox = match self.inbox_retention_ms {
            Some(ms) => Duration::from_millis(ms),
            None if broker.stream_max_age.is_zero() => {
                return Err(invalid(
                    "inbox_retention_ms",
                    "stream_max_age_ms = 0 keeps messages in the stream forever, so no marker age is safe to prune at; give the stream a max age, or set inbox_retention_ms with allow_short_retention = true to prune anyway",
                ));
            }
            None => broker.inbox_retention(Duration::from_millis(self.retention_margin_ms)),
        };
        check_inbox_retention(inbox, &broker, self.allow_short_retention)
            .map_err(|e| invalid("inbox_retention_ms", e.to_string()))?;
        Ok(PruneConfig {
            inbox: Some(inbox),
            outbox: Duration::from_millis(self.outbox_retention_ms),
            batch_size: self.prune_batch_size,
        })
    }

    /// Deliveries per inbox batch: `INBOX_BATCH`, or the default measured
    /// for `backend`.
    pub fn inbox_batch(&self, backend: sea_orm::DbBackend) -> usize {
        self.inbox_batch.unwrap_or(match backend {
            sea_orm::DbBackend::Sqlite => DEFAULT_SQLITE_INBOX_BATCH,
            sea_orm::DbBackend::MySql => DEFAULT_MYSQL_INBOX_BATCH,
            _ => DEFAULT_PG_INBOX_BATCH,
        })
    }

    /// Inbox batches that may be open at once: one per handler slot of the
    /// process's `consumers`, so a delivery never waits behind slow
    /// handlers for want of a lane (see `service::group`).
    pub fn inbox_lanes(&self, consumers: usize) -> usize {
        self.consumer_concurrency.saturating_mul(consumers.max(1))
    }

    /// The relay's settings.
    pub fn relay(&self) -> worker::RelayConfig {
        worker::RelayConfig {
            lease: Duration::from_millis(self.relay_lease_ms),
            batch_size: self.relay_batch_size,
            concurrency: self.relay_concurrency,
            poll_interval: Duration::from_millis(self.relay_poll_ms),
            max_attempts: i32::try_from(self.relay_max_attempts).unwrap_or(i32::MAX),
            retry_max: Duration::from_millis(self.relay_retry_max_ms),
            fault: self.fault_point(),
            ..worker::RelayConfig::default()
        }
    }

    /// How SQLite connections are opened.
    pub fn sqlite(&self) -> service::db::SqliteOptions {
        service::db::SqliteOptions {
            synchronous: self.sqlite_synchronous,
            ..service::db::SqliteOptions::default()
        }
    }

    /// The settings of a consumer reading `stream`.
    pub fn consumer(&self, stream: &str) -> worker::ConsumerConfig {
        worker::ConsumerConfig {
            ack_wait: Duration::from_millis(self.ack_wait_ms),
            max_deliver: self.max_deliver,
            nak_base: Duration::from_millis(self.nak_base_ms),
            nak_max: Duration::from_millis(self.nak_max_ms),
            concurrency: self.consumer_concurrency,
            max_handling: Duration::from_millis(self.max_handling_ms),
            infra_patience: Duration::from_millis(self.infra_patience_ms),
            fault: self.fault_point(),
            ..worker::ConsumerConfig::new(stream)
        }
    }

    /// How effects outside the transaction are claimed.
    pub fn claim_policy(&self) -> ClaimPolicy {
        ClaimPolicy {
            lease: Duration::from_millis(self.claim_lease_ms),
            max_attempts: i32::try_from(self.claim_max_attempts).unwrap_or(i32::MAX),
            ..ClaimPolicy::default()
        }
    }

    /// When the sweeper quarantines an abandoned claim: after the same
    /// number of attempts a consumer would allow.
    pub fn sweep(&self) -> SweepPolicy {
        SweepPolicy {
            default_max_attempts: self.claim_policy().max_attempts,
            ..SweepPolicy::default()
        }
    }

    /// The stream `name` capturing `subjects`, with the configured window,
    /// age and replicas.
    pub fn stream(&self, name: &str, subjects: &[&str]) -> worker::StreamSpec {
        worker::StreamSpec {
            name: name.to_owned(),
            subjects: subjects.iter().map(|s| (*s).to_owned()).collect(),
            duplicate_window: Duration::from_millis(self.duplicate_window_ms),
            max_age: Duration::from_millis(self.stream_max_age_ms),
            replicas: self.stream_replicas,
        }
    }

    /// The database pool for a process running `roles`: every handler in
    /// flight holds a connection for its transaction, every relay round in
    /// flight one for its batch, and the `LISTEN`, sweeper, pruner and API
    /// one each. A smaller pool makes them queue on each other until the
    /// acquire timeout, which looks like an outage; so an explicit
    /// `db_max_connections` below that is refused, and without one the pool
    /// is sized from the settings.
    pub fn pool_size(
        &self,
        roles: &crate::app::Roles,
        consumers: usize,
    ) -> Result<u32, ConfigError> {
        let consumers = u32::try_from(consumers).unwrap_or(u32::MAX);
        let mut needed = 0u32;
        if roles.consume {
            let handlers = u32::try_from(self.consumer_concurrency).unwrap_or(u32::MAX);
            needed = needed
                .saturating_add(consumers.saturating_mul(handlers))
                .saturating_add(2);
        }
        if roles.relay {
            let rounds = u32::try_from(self.relay_concurrency).unwrap_or(u32::MAX);
            // The LISTEN connection, and the pruner when no consumer
            // brought one.
            let pruner = u32::from(!roles.consume);
            needed = needed
                .saturating_add(rounds)
                .saturating_add(1)
                .saturating_add(pruner);
            if self.outbox_mode == service::OutboxMode::Wal {
                // The WAL relay's hand-overs to the table.
                needed = needed.saturating_add(1);
            }
        }
        if roles.api {
            needed = needed.saturating_add(2);
        }
        match self.db_max_connections {
            Some(max) if max < needed => Err(invalid(
                "db_max_connections",
                format!(
                    "{max} connections are fewer than this process needs: {needed} for consumer_concurrency = {} x {consumers} consumer(s), relay_concurrency = {} rounds, the LISTEN connection, sweeper, pruner and API; raise it, lower those, or leave it unset to size it from them",
                    self.consumer_concurrency, self.relay_concurrency
                ),
            )),
            Some(max) => Ok(max),
            None => Ok(needed.max(1)),
        }
    }

    /// The pool for short commands that run one thing at a time.
    pub fn tool_pool_size(&self) -> u32 {
        self.db_max_connections.unwrap_or(DEFAULT_TOOL_POOL)
    }

    /// Arms the fault point `name` for a crash test.
    ///
    /// # Errors
    /// An unknown fault point, naming the ones there are.
    pub fn arm_fault(&mut self, name: &str) -> Result<(), String> {
        if worker::FaultPoint::parse(name).is_none() {
            let names: Vec<_> = worker::FaultPoint::ALL.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "unknown fault point {name:?}; one of {}",
                names.join(", ")
            ));
        }
        self.fault = Some(name.to_owned());
        Ok(())
    }

    /// The fault point crash tests armed, if any.
    pub fn fault_point(&self) -> Option<worker::FaultPoint> {
        self.fault.as_deref().and_then(worker::FaultPoint::parse)
    }
}
