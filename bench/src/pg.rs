//! The PostgreSQL server the scenarios measure on.

use anyhow::{Context, Result};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};

use migration::MigratorTrait;

/// A PostgreSQL server (a URL without a database name) on which every
/// measurement gets a database of its own, so that no run sees another's
/// rows. It remembers the databases it created and drops them when the run
/// ends ([`PgServer::drop_created`]), so repeated runs (a million-row `api`
/// run among them) do not fill the disk.
#[derive(Debug)]
pub struct PgServer {
    url: String,
    created: Vec<String>,
}

impl PgServer {
    /// The server at `url` (`postgres://user@host:port`, no database name).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            created: Vec::new(),
        }
    }

    async fn admin(&self) -> Result<DatabaseConnection> {
        sea_orm::Database::connect(format!("{}/postgres", self.url))
            .await
            .with_context(|| {
                format!(
                    "connecting to PostgreSQL at {} (start it with scripts/services start pg, or pass --pg-url)",
                    self.url
                )
            })
    }

    /// Creates a fresh database named after `scenario`, applies the
    /// migrations and returns a pool on it with its URL (for a process the
    /// scenario starts).
    ///
    /// # Errors
    /// When the server cannot be reached, refuses `CREATE DATABASE`, or the
    /// migrations fail.
    pub async fn fresh(&mut self, scenario: &str) -> Result<(DatabaseConnection, String)> {
        let name = format!("bench_{scenario}_{}", uuid::Uuid::now_v7().simple());
        let admin = self.admin().await?;
        admin
            .execute_raw(Statement::from_string(
                DbBackend::Postgres,
                format!("CREATE DATABASE {name}"),
            ))
            .await
            .with_context(|| format!("creating the database {name}"))?;
        admin.close().await?;
        self.created.push(name.clone());
        let url = format!("{}/{name}", self.url);
        let db = service::db::connect(&url, 32).await?;
        migration::Migrator::up(&db, None)
            .await
            .with_context(|| format!("migrating {name}"))?;
        testkit::ledger::create_tables(&db)
            .await
            .with_context(|| format!("creating the ledger's tables in {name}"))?;
        Ok((db, url))
    }

    /// Drops every database this run created, whether or not the scenario
    /// succeeded. A failure only leaves them behind (logged): the figures,
    /// or the error that ended the run, matter more than the clean-up.
    pub async fn drop_created(self) {
        if self.created.is_empty() {
            return;
        }
        let admin = match self.admin().await {
            Ok(admin) => admin,
            Err(err) => {
                tracing::warn!(error = %format!("{err:#}"), "could not drop the benchmark databases");
                return;
            }
        };
        for name in &self.created {
            // A database with a replication slot cannot be dropped.
            let slots = format!(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '{name}' AND NOT active"
            );
            let _ = admin
                .execute_raw(Statement::from_string(DbBackend::Postgres, slots))
                .await;
            let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            if let Err(err) = admin
                .execute_raw(Statement::from_string(DbBackend::Postgres, sql))
                .await
            {
                tracing::warn!(database = %name, error = %err, "could not drop a benchmark database");
            }
        }
        let _ = admin.close().await;
    }
}

/// The server's version and durability settings, for the report's versions
/// line: figures taken with `fsync` or `synchronous_commit` off say nothing
/// about a server that flushes its WAL at every commit. The line also says
/// what one commit's flush costs on this server's disk ([`flush_wait_ms`]):
/// group commit saves flushes, and what it buys follows their price.
///
/// # Errors
/// When the query fails.
pub async fn version(db: &DatabaseConnection) -> Result<String> {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT format('%s (fsync %s, synchronous_commit %s, full_page_writes %s)', \
                 current_setting('server_version'), current_setting('fsync'), \
                 current_setting('synchronous_commit'), current_setting('full_page_writes')) \
                 AS server_version",
        ))
        .await?
        .context("no version row")?;
    let version = row.try_get::<String>("", "server_version")?;
    let wait = flush_wait_ms(db).await?;
    Ok(format!(
        "{version}, a commit's WAL flush {wait:.3} ms ({FLUSH_PROBES} one-row commits with synchronous_commit on against off)"
    ))
}

/// How many one-row commits each half of [`flush_wait_ms`] times.
const FLUSH_PROBES: u32 = 500;

/// The time a commit spends waiting for its WAL flush on this server: the
/// mean of [`FLUSH_PROBES`] one-row commits with `synchronous_commit` on
/// minus the same with it off (same statements, same round trips). About
/// 0.05 ms on a local disk whose cache absorbs flushes, 1-2 ms on network
/// block storage; 0 on a server with `fsync` off.
///
/// # Errors
/// When a statement fails.
pub async fn flush_wait_ms(db: &DatabaseConnection) -> Result<f64> {
    use sea_orm::TransactionTrait;
    db.execute_unprepared("CREATE TABLE IF NOT EXISTS bench_flush_probe (n int)")
        .await
        .context("creating the flush probe's table")?;
    let mut means = [0.0; 2];
    for (mean, setting) in means.iter_mut().zip(["on", "off"]) {
        let started = std::time::Instant::now();
        for n in 0..FLUSH_PROBES {
            let txn = db.begin().await?;
            txn.execute_unprepared(&format!(
                "SET LOCAL synchronous_commit = {setting}; INSERT INTO bench_flush_probe VALUES ({n})"
            ))
            .await?;
            txn.commit().await?;
        }
        *mean = started.elapsed().as_secs_f64() * 1e3 / f64::from(FLUSH_PROBES);
    }
    db.execute_unprepared("DROP TABLE bench_flush_probe")
        .await
        .context("dropping the flush probe's table")?;
    Ok((means[0] - means[1]).max(0.0))
}
