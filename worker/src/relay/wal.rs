//! The WAL relay (`outbox_mode = "wal"`, PostgreSQL): publishes the events
//! handlers wrote into the write-ahead log ([`service::wal`]) by reading them
//! from a logical replication slot, in commit order.
//!
//! - **The slot is the lock.** PostgreSQL lets one session stream from a slot
//!   at a time; a second relay's `START_REPLICATION` is refused while the
//!   first holds it, so the second waits as a standby and takes over within
//!   [`WalRelayConfig::standby_retry`] of the first's connection dropping.
//! - **Confirmed only when published.** The relay reads whole transactions
//!   into a window, publishes the window's events with `Nats-Msg-Id` (PubAcks
//!   pipelined; events sharing an ordering key one after another), and only
//!   then confirms the window's end to the slot. A crash republishes at most
//!   the unconfirmed windows, and JetStream's duplicate window drops the
//!   copies.
//! - **One event does not stop the rest.** When the broker is reachable but
//!   refuses an event (no stream for its subject, a permission), the event is
//!   handed to the table relay as a row of `outbox_message` with its error,
//!   retried there with backoff and marked dead after the attempt limit,
//!   where the API, dashboard and retry see it as in table mode. Later events
//!   of its ordering key follow it into the table while any row of that key
//!   is unpublished, so a key's order holds exactly as in table mode. When
//!   the broker is unreachable, the window waits and goes again.
//! - **Nothing is dropped.** A logical message with seawall's prefix that
//!   this version cannot decode becomes a dead letter (consumer
//!   [`UNDECODABLE_CONSUMER`]) holding its bytes.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use async_nats::jetstream;
use chrono::Utc;
use futures::future::join_all;
use pgwire_replication::{
    Lsn, PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig,
};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr,
    EntityTrait, FromQueryResult, QueryFilter, QuerySelect, Statement, TransactionTrait,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use entity::{dead_letter, outbox_message};
use service::rollup::{self, Tally};
use service::state::OutboxState;
use service::wal::{self, WalEvent};

/// The consumer named on the WAL relay's dead letters: logical messages it
/// could not decode, and events reusing another event's message id.
pub const UNDECODABLE_CONSUMER: &str = "wal-relay";

/// WAL relay settings.
#[derive(Debug, Clone)]
pub struct WalRelayConfig {
    /// The database, as `database_url` names it (the replication connection
    /// uses its host, port, user, password, database and `sslmode`).
    pub database_url: String,
    /// The logical replication slot (and publication) name.
    pub slot: String,
    /// Events per window, rounded up to whole transactions (a window also
    /// goes once it holds 16 MiB of payloads).
    pub window: usize,
    /// How often a standby tries to take the slot over.
    pub standby_retry: Duration,
    /// First backoff (after a failed window or lost stream); doubles.
    pub retry_base: Duration,
    /// Longest backoff.
    pub retry_max: Duration,
    /// The connection's server errors, to explain a refused publish.
    pub server_errors: Option<crate::ServerErrors>,
}

/// Why the WAL relay cannot run, or why a session ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// The server does not decode its WAL logically.
    #[error(
        "outbox_mode = \"wal\" needs PostgreSQL's wal_level = logical, but it is {0:?}: set wal_level = logical (and max_replication_slots, max_wal_senders of at least 1 each) in postgresql.conf and restart PostgreSQL, or use outbox_mode = \"table\""
    )]
    WalLevel(String),
    /// A slot of that name exists for something else.
    #[error(
        "replication slot {slot:?} exists but {problem}; set wal_slot to another name, or drop it with `seawall relay --drop-slot` if it is an abandoned seawall slot"
    )]
    ForeignSlot {
        /// The slot.
        slot: String,
        /// What is wrong with it.
        problem: String,
    },
    /// `database_url` cannot be turned into a replication connection.
    #[error("database_url cannot be used for the replication connection: {0}")]
    Url(String),
    /// The slot is held by a running relay (drop refused).
    #[error(
        "replication slot {0:?} is in use by a running relay; stop the relays before dropping it"
    )]
    SlotActive(String),
    /// Another relay holds the slot: this one is a standby.
    #[error("replication slot {0:?} is held by another relay")]
    Standby(String),
    /// The relay was asked to stop before a window was published.
    #[error("the WAL relay stopped before its window was published")]
    Stopped,
    /// A database statement failed.
    #[error("WAL relay database error: {0}")]
    Database(#[from] DbErr),
    /// The replication stream failed.
    #[error("WAL relay replication stream: {0}")]
    Replication(#[from] PgWireError),
}

/// A SQL literal-free check of a slot name: PostgreSQL allows lower-case
/// letters, digits and underscores, at most 63 bytes.
pub fn valid_slot_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The default slot name for a database URL: `seawall_` and the database
/// name (lower-cased, other characters as `_`), so services sharing a
/// PostgreSQL cluster get a slot each.
pub fn default_slot_name(database_url: &str) -> String {
    let database = url::Url::parse(database_url)
        .ok()
        .map(|u| u.path().trim_start_matches('/').to_owned())
        .unwrap_or_default();
    let mut slot: String = format!("seawall_{database}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    slot.truncate(63);
    slot
}

#[derive(Debug, FromQueryResult)]
struct Setting {
    value: String,
}

#[derive(Debug, FromQueryResult)]
struct SlotRow {
    plugin: Option<String>,
    slot_type: String,
    database: Option<String>,
    active: bool,
}

async fn one_text(db: &DatabaseConnection, sql: &str) -> Result<String, DbErr> {
    Ok(
        Setting::find_by_statement(Statement::from_string(DbBackend::Postgres, sql))
            .one(db)
            .await?
            .map(|s| s.value)
            .unwrap_or_default(),
    )
}

async fn slot_row(db: &DatabaseConnection, slot: &str) -> Result<Option<SlotRow>, DbErr> {
    SlotRow::find_by_statement(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT plugin::text AS plugin, slot_type, database::text AS database, active FROM pg_replication_slots WHERE slot_name = $1",
        [slot.into()],
    ))
    .one(db)
    .await
}

/// Checks that the server can run the WAL relay and creates its slot and
/// publication when missing. Several relays starting at once create them
/// once.
///
/// # Errors
/// [`WalError::WalLevel`] naming the setting to change,
/// [`WalError::ForeignSlot`] for a slot of that name made for something
/// else, or the database error (for example missing `REPLICATION`
/// privilege).
pub async fn prepare(db: &DatabaseConnection, slot: &str) -> Result<(), WalError> {
    let level = one_text(db, "SELECT current_setting('wal_level') AS value").await?;
    if level != "logical" {
        return Err(WalError::WalLevel(level));
    }
    let database = one_text(db, "SELECT current_database()::text AS value").await?;
    if slot_row(db, slot).await?.is_none() {
        // A new slot starts at its creation; an old slot's position says
        // nothing about it.
        db.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "DELETE FROM wal_relay_position WHERE slot = $1",
            [slot.into()],
        ))
        .await?;
        let created = db
            .execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                [slot.into()],
            ))
            .await;
        // Another relay may have created it in the meantime.
        if let Err(err) = created
            && slot_row(db, slot).await?.is_none()
        {
            return Err(err.into());
        }
    }
    wait_consistent(db, slot).await?;
    let Some(row) = slot_row(db, slot).await? else {
        return Err(WalError::ForeignSlot {
            slot: slot.to_owned(),
            problem: "vanished while being checked".into(),
        });
    };
    let problem = if row.slot_type != "logical" || row.plugin.as_deref() != Some("pgoutput") {
        Some(format!(
            "is a {} slot of plugin {:?}, not a logical pgoutput slot",
            row.slot_type, row.plugin
        ))
    } else if row.database.as_deref() != Some(database.as_str()) {
        Some(format!(
            "belongs to database {:?}, not {database:?}",
            row.database
        ))
    } else {
        None
    };
    if let Some(problem) = problem {
        return Err(WalError::ForeignSlot {
            slot: slot.to_owned(),
            problem,
        });
    }
    // An empty publication: logical messages reach the slot whatever the
    // publication holds, and no table's changes are decoded for nothing.
    let exists = one_text(
        db,
        &format!("SELECT count(*)::text AS value FROM pg_publication WHERE pubname = '{slot}'"),
    )
    .await?;
    if exists == "0" {
        let created = db
            .execute_unprepared(&format!("CREATE PUBLICATION {slot}"))
            .await;
        if let Err(err) = created
            && !err.to_string().contains("already exists")
        {
            return Err(err.into());
        }
    }
    Ok(())
}

/// How long start-up waits for another process's slot creation to finish.
const SLOT_CREATION_WAIT: Duration = Duration::from_secs(120);

/// Waits until `slot` decodes every transaction that commits from now on.
/// A slot another process is still creating is listed before it is: its
/// creation waits for the transactions running at its start to end, and
/// events committed until then would never reach it. Its confirmed
/// position appears once it is ready.
async fn wait_consistent(db: &DatabaseConnection, slot: &str) -> Result<(), WalError> {
    let deadline = tokio::time::Instant::now() + SLOT_CREATION_WAIT;
    loop {
        let ready = one_text(
            db,
            &format!(
                "SELECT (count(*) FILTER (WHERE confirmed_flush_lsn IS NOT NULL))::text AS value \
                 FROM pg_replication_slots WHERE slot_name = '{slot}'"
            ),
        )
        .await?;
        if ready != "0" {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(WalError::ForeignSlot {
                slot: slot.to_owned(),
                problem: format!(
                    "has not become ready in {SLOT_CREATION_WAIT:?} (its creation waits for every transaction running when it began to end)"
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Drops the slot and its publication (`seawall relay --drop-slot`): the
/// WAL it retained is freed, and events not yet relayed from it are gone.
/// Returns whether a slot was dropped.
///
/// # Errors
/// [`WalError::SlotActive`] while a relay streams from it; the database
/// error otherwise.
pub async fn drop_slot(db: &DatabaseConnection, slot: &str) -> Result<bool, WalError> {
    let dropped = match slot_row(db, slot).await? {
        Some(row) if row.active => return Err(WalError::SlotActive(slot.to_owned())),
        Some(_) => {
            db.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_drop_replication_slot($1)",
                [slot.into()],
            ))
            .await?;
            true
        }
        None => false,
    };
    db.execute_unprepared(&format!("DROP PUBLICATION IF EXISTS {slot}"))
        .await?;
    // A new slot of the same name starts from its own creation.
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "DELETE FROM wal_relay_position WHERE slot = $1",
        [slot.into()],
    ))
    .await?;
    Ok(dropped)
}

/// The replication connection's settings, from `database_url`.
fn replication_config(url: &str, slot: &str) -> Result<ReplicationConfig, WalError> {
    let parsed = url::Url::parse(url).map_err(|e| WalError::Url(e.to_string()))?;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|e| WalError::Url(e.to_string()))
    };
    let host = parsed.host_str().unwrap_or("localhost").to_owned();
    let user = match parsed.username() {
        "" => "postgres".to_owned(),
        user => decode(user)?,
    };
    let password = decode(parsed.password().unwrap_or(""))?;
    let database = match decode(parsed.path().trim_start_matches('/'))? {
        d if d.is_empty() => user.clone(),
        d => d,
    };
    let query: BTreeMap<String, String> = parsed.query_pairs().into_owned().collect();
    let root = query.get("sslrootcert").map(Into::into);
    let tls = match query.get("sslmode").map(String::as_str) {
        None | Some("disable" | "allow" | "prefer") => TlsConfig::disabled(),
        Some("require") => TlsConfig::require(),
        Some("verify-ca") => TlsConfig::verify_ca(root),
        Some("verify-full") => TlsConfig::verify_full(root),
        Some(other) => return Err(WalError::Url(format!("unknown sslmode {other:?}"))),
    };
    Ok(
        ReplicationConfig::new(host, user, password, database, slot, slot)
            .with_port(parsed.port().unwrap_or(5432))
            .with_tls(tls)
            .with_status_interval(Duration::from_secs(1))
            .with_wakeup_interval(Duration::from_secs(1))
            .with_application_name(format!("seawall-relay {}", std::process::id())),
    )
}

/// Fewest events a window may hold before it goes (when that many are ready).
pub const MIN_WINDOW: usize = 5_000;

/// Most payload bytes a window holds: with big events it goes sooner, so a
/// window of megabyte events does not hold gigabytes.
const WINDOW_BYTES: usize = 16 << 20;

/// How long a window that has events waits for more before it goes.
const LINGER: Duration = Duration::from_millis(1);

/// Committed transactions read from the slot, up to a commit boundary.
#[derive(Debug, Default)]
struct Window {
    /// Their events, in commit order.
    events: Vec<WalEvent>,
    /// Where the slot may be confirmed once they are published.
    end: Option<Lsn>,
    /// Commit time of the last transaction (microseconds since 2000-01-01).
    commit_time: Option<i64>,
    /// Seawall messages this version could not decode, with why.
    undecodable: Vec<(Vec<u8>, String)>,
}

/// A key's (or a key-less event's) publishing outcome in a window.
#[derive(Debug, Default)]
struct Chain {
    published: usize,
    /// The first event that failed, its error, and the events after it.
    failed: Option<(WalEvent, String, Vec<WalEvent>)>,
}

/// Relays the outbox from the WAL.
pub struct WalRelay {
    db: DatabaseConnection,
    js: jetstream::Context,
    config: WalRelayConfig,
    /// Set when a session takes the slot: the reconnect backoff starts over.
    held: std::sync::atomic::AtomicBool,
}

impl WalRelay {
    /// A relay of `config.slot` on `db` (which [`prepare`] checked) into `js`.
    pub fn new(db: DatabaseConnection, js: jetstream::Context, config: WalRelayConfig) -> Self {
        Self {
            db,
            js,
            config,
            held: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Reads the slot while this relay holds it, and waits as a standby
    /// while another does, until `cancel` fires. Lost streams and database
    /// trouble are logged and retried with backoff; it never gives up.
    pub async fn run(&self, cancel: CancellationToken) {
        let mut failures = 0u32;
        let mut standby_logged = false;
        while !cancel.is_cancelled() {
            let ended = self.session(&cancel).await;
            if cancel.is_cancelled() {
                break;
            }
            let wait = match ended {
                Ok(()) => break,
                Err(WalError::Standby(slot)) => {
                    if !standby_logged {
                        tracing::info!(%slot, "another relay holds the WAL slot; waiting as a standby");
                        standby_logged = true;
                    }
                    metrics::gauge!("seawall_wal_relay_active").set(0.0);
                    self.config.standby_retry
                }
                Err(err) => {
                    if self.held.swap(false, std::sync::atomic::Ordering::Relaxed) {
                        failures = 0;
                    }
                    failures = failures.saturating_add(1);
                    metrics::gauge!("seawall_wal_relay_active").set(0.0);
                    if err.to_string().contains("does not exist") {
                        // Dropped or invalidated under running writers: the
                        // events they wrote meanwhile never reached a slot.
                        tracing::error!(slot = %self.config.slot, error = %err, "the WAL slot is gone; recreating it (events written while it was missing are not relayed)");
                        metrics::counter!("seawall_wal_slot_recreated_total").increment(1);
                        if let Err(err) = prepare(&self.db, &self.config.slot).await {
                            tracing::warn!(error = %err, "could not recreate the WAL slot");
                        }
                    }
                    tracing::warn!(error = %err, "WAL relay session ended; reconnecting");
                    service::Backoff::new(self.config.retry_base, self.config.retry_max)
                        .delay(failures)
                }
            };
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        metrics::gauge!("seawall_wal_relay_active").set(0.0);
    }

    /// One replication session: take the slot, then relay windows until
    /// `cancel` fires or the stream fails. A reader task assembles the next
    /// window while this one is published; positions go back to it to be
    /// confirmed.
    async fn session(&self, cancel: &CancellationToken) -> Result<(), WalError> {
        let mut config = replication_config(&self.config.database_url, &self.config.slot)?;
        // The slot itself may be behind after a PostgreSQL crash: start
        // where this relay durably got to, so what it published before is
        // skipped by the server instead of published again.
        if let Some(position) = self.position().await? {
            config = config.with_start_lsn(position);
        }
        let mut client = ReplicationClient::connect_gated(config).await?;
        client.start().await?;
        if let Err(err) = client.wait_started().await {
            // SQLSTATE 55006 (object in use): another session holds the slot.
            let text = err.to_string();
            if text.contains("is active for PID") || text.contains("55006") {
                return Err(WalError::Standby(self.config.slot.clone()));
            }
            return Err(err.into());
        }
        tracing::info!(slot = %self.config.slot, "WAL relay holds the slot");
        metrics::gauge!("seawall_wal_relay_active").set(1.0);
        self.held.store(true, std::sync::atomic::Ordering::Relaxed);
        let stop = cancel.child_token();
        // Whichever way the session ends, the reader stops and lets the slot go.
        let _stop_reader = stop.clone().drop_guard();
        let (windows, mut next) = mpsc::channel(1);
        let (confirm, confirms) = mpsc::unbounded_channel();
        let reader = Reader {
            client,
            confirms,
            size: self.config.window,
        };
        tokio::spawn(reader.run(windows, stop));
        loop {
            let started = std::time::Instant::now();
            let window = tokio::select! {
                // A stopping reader ends its stream too; stopping comes first.
                biased;
                () = cancel.cancelled() => break,
                window = next.recv() => window.ok_or_else(ended)??,
            };
            let waited = started.elapsed();
            self.relay_window(&window, cancel).await?;
            tracing::debug!(
                events = window.events.len(),
                wait_ms = waited.as_secs_f64() * 1e3,
                publish_ms = (started.elapsed() - waited).as_secs_f64() * 1e3,
                "WAL window"
            );
            if let Some(end) = window.end {
                let _ = confirm.send(end);
            }
            metrics::gauge!("seawall_relay_heartbeat_timestamp_seconds")
                .set(Utc::now().timestamp_millis() as f64 / 1000.0);
            if let Some(commit) = window.commit_time {
                // PostgreSQL's epoch is 2000-01-01.
                let commit_ms = commit / 1000 + 946_684_800_000;
                let lag = (Utc::now().timestamp_millis() - commit_ms).max(0);
                metrics::gauge!("seawall_wal_relay_lag_seconds").set(lag as f64 / 1000.0);
            }
        }
        Ok(())
    }

    /// Where the relays of this slot durably got to, if anywhere.
    async fn position(&self) -> Result<Option<Lsn>, DbErr> {
        let row = self
            .db
            .query_one_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                // A position past the server's WAL is another cluster's
                // (a restored dump): starting there would skip events.
                "SELECT lsn FROM wal_relay_position WHERE slot = $1 \
                 AND lsn <= pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')",
                [self.config.slot.as_str().into()],
            ))
            .await?;
        Ok(match row {
            Some(row) => Some(Lsn(
                u64::try_from(row.try_get::<i64>("", "lsn")?).unwrap_or(0)
            )),
            None => None,
        })
    }

    /// The ordering keys of `events` with pending rows in `outbox_message`,
    /// written by this relay or anyone else: their events must queue behind
    /// those rows (a dead row holds nothing, as in table mode). Asked per
    /// window, for its keys only.
    async fn held_keys(&self, events: &[WalEvent]) -> Result<HashSet<String>, DbErr> {
        let keys: HashSet<&str> = events
            .iter()
            .filter_map(|e| e.ordering_key.as_deref())
            .collect();
        if keys.is_empty() {
            return Ok(HashSet::new());
        }
        let held: Vec<Option<String>> = outbox_message::Entity::find()
            .select_only()
            .column(outbox_message::Column::OrderingKey)
            .distinct()
            .filter(OutboxState::Pending.condition())
            .filter(outbox_message::Column::OrderingKey.is_in(keys))
            .into_tuple()
            .all(&self.db)
            .await?;
        Ok(held.into_iter().flatten().collect())
    }

    /// Publishes a window's events, hands what the broker refused (and what
    /// must queue behind it) to the table, and records undecodable messages;
    /// returns once all of that is durable. While the broker is unreachable
    /// the events not yet acknowledged go again after a backoff (never the
    /// acknowledged ones: the window may outlast JetStream's duplicate
    /// window).
    async fn relay_window(
        &self,
        window: &Window,
        cancel: &CancellationToken,
    ) -> Result<(), WalError> {
        let mut attempt = 0u32;
        let mut published = 0usize;
        let mut events = window.events.clone();
        loop {
            let held = self.held_keys(&events).await?;
            let (queued, chains) = split(events, &held);
            let results = self.publish_chains(chains).await;
            published += results.iter().map(|c| c.published).sum::<usize>();
            let failed = results.iter().any(|c| c.failed.is_some());
            let connected =
                self.js.client().connection_state() == async_nats::connection::State::Connected;
            if failed && !connected {
                attempt = attempt.saturating_add(1);
                let wait = service::Backoff::new(self.config.retry_base, self.config.retry_max)
                    .delay(attempt);
                tracing::warn!(
                    ?wait,
                    "NATS is unreachable; the WAL window's unacknowledged events go again"
                );
                tokio::select! {
                    // Not confirmed: the next session reads the window again.
                    () = cancel.cancelled() => return Err(WalError::Stopped),
                    () = tokio::time::sleep(wait) => {}
                }
                events = queued;
                for chain in results {
                    if let Some((event, _, rest)) = chain.failed {
                        events.push(event);
                        events.extend(rest);
                    }
                }
                continue;
            }
            metrics::counter!("seawall_relay_published_total").increment(published as u64);
            let mut rows = Vec::new();
            for event in queued {
                rows.push((service::outbox::row_of(event.clone())?, event));
            }
            for chain in results {
                let Some((event, error, rest)) = chain.failed else {
                    continue;
                };
                metrics::counter!("seawall_relay_failed_total").increment(1);
                let error = crate::relay::explain(
                    self.config.server_errors.as_ref(),
                    &event.subject,
                    error,
                );
                tracing::warn!(message_id = %event.message_id, subject = %event.subject, %error, "publish refused; the event goes to the outbox table to be retried");
                let mut row = service::outbox::row_of(event.clone())?;
                row.attempts = Set(1);
                row.last_error = Set(Some(error));
                row.next_attempt_at = Set(Utc::now() + super::store::span(self.config.retry_base));
                rows.push((row, event));
                for event in rest {
                    rows.push((service::outbox::row_of(event.clone())?, event));
                }
            }
            self.record(published, rows, &window.undecodable, window.end)
                .await?;
            return Ok(());
        }
    }

    /// Publishes the chains (one key's events, or one key-less event) in
    /// rounds: each round sends the next event of every chain still going,
    /// one after another as a plain publisher does, then awaits their
    /// PubAcks together. A chain stops at its first failure, so a key's
    /// events go out in order and none after a refused one.
    async fn publish_chains(&self, chains: Vec<Vec<WalEvent>>) -> Vec<Chain> {
        let mut results: Vec<Chain> = chains.iter().map(|_| Chain::default()).collect();
        let mut queues: Vec<std::collections::VecDeque<WalEvent>> =
            chains.into_iter().map(Into::into).collect();
        loop {
            let mut round = Vec::new();
            for (i, queue) in queues.iter_mut().enumerate() {
                if results[i].failed.is_none()
                    && let Some(event) = queue.pop_front()
                {
                    let sent = self.dispatch(&event).await;
                    round.push((i, event, sent));
                }
            }
            if round.is_empty() {
                return results;
            }
            let acks = join_all(round.into_iter().map(|(i, event, sent)| async move {
                let outcome = match sent {
                    Ok(in_flight) => in_flight.acknowledged().await,
                    Err(error) => Err(error),
                };
                (i, event, outcome)
            }))
            .await;
            for (i, event, outcome) in acks {
                match outcome {
                    Ok(()) => results[i].published += 1,
                    Err(error) => {
                        let rest = std::mem::take(&mut queues[i]).into();
                        results[i].failed = Some((event, error, rest));
                    }
                }
            }
        }
    }

    async fn dispatch(&self, event: &WalEvent) -> Result<crate::relay::InFlight, String> {
        let headers = event
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()));
        let message = crate::relay::message(&event.message_id, headers, event.payload.clone())?;
        let stored = || event.headers.clone();
        crate::relay::dispatch(
            &self.js,
            &event.subject,
            &event.message_id,
            &stored,
            message,
        )
        .await
    }

    /// Writes the rows handed to the table, the dead letters of undecodable
    /// messages, the minute's count of `published` events and the window's
    /// `end` as the relay's durable position, in one transaction. A row already there (a window that went again after a
    /// crash) is left as it is; the count of such a window is counted again.
    async fn record(
        &self,
        published: usize,
        rows: Vec<(outbox_message::ActiveModel, WalEvent)>,
        undecodable: &[(Vec<u8>, String)],
        end: Option<Lsn>,
    ) -> Result<(), DbErr> {
        if published == 0 && rows.is_empty() && undecodable.is_empty() {
            return Ok(());
        }
        let txn = self.db.begin().await?;
        rollup::add(&txn, Tally::Published, Utc::now(), published as u64).await?;
        if let Some(end) = end {
            txn.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "INSERT INTO wal_relay_position (slot, lsn) VALUES ($1, $2) \
                 ON CONFLICT (slot) DO UPDATE SET lsn = GREATEST(wal_relay_position.lsn, EXCLUDED.lsn)",
                [self.config.slot.as_str().into(), lsn_value(end).into()],
            ))
            .await?;
        }
        let rows = self.without_clashes(&txn, rows).await?;
        for chunk in rows.chunks(service::outbox::ROWS_PER_INSERT) {
            outbox_message::Entity::insert_many(chunk.to_vec())
                .on_conflict(
                    OnConflict::column(outbox_message::Column::MessageId)
                        .do_nothing()
                        .to_owned(),
                )
                .exec_without_returning(&txn)
                .await?;
        }
        for (content, error) in undecodable {
            tracing::error!(%error, bytes = content.len(), "a seawall WAL message could not be decoded; kept as a dead letter");
            dead_letter::Entity::insert(dead_letter::ActiveModel {
                consumer: Set(UNDECODABLE_CONSUMER.into()),
                message_id: Set(None),
                subject: Set(wal::PREFIX.into()),
                payload: Set(content.clone()),
                headers: Set(serde_json::json!({})),
                error: Set(error.clone()),
                deliveries: Set(1),
                created_at: Set(Utc::now()),
                replayed_at: Set(None),
                ..Default::default()
            })
            .exec_without_returning(&txn)
            .await?;
        }
        txn.commit().await
    }

    /// The rows to hand to the table, less those whose message id a row
    /// already has: the same event again (a window read twice after a
    /// crash) is left as it is, and another event reusing the id (which
    /// table mode would have refused at enqueue) is kept as a dead letter
    /// instead of being dropped.
    async fn without_clashes(
        &self,
        txn: &sea_orm::DatabaseTransaction,
        rows: Vec<(outbox_message::ActiveModel, WalEvent)>,
    ) -> Result<Vec<outbox_message::ActiveModel>, DbErr> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = rows.iter().map(|(_, e)| e.message_id.as_str()).collect();
        let existing: Vec<(String, String, Vec<u8>)> = outbox_message::Entity::find()
            .select_only()
            .column(outbox_message::Column::MessageId)
            .column(outbox_message::Column::Subject)
            .column(outbox_message::Column::Payload)
            .filter(outbox_message::Column::MessageId.is_in(ids))
            .into_tuple()
            .all(txn)
            .await?;
        let mut fresh = Vec::new();
        for (row, event) in rows {
            match existing.iter().find(|(id, _, _)| *id == event.message_id) {
                None => fresh.push(row),
                Some((_, subject, payload))
                    if *subject == event.subject && payload[..] == event.payload[..] => {}
                Some(_) => {
                    let error = format!(
                        "message id {:?} is already used by another outbox event; this one was not published",
                        event.message_id
                    );
                    tracing::error!(message_id = %event.message_id, "{error}");
                    dead_letter::Entity::insert(dead_letter::ActiveModel {
                        consumer: Set(UNDECODABLE_CONSUMER.into()),
                        message_id: Set(Some(event.message_id.clone())),
                        subject: Set(event.subject.clone()),
                        payload: Set(event.payload.to_vec()),
                        headers: Set(serde_json::to_value(&event.headers)
                            .map_err(|e| DbErr::Json(e.to_string()))?),
                        error: Set(error),
                        deliveries: Set(0),
                        created_at: Set(Utc::now()),
                        replayed_at: Set(None),
                        ..Default::default()
                    })
                    .exec_without_returning(txn)
                    .await?;
                }
            }
        }
        Ok(fresh)
    }
}

/// `lsn` as stored in `wal_relay_position` (a `bigint`; positions stay far
/// below 2^63).
fn lsn_value(lsn: Lsn) -> i64 {
    i64::try_from(lsn.0).unwrap_or(i64::MAX)
}

/// Most bytes of an undecodable message kept in its dead letter.
const KEPT_BYTES: usize = 1 << 20;

/// The events of a seawall message, each checked as an outbox row would
/// store it: the relay may have to write any of them to the table, and a
/// row that cannot be written would stop it on that window for good.
fn checked(content: &bytes::Bytes) -> Result<Vec<WalEvent>, String> {
    let events = wal::decode(content).map_err(|e| e.to_string())?;
    for (i, e) in events.iter().enumerate() {
        service::outbox::check_event(
            &e.message_id,
            &e.subject,
            e.ordering_key.as_deref(),
            &e.headers,
        )
        .map_err(|err| format!("event {i} of the message: {err}"))?;
    }
    Ok(events)
}

/// What a dead letter keeps of an undecodable message: all of it up to
/// [`KEPT_BYTES`], its start beyond that.
fn kept(content: &[u8]) -> Vec<u8> {
    content[..content.len().min(KEPT_BYTES)].to_vec()
}

/// The stream's end, as an error: a session ends when its stream does.
fn ended() -> WalError {
    WalError::Replication(PgWireError::Protocol("the replication stream ended".into()))
}

/// Reads windows from the slot for a session, and confirms the positions
/// the session sends back once their windows are published.
struct Reader {
    client: ReplicationClient,
    confirms: mpsc::UnboundedReceiver<Lsn>,
    size: usize,
}

impl Reader {
    /// Sends windows until `stop` fires, the session goes, or the stream
    /// fails (the error is the last thing sent); then lets the slot go.
    async fn run(
        mut self,
        windows: mpsc::Sender<Result<Window, WalError>>,
        stop: CancellationToken,
    ) {
        loop {
            let window = tokio::select! {
                () = stop.cancelled() => break,
                window = self.window() => window,
            };
            let failed = window.is_err();
            if windows.send(window).await.is_err() || failed {
                break;
            }
        }
        self.client.stop();
    }

    /// The next event, confirming positions while it waits (both receives
    /// are cancel-safe). `linger` bounds the wait: `None` once it passes.
    async fn next(
        &mut self,
        linger: Option<Duration>,
    ) -> Result<Option<ReplicationEvent>, WalError> {
        let deadline = linger.map(|l| tokio::time::Instant::now() + l);
        loop {
            let timeout = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = self.client.recv() => return Ok(Some(event?.ok_or_else(ended)?)),
                Some(lsn) = self.confirms.recv() => self.client.update_applied_lsn(lsn),
                () = timeout => return Ok(None),
            }
        }
    }

    /// Reads committed transactions until the window holds `size` events or
    /// no more come within [`LINGER`]; waits for the first one (or a
    /// keepalive that moves the position on).
    async fn window(&mut self) -> Result<Window, WalError> {
        let mut window = Window::default();
        let mut open: Option<Vec<WalEvent>> = None;
        let mut bytes = 0usize;
        loop {
            let waiting = open.is_some() || (window.events.is_empty() && window.end.is_none());
            // Under load the stream delivers in small chunks; waiting a
            // moment for the next one fills the window, so the wait for the
            // window's last PubAck is paid per window, not per chunk.
            let Some(event) = self.next((!waiting).then_some(LINGER)).await? else {
                return Ok(window);
            };
            match event {
                ReplicationEvent::Begin {
                    commit_time_micros, ..
                } => {
                    open = Some(Vec::new());
                    window.commit_time = Some(commit_time_micros);
                }
                ReplicationEvent::Message {
                    prefix,
                    content,
                    transactional,
                    lsn,
                } if prefix == wal::PREFIX => match checked(&content) {
                    Ok(events) => match open.as_mut() {
                        Some(txn) if transactional => txn.extend(events),
                        _ => {
                            window.events.extend(events);
                            window.end = window.end.max(Some(lsn));
                        }
                    },
                    Err(err) => {
                        let error = format!("{err} ({} bytes)", content.len());
                        window.undecodable.push((kept(&content), error));
                    }
                },
                ReplicationEvent::Commit { end_lsn, .. } => {
                    let txn = open.take().unwrap_or_default();
                    bytes += txn.iter().map(|e| e.payload.len()).sum::<usize>();
                    window.events.extend(txn);
                    window.end = window.end.max(Some(end_lsn));
                    if window.events.len() >= self.size || bytes >= WINDOW_BYTES {
                        return Ok(window);
                    }
                }
                ReplicationEvent::KeepAlive { wal_end, .. } if open.is_none() => {
                    window.end = window.end.max(Some(wal_end));
                }
                _ => {}
            }
        }
    }
}

/// Splits `events` into those that must queue in the table behind a held
/// key, and chains to publish: one per ordering key (in order), one per
/// key-less event.
fn split(events: Vec<WalEvent>, held: &HashSet<String>) -> (Vec<WalEvent>, Vec<Vec<WalEvent>>) {
    let mut queued = Vec::new();
    let mut keyed: BTreeMap<String, Vec<WalEvent>> = BTreeMap::new();
    let mut chains = Vec::new();
    for event in events {
        match event.ordering_key.clone() {
            Some(key) if held.contains(&key) => queued.push(event),
            Some(key) => keyed.entry(key).or_default().push(event),
            None => chains.push(vec![event]),
        }
    }
    chains.extend(keyed.into_values());
    (queued, chains)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_follow_the_database() {
        assert_eq!(
            default_slot_name("postgres://u:p@h:5432/Orders-Prod?sslmode=require"),
            "seawall_orders_prod"
        );
        assert!(valid_slot_name(&default_slot_name(
            "postgres://h/t_0123456789abcdef0123456789abcdef"
        )));
        assert!(!valid_slot_name("Seawall"));
        assert!(!valid_slot_name(&"a".repeat(64)));
        assert!(!valid_slot_name("x; DROP TABLE y"));
    }

    #[test]
    fn the_replication_connection_follows_database_url() {
        let c = replication_config(
            "postgres://app%40x:p%2Fw@db.example:6543/orders?sslmode=require",
            "seawall_orders",
        )
        .unwrap();
        assert_eq!((c.host.as_str(), c.port), ("db.example", 6543));
        assert_eq!((c.user.as_str(), c.password.as_str()), ("app@x", "p/w"));
        assert_eq!(c.database, "orders");
        assert!(c.tls.mode.requires_tls());
        assert!(replication_config("postgres://h/d?sslmode=sometimes", "s").is_err());
    }

    #[test]
    fn held_keys_queue_and_other_keys_chain_in_order() {
        let event = |id: &str, key: Option<&str>| WalEvent {
            message_id: id.into(),
            subject: "s".into(),
            ordering_key: key.map(Into::into),
            headers: BTreeMap::new(),
            payload: bytes::Bytes::new(),
            causation_id: None,
            causation_consumer: None,
            correlation_id: None,
            created_at: Utc::now(),
        };
        let held = HashSet::from(["k1".to_owned()]);
        let (queued, chains) = split(
            vec![
                event("a", Some("k1")),
                event("b", Some("k2")),
                event("c", None),
                event("d", Some("k2")),
            ],
            &held,
        );
        assert_eq!(queued.len(), 1);
        let ids: Vec<Vec<&str>> = chains
            .iter()
            .map(|c| c.iter().map(|e| e.message_id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["c"], vec!["b", "d"]]);
    }
}
