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
//! - **Bounded memory.** A window holds at most [`WalRelayConfig::window`]
//!   events or 16 MiB of payloads; a transaction larger than that goes in
//!   pieces. Each piece is recorded with how many of its transaction's
//!   messages are done, and a restart skips those: the slot can only be
//!   confirmed at the commit.
//! - **Acknowledged progress is kept.** A relay stopping in the middle of a
//!   window hands what it did not publish to the table and records the
//!   window; a window whose record fails remembers what JetStream
//!   acknowledged and skips it when read again.
//! - **Only what the synchronous standbys have.** With
//!   `synchronous_standby_names` set, a window waits until every
//!   synchronous physical standby of the server the slot streams from has
//!   flushed its transactions: a failover never loses a transaction whose
//!   events went out.
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
//!
//! # Layout
//! - `connection`: the replication connection, made from `database_url` and
//!   the environment as libpq makes one (the slot's name, creation, checks
//!   and dropping are `service::wal::slot`'s).
//! - `reader`: windows of committed transactions (and pieces of large ones)
//!   read from the stream, and confirming positions.
//! - `gate`: windows held until the synchronous standbys have them.
//! - `publish`: a window's events published in chains per ordering key, and
//!   what is handed to the table.
//! - `record`: what a published window leaves in the database (the
//!   statements, like the slot's, are `service::wal`'s).
//! - here: the relay's sessions, their backoff and metrics.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use chrono::Utc;
use pgwire_replication::{PgWireError, ReplicationClient, ReplicationConfig};
use sea_orm::{DatabaseConnection, DbErr};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use service::wal::relay::UNDECODABLE_CONSUMER;

/// WAL relay settings.
#[derive(Debug, Clone)]
pub struct WalRelayConfig {
    /// The database, as `database_url` names it (the replication connection
    /// uses its host, port, user, password, database and `sslmode`).
    pub database_url: String,
    /// The logical replication slot (and publication) name.
    pub slot: String,
    /// Events per window, rounded up to whole seawall messages (a window
    /// also goes once it holds 16 MiB of payloads); a larger transaction
    /// goes in pieces of this size.
    pub window: usize,
    /// How often a standby tries to take the slot over.
    pub standby_retry: Duration,
    /// How long NATS may stay unreachable before the relay hands windows
    /// to the outbox table instead of retrying them in place: a window
    /// retried in place holds the slot, which retains all of the database's
    /// WAL meanwhile (a full disk, or a slot lost to
    /// `max_slot_wal_keep_size`); handed over, the slot moves on and the
    /// table relay publishes them once NATS is back, in key order.
    pub handoff_after: Duration,
    /// How long PostgreSQL waits on a silent holder (frozen, or cut off)
    /// before it ends that session and a standby can take the slot: the
    /// relay sets its own `wal_sender_timeout` to it, so the takeover fits
    /// the duplicate window as the table relay's lease does (start-up
    /// checks the window against `relay_lease_ms`), whatever the server's
    /// default (60 s, or 0: never).
    pub holder_timeout: Duration,
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
    /// The slot cannot be used, created or dropped.
    #[error(transparent)]
    Slot(#[from] SlotError),
    /// `database_url` cannot be turned into a replication connection.
    #[error("database_url cannot be used for the replication connection: {0}")]
    Url(String),
    /// Another relay holds the slot: this one is a standby.
    #[error("replication slot {0:?} is held by another relay")]
    Standby(String),
    /// Another relay session took the slot over (this one was frozen past
    /// `wal_sender_timeout`, or lost its connection): this one stops
    /// publishing and records nothing more.
    #[error("another WAL relay took replication slot {0:?} over")]
    Fenced(String),
    /// The durable position moved while the session started (the session
    /// it took over from recorded a window meanwhile).
    #[error("the WAL relay's position moved while its session started; starting again from it")]
    Moved,
    /// The pool reached a server on which the session's replication
    /// connection does not hold the slot (a failover behind a proxy): its
    /// standbys say nothing about the windows read from the old server.
    #[error(
        "the WAL relay's database connections reach a server its replication connection for slot {0:?} does not stream from; starting the session again"
    )]
    Elsewhere(String),
    /// The relay's own walsender is a synchronous standby: commits wait for
    /// the relay, whose gate waits for a physical standby they no longer
    /// wait for, so every event-writing commit would hang.
    #[error(
        "the WAL relay's replication connection for slot {slot:?} is a synchronous standby (synchronous_standby_names = '{names}' matches its application_name): commits would wait for the relay, which waits for a physical standby"
    )]
    SynchronousStandby {
        /// The relay's slot.
        slot: String,
        /// `synchronous_standby_names` as it was.
        names: String,
    },
    /// The relay was asked to stop before a window was published.
    #[error("the WAL relay stopped before its window was published")]
    Stopped,
    /// A database statement failed.
    #[error("WAL relay database error: {0}")]
    Database(#[from] DbErr),
    /// The replication stream failed.
    #[error("WAL relay replication stream: {0}")]
    Replication(#[from] PgWireError),
    /// The slot did not exist when the session started streaming (dropped
    /// by hand meanwhile): it is made again, its loss recorded.
    #[error(
        "the WAL slot {0:?} does not exist (it was dropped while the relay reconnected); it is made again (a loss, if the relay had recorded a position in it, is logged and recorded with it)"
    )]
    SlotGone(String),
    /// Nothing came from the server for this long and the server, asked
    /// through the pool, had no walsender for the session (or did not
    /// answer), or the connection did not open in it: the peer is taken
    /// for gone rather than waited on until TCP gives up, minutes later.
    #[error(
        "the WAL relay's replication connection was silent for {0:?} and the server has no walsender for it: taken for lost"
    )]
    Silent(Duration),
}

mod ahead;
mod aside;
mod connection;
mod gate;
mod outage;
mod publish;
mod reader;
mod record;
mod slot;

pub use connection::default_slot_name;
pub use service::wal::slot::{SlotError, SlotLoss, drop_slot, valid_slot_name};

pub use slot::{prepare, settled_slot};

use connection::replication_config;
use reader::{Reader, Window, ended};

/// Relays the outbox from the WAL.
pub struct WalRelay {
    db: DatabaseConnection,
    js: jetstream::Context,
    config: WalRelayConfig,
    /// Set when a session relays a window: the reconnect backoff starts over.
    held: std::sync::atomic::AtomicBool,
    /// Message ids JetStream acknowledged in windows that could not be
    /// recorded: the next reading of such a window skips them.
    unrecorded: std::sync::Mutex<HashSet<String>>,
    /// Why the relay is off while it is (it stepped aside as a synchronous
    /// standby), for `/readyz`.
    problem: Arc<std::sync::Mutex<Option<String>>>,
    /// Since when NATS has been unreachable, while it is.
    outage: outage::Outage,
}

impl WalRelay {
    /// A relay of `config.slot` on `db` (which [`prepare`] checked) into `js`.
    pub fn new(db: DatabaseConnection, js: jetstream::Context, config: WalRelayConfig) -> Self {
        Self {
            db,
            js,
            config,
            held: std::sync::atomic::AtomicBool::new(false),
            unrecorded: std::sync::Mutex::default(),
            problem: Arc::default(),
            outage: outage::Outage::default(),
        }
    }

    /// Reads the slot while this relay holds it, and waits as a standby
    /// while another does, until `cancel` fires. Lost streams and database
    /// trouble are logged and retried with backoff; it never gives up.
    pub async fn run(&self, cancel: CancellationToken) {
        let mut failures = 0u32;
        // Times in a row the session stepped aside as a synchronous standby.
        let mut asides = 0u32;
        let mut standby_logged = false;
        // Present from the start: `increase()` sees the first recreation
        // only against an earlier 0.
        metrics::counter!("seawall_wal_slot_recreated_total").increment(0);
        crate::relay::register_lag();
        while !cancel.is_cancelled() {
            let ended = self.session(&cancel).await;
            if cancel.is_cancelled() {
                break;
            }
            let wait = match ended {
                Ok(()) => break,
                Err(WalError::SynchronousStandby { slot, names }) => {
                    metrics::gauge!("seawall_wal_relay_active").set(0.0);
                    if self.held.swap(false, std::sync::atomic::Ordering::Relaxed) {
                        asides = 0;
                    }
                    let pause = service::Backoff::new(self.config.standby_retry, aside::ASIDE_MAX)
                        .delay(asides);
                    asides = asides.saturating_add(1);
                    tracing::debug!(%slot, ?pause, "the WAL relay stays aside");
                    self.step_aside(&names, pause, &cancel).await;
                    Duration::ZERO
                }
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
                    if let WalError::Replication(e) = &err
                        && server_sqlstate(e) == Some(UNDEFINED_OBJECT)
                    {
                        tracing::error!(slot = %self.config.slot, error = %err, "the WAL slot cannot decode a change committed while its publication did not exist (it was dropped, or the slot was made before it by a seawall older than this one), and never will: `seawall relay --drop-slot` and start again; events written since the slot's last confirmed position are not relayed");
                    }
                    tracing::warn!(error = %err, "WAL relay session ended; reconnecting");
                    // The slot may be what failed: dropped, or invalidated
                    // under running writers (PostgreSQL then refuses to
                    // decode from it for good). Made again here, whatever
                    // the error's wording.
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        checked = prepare(&self.db, &self.config.slot) => {
                            if let Err(err) = checked {
                                tracing::warn!(error = %err, "could not check the WAL slot");
                            }
                        }
                    }
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
    /// `cancel` fires or the stream fails, or until the session's walsender
    /// turns out to be a synchronous standby.
    async fn session(&self, cancel: &CancellationToken) -> Result<(), WalError> {
        let (config, application) = self.session_config()?;
        // The slot itself may be behind after a PostgreSQL crash: start
        // where this relay durably got to, so what it published before is
        // skipped by the server instead of published again.
        let position = self.position().await?;
        let client = self.stream_from(config, position.lsn).await?;
        // Watched from the first statement on: the session's own records
        // are commits too, and would wait for this very connection. Chosen,
        // the session lets the connection go at once (so PostgreSQL picks
        // another standby and those commits return), and ends once the
        // window in hand is published and recorded: nothing acknowledged
        // is left unrecorded.
        let aside = cancel.child_token();
        let hold = self.hold(client, position, &application, cancel, &aside);
        tokio::pin!(hold);
        tokio::select! {
            held = &mut hold => held,
            names = self.until_synchronous() => {
                aside.cancel();
                let slot = self.config.slot.clone();
                self.announce_aside(&slot, &names);
                if let Err(err) = hold.await {
                    tracing::debug!(error = %err, "the WAL session stepping aside ended with an error");
                }
                Err(WalError::SynchronousStandby { slot, names })
            }
        }
    }

    /// The session once streaming: records its take-over, then relays
    /// windows. A reader task assembles the next window while this one is
    /// published; positions go back to it to be confirmed. `aside` (a child
    /// of `cancel`) closes the replication connection and ends the session
    /// between windows; `cancel` also hands what a window did not get to
    /// to the table.
    async fn hold(
        &self,
        client: ReplicationClient,
        position: service::wal::relay::Position,
        application: &str,
        cancel: &CancellationToken,
        aside: &CancellationToken,
    ) -> Result<(), WalError> {
        // Its commit waits for the synchronous standby, which may be this
        // very connection: dropped, nothing was published yet.
        let fence = tokio::select! {
            fence = self.take_over() => fence?,
            () = aside.cancelled() => return Ok(()),
        };
        // A session fenced off only now may have recorded a piece since the
        // position was read: start again from where it got to.
        if self.position().await? != position {
            return Err(WalError::Moved);
        }
        tracing::info!(slot = %self.config.slot, "WAL relay holds the slot");
        metrics::gauge!("seawall_wal_relay_active").set(1.0);
        let stop = aside.child_token();
        // Whichever way the session ends, the reader stops and lets the slot go.
        let _stop_reader = stop.clone().drop_guard();
        let (mut next, confirm) = self.start_reader(client, position, application, stop);
        self.warn_if_at_risk().await;
        let mut checked = std::time::Instant::now();
        let mut gate = gate::Gate::new(&self.config.slot, application);
        // As often as PostgreSQL hears from a healthy relay at the least.
        let mut keepalive = reader::Keepalives::every(self.config.holder_timeout);
        loop {
            if checked.elapsed() >= slot::RESERVE_CHECK {
                self.warn_if_at_risk().await;
                checked = std::time::Instant::now();
            }
            let started = std::time::Instant::now();
            let window = tokio::select! {
                // A stopping reader ends its stream too; stopping comes first.
                biased;
                () = aside.cancelled() => break,
                window = next.recv() => window.ok_or_else(ended)??,
            };
            // Recorded before confirmed, as every position: at a pace, and
            // never while the record would wait for a stalled synchronous
            // standby (the windows with events behind it would wait too).
            if window.only_moves()
                && !(keepalive.due() && gate.caught_up(&self.db, &window).await?)
            {
                continue;
            }
            if !gate.wait(&self.db, &window, aside).await? {
                break;
            }
            let waited = started.elapsed();
            self.relay_window(&window, &fence, cancel).await?;
            // A session that relays a window starts the reconnect backoff
            // over; one that fails before (a slot it cannot decode) backs
            // off further each time.
            self.held.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(
                events = window.events.len(),
                wait_ms = waited.as_secs_f64() * 1e3,
                publish_ms = (started.elapsed() - waited).as_secs_f64() * 1e3,
                "WAL window"
            );
            if let Some(end) = window.end {
                let _ = confirm.send(end);
            }
            update_lag_metrics(&window);
        }
        Ok(())
    }

    /// Starts the session's reader on `client` (until `stop`): the windows
    /// it reads come out of the receiver, and positions sent back into the
    /// sender are confirmed.
    fn start_reader(
        &self,
        client: ReplicationClient,
        position: service::wal::relay::Position,
        application: &str,
        stop: CancellationToken,
    ) -> (
        mpsc::Receiver<Result<Window, WalError>>,
        mpsc::UnboundedSender<pgwire_replication::Lsn>,
    ) {
        let (windows, next) = mpsc::channel(1);
        let (confirm, confirms) = mpsc::unbounded_channel();
        let reader = Reader {
            ahead: ahead::start(client, confirms, stop.clone()),
            silence: self.silence(),
            db: self.db.clone(),
            application: application.to_owned(),
            size: self.config.window,
            resume: position.partial,
            open: None,
        };
        tokio::spawn(reader.run(windows, stop));
        (next, confirm)
    }

    /// The replication connection's settings for one session, and the
    /// name it goes by on the server: the gate finds the slot's holder by
    /// that name, so no other session may share it.
    fn session_config(&self) -> Result<(ReplicationConfig, String), WalError> {
        let mut config = replication_config(
            &self.config.database_url,
            &self.config.slot,
            self.config.holder_timeout,
        )?;
        // Named for this session alone: the gate finds the slot's holder by it.
        let application = format!(
            "seawall-relay {} {:x}",
            std::process::id(),
            super::rand_suffix()
        );
        config = config.with_application_name(application.clone());
        Ok((config, application))
    }

    /// Starts streaming the slot from `start`, or from where the slot is.
    /// The server lets one session stream from a slot at a time, so its
    /// refusal is how this relay learns it is a standby
    /// ([`WalError::Standby`]).
    async fn stream_from(
        &self,
        mut config: ReplicationConfig,
        start: Option<u64>,
    ) -> Result<ReplicationClient, WalError> {
        if let Some(lsn) = start {
            config = config.with_start_lsn(pgwire_replication::Lsn(lsn));
        }
        // A server that vanished answers nothing, not even a refusal: the
        // opening is bounded like the stream's silences.
        let opening = async {
            let mut client = ReplicationClient::connect_gated(config).await?;
            client.start().await?;
            client.wait_started().await.map(|()| client)
        };
        match tokio::time::timeout(self.silence(), opening).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(err)) if server_sqlstate(&err) == Some(OBJECT_IN_USE) => {
                Err(WalError::Standby(self.config.slot.clone()))
            }
            // At the opening, `undefined_object` is the slot itself; while
            // streaming, it is a publication missing at decoding time.
            Ok(Err(err)) if server_sqlstate(&err) == Some(UNDEFINED_OBJECT) => {
                Err(WalError::SlotGone(self.config.slot.clone()))
            }
            Ok(Err(err)) => Err(err.into()),
            Err(_) => Err(WalError::Silent(self.silence())),
        }
    }
}

/// Updates the lag and heartbeat metrics once a window is relayed: the
/// dashboard shows how old events are when they go out, how old the last
/// relayed commit is, and that the relay is alive.
fn update_lag_metrics(window: &Window) {
    let now = Utc::now();
    for event in &window.events {
        let lag = (now - event.created_at)
            .num_microseconds()
            .unwrap_or(0)
            .max(0);
        metrics::histogram!("seawall_relay_lag_seconds").record(lag as f64 / 1e6);
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

impl WalRelay {
    /// How long the replication stream may stay silent (and a connection
    /// take to open) before the relay asks whether the server still
    /// streams to it: twice `holder_timeout`, the time PostgreSQL itself
    /// gives a silent relay, and at least a second.
    fn silence(&self) -> Duration {
        (self.config.holder_timeout * 2).max(Duration::from_secs(1))
    }
}

/// SQLSTATE `object_in_use`: another session streams from the slot.
const OBJECT_IN_USE: &str = "55006";

/// SQLSTATE `undefined_object`: decoding met a change it must look the
/// slot's publication up for, and the publication did not exist then.
const UNDEFINED_OBJECT: &str = "42704";

/// The SQLSTATE of an error the server sent on the replication connection
/// (which pgwire-replication appends to its text as `(SQLSTATE xxxxx)`):
/// errors are told apart by it, not by their wording, which follows the
/// server's `lc_messages`.
fn server_sqlstate(err: &PgWireError) -> Option<&str> {
    let PgWireError::Server(text) = err else {
        return None;
    };
    let code = text.strip_suffix(')')?.rsplit_once("(SQLSTATE ")?.1;
    (code.len() == 5 && code.bytes().all(|b| b.is_ascii_alphanumeric())).then_some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_are_told_apart_by_their_sqlstate() {
        let server = |text: &str| PgWireError::Server(text.into());
        let in_use = server("le slot « s » est actif pour le PID 7 (SQLSTATE 55006)");
        assert_eq!(server_sqlstate(&in_use), Some(OBJECT_IN_USE));
        assert_eq!(server_sqlstate(&server("no code")), None);
        assert_eq!(server_sqlstate(&server("odd (SQLSTATE 5)")), None);
        let io = PgWireError::Protocol("(SQLSTATE 55006)".into());
        assert_eq!(server_sqlstate(&io), None);
    }
}
