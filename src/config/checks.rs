//! The checks start-up runs on [`Settings`] before it connects anywhere:
//! each refusal names the key (and the variable) to change.

use std::net::SocketAddr;

use super::{ConfigError, Settings, invalid};

impl Settings {
    /// Every value start-up can check without connecting: a bad one names
    /// its key.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let scheme = self.check_urls()?;
        self.check_counts()?;
        self.check_patience()?;
        self.check_naks()?;
        self.check_claim_lease()?;
        self.check_metrics_addr()?;
        self.check_admin_token()?;
        self.api_tokens()?;
        self.check_outbox_mode(scheme)?;
        self.check_files()?;
        crate::nats::check(self)
    }

    /// The database URL names an engine seawall runs on, a read replica the
    /// same engine, and the NATS URL looks like one: a typo here would
    /// otherwise surface as a connection error that hides the key. Returns
    /// the database URL's scheme, which later checks depend on.
    fn check_urls(&self) -> Result<&str, ConfigError> {
        let scheme = self.database_url.split(':').next().unwrap_or_default();
        if !matches!(scheme, "sqlite" | "postgres" | "postgresql" | "mysql") {
            return Err(invalid(
                "database_url",
                format!("unsupported scheme {scheme:?}; use sqlite:, postgres: or mysql:"),
            ));
        }
        if let Some(url) = &self.admin_database_url {
            let admin = url.split(':').next().unwrap_or_default();
            let family = |s: &str| {
                if s == "postgresql" {
                    "postgres".to_owned()
                } else {
                    s.to_owned()
                }
            };
            if family(admin) != family(scheme) {
                return Err(invalid(
                    "admin_database_url",
                    format!(
                        "must be a replica of database_url, on the same engine ({scheme}:), not {admin:?}"
                    ),
                ));
            }
        }
        self.check_postgres_options(scheme)?;
        if !self.nats_url.contains("://") && !self.nats_url.contains(':') {
            return Err(invalid(
                "nats_url",
                "expected a URL like nats://127.0.0.1:4222",
            ));
        }
        Ok(scheme)
    }

    /// A PostgreSQL URL's options are each honoured by the pool and the WAL
    /// relay, or start-up stops naming the one that would be ignored.
    fn check_postgres_options(&self, scheme: &str) -> Result<(), ConfigError> {
        if !matches!(scheme, "postgres" | "postgresql") {
            return Ok(());
        }
        let urls = std::iter::once(("database_url", &self.database_url)).chain(
            self.admin_database_url
                .iter()
                .map(|u| ("admin_database_url", u)),
        );
        for (key, url) in urls {
            service::pg_url::check(url).map_err(|why| invalid(key, why))?;
        }
        service::pg_url::check_env(&|name| std::env::var(name).ok())
            .map_err(|why| invalid("database_url", why))
    }

    /// Counts, sizes and intervals are in range: a zero would stall or spin
    /// the loop it drives, and a batch past the group limit would slow every
    /// session of the database down.
    fn check_counts(&self) -> Result<(), ConfigError> {
        if self.db_max_connections == Some(0) {
            return Err(invalid("db_max_connections", "must be at least 1"));
        }
        if self.ack_wait_ms == 0 {
            return Err(invalid("ack_wait_ms", "must be at least 1"));
        }
        if self.max_deliver < 1 {
            return Err(invalid("max_deliver", "must be at least 1"));
        }
        for (key, value) in [
            ("relay_lease_ms", self.relay_lease_ms),
            ("relay_batch_size", self.relay_batch_size),
            ("relay_concurrency", self.relay_concurrency as u64),
            ("relay_poll_ms", self.relay_poll_ms),
            ("relay_max_attempts", self.relay_max_attempts),
            ("relay_retry_max_ms", self.relay_retry_max_ms),
            ("consumer_concurrency", self.consumer_concurrency as u64),
            ("inbox_batch", self.inbox_batch.unwrap_or(1) as u64),
            ("max_handling_ms", self.max_handling_ms),
            ("nak_base_ms", self.nak_base_ms),
            ("stream_replicas", self.stream_replicas as u64),
            ("prune_interval_ms", self.prune_interval_ms),
            ("prune_batch_size", self.prune_batch_size),
            ("sweep_interval_ms", self.sweep_interval_ms),
            ("claim_lease_ms", self.claim_lease_ms),
            ("claim_max_attempts", self.claim_max_attempts),
            ("wal_window", self.wal_window),
            ("wal_handoff_ms", self.wal_handoff_ms),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if self
            .inbox_batch
            .is_some_and(|batch| batch > service::group::MAX_BATCH)
        {
            return Err(invalid(
                "inbox_batch",
                format!(
                    "must be at most {}: each delivery of a batch is a subtransaction, and PostgreSQL slows every session down once a transaction holds more than 64",
                    service::group::MAX_BATCH
                ),
            ));
        }
        if self.duplicate_window_ms == 0 {
            return Err(invalid("duplicate_window_ms", "must be at least 1"));
        }
        Ok(())
    }

    /// A claim outlasts the handling time it covers: otherwise an effect
    /// still within its time could be taken over and performed twice.
    fn check_claim_lease(&self) -> Result<(), ConfigError> {
        if self.claim_lease_ms < self.max_handling_ms {
            return Err(invalid(
                "claim_lease_ms",
                format!(
                    "{} ms is shorter than max_handling_ms ({} ms): an effect still running within its handling time would lose its claim to the sweeper or another delivery, and be performed twice",
                    self.claim_lease_ms, self.max_handling_ms
                ),
            ));
        }
        Ok(())
    }

    /// The probes' address parses, or is `off`: a typo would otherwise
    /// leave the process without probes or metrics and nothing said.
    fn check_metrics_addr(&self) -> Result<(), ConfigError> {
        if self.metrics_addr != "off" && self.metrics_addr.parse::<SocketAddr>().is_err() {
            return Err(invalid(
                "metrics_addr",
                format!(
                    "{:?} is neither an address (host:port) nor `off`",
                    self.metrics_addr
                ),
            ));
        }
        Ok(())
    }

    /// An admin token, when set, is a secret of the deployment's own: an
    /// empty one is a slip, and the manifests' placeholder is known to all.
    fn check_admin_token(&self) -> Result<(), ConfigError> {
        if matches!(&self.admin_token, Some(t) if t.trim().is_empty()) {
            return Err(invalid("admin_token", "must not be empty when set"));
        }
        if matches!(&self.admin_token, Some(t) if t.trim().eq_ignore_ascii_case(PLACEHOLDER)) {
            return Err(invalid(
                "admin_token",
                "is still the manifests' placeholder CHANGE-ME; set a secret of your own",
            ));
        }
        Ok(())
    }

    /// The nak schedule grows, and a failing message's deliveries (each
    /// nak at most `nak_max_ms`, each delivery handled within the ack wait)
    /// end before the stream drops the message: otherwise it could leave the
    /// stream with no dead letter.
    fn check_naks(&self) -> Result<(), ConfigError> {
        if self.nak_max_ms < self.nak_base_ms {
            return Err(invalid(
                "nak_max_ms",
                format!(
                    "{} ms is shorter than nak_base_ms ({} ms)",
                    self.nak_max_ms, self.nak_base_ms
                ),
            ));
        }
        let naks = u32::try_from(self.max_deliver.saturating_sub(1)).unwrap_or(u32::MAX);
        let span = (0..naks.min(64))
            .map(|n| {
                self.nak_base_ms
                    .saturating_mul(1u64 << n.min(40))
                    .min(self.nak_max_ms)
            })
            .fold(0u64, u64::saturating_add)
            .saturating_add(
                self.ack_wait_ms
                    .saturating_mul(u64::try_from(self.max_deliver).unwrap_or(u64::MAX)),
            );
        if self.stream_max_age_ms != 0 && span >= self.stream_max_age_ms {
            return Err(invalid(
                "nak_max_ms",
                format!(
                    "a failing message's {} deliveries can span {span} ms (naks from nak_base_ms = {} up to nak_max_ms = {}, plus an ack wait each), not shorter than stream_max_age_ms ({} ms): it could leave the stream before its dead letter is written; lower the nak delays or max_deliver, or keep messages longer",
                    self.max_deliver, self.nak_base_ms, self.nak_max_ms, self.stream_max_age_ms
                ),
            ));
        }
        Ok(())
    }

    /// A held delivery stays in the stream, unacknowledged, for up to the
    /// patience: at least one ack wait (a shorter one gives up before
    /// JetStream would even redeliver), and shorter than the stream keeps
    /// messages (the message must still be there to be acked).
    fn check_patience(&self) -> Result<(), ConfigError> {
        if self.infra_patience_ms < self.ack_wait_ms {
            return Err(invalid(
                "infra_patience_ms",
                format!(
                    "{} ms is shorter than ack_wait_ms ({} ms); a resource failure would count against the message before one redelivery",
                    self.infra_patience_ms, self.ack_wait_ms
                ),
            ));
        }
        if self.stream_max_age_ms != 0 && self.infra_patience_ms >= self.stream_max_age_ms {
            return Err(invalid(
                "infra_patience_ms",
                format!(
                    "{} ms is not shorter than stream_max_age_ms ({} ms); a held message could leave the stream before it is acked",
                    self.infra_patience_ms, self.stream_max_age_ms
                ),
            ));
        }
        Ok(())
    }

    /// WAL mode runs on PostgreSQL only, with a slot name PostgreSQL takes.
    fn check_outbox_mode(&self, scheme: &str) -> Result<(), ConfigError> {
        if self.outbox_mode == service::OutboxMode::Wal
            && !matches!(scheme, "postgres" | "postgresql")
        {
            return Err(invalid(
                "outbox_mode",
                format!(
                    "\"wal\" needs PostgreSQL (logical decoding), but database_url is {scheme}:; use outbox_mode = \"table\""
                ),
            ));
        }
        if let Some(slot) = &self.wal_slot
            && !worker::relay::wal::valid_slot_name(slot)
        {
            return Err(invalid(
                "wal_slot",
                format!("{slot:?} is not a slot name: 1 to 63 lower-case letters, digits or _"),
            ));
        }
        Ok(())
    }

    /// Every file a key names exists and is a file.
    fn check_files(&self) -> Result<(), ConfigError> {
        for (key, path) in [
            ("webhook_ca_file", &self.webhook_ca_file),
            ("nats_creds_file", &self.nats_creds_file),
            ("nats_ca_file", &self.nats_ca_file),
            ("nats_cert_file", &self.nats_cert_file),
            ("nats_key_file", &self.nats_key_file),
        ] {
            if let Some(path) = path
                && !path.is_file()
            {
                return Err(invalid(
                    key,
                    format!("{} is not a readable file", path.display()),
                ));
            }
        }
        Ok(())
    }
}

/// The placeholder secret of the shipped manifests (`deploy/k8s/`): a
/// deployment applied unedited must not run with a token everyone knows.
pub(crate) const PLACEHOLDER: &str = "CHANGE-ME";
