//! Opening a database the way the inbox needs it.

use std::time::Duration;

use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr,
    SqliteTransactionMode, Statement, TransactionOptions,
};

/// Transaction options that take SQLite's write lock at `BEGIN` (waiting on
/// the busy timeout) instead of failing later on a read-to-write upgrade;
/// other backends ignore them.
pub const BEGIN_IMMEDIATE: TransactionOptions = TransactionOptions {
    isolation_level: None,
    access_mode: None,
    sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
};

/// How long a SQLite writer waits for another's lock before `SQLITE_BUSY`.
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to `url` (SQLite, PostgreSQL or MySQL).
///
/// SQLite is opened in WAL mode with a busy timeout so several connections,
/// and several processes, can share one file: readers do not block the
/// writer, and writers queue for the lock instead of failing at once. SeaORM
/// would otherwise use a single SQLite connection.
///
/// # Errors
/// The connection error.
pub async fn connect(url: &str, max_connections: u32) -> Result<DatabaseConnection, DbErr> {
    Database::connect(options(url, max_connections, SQLITE_BUSY_TIMEOUT)).await
}

/// Connection options for [`connect`], with the SQLite busy timeout given.
pub fn options(url: &str, max_connections: u32, busy_timeout: Duration) -> ConnectOptions {
    let mut opts = ConnectOptions::new(url.to_owned());
    opts.max_connections(max_connections)
        .min_connections(1)
        // SeaORM hands sqlx one deadline for opening and for borrowing a
        // connection (a connect timeout would be overwritten by this).
        .acquire_timeout(Duration::from_secs(30))
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(move |o| {
            o.journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(busy_timeout)
        });
    opts
}

/// Whether the database takes writes again. During a PostgreSQL failover a
/// proxy may route to a standby that answers a ping but refuses every write
/// (`25006`), so there the probe asks whether the server is in recovery.
///
/// # Errors
/// The database error (an outage, for the caller to wait out).
pub async fn accepts_writes(db: &DatabaseConnection) -> Result<bool, DbErr> {
    db.ping().await?;
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(true);
    }
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT pg_is_in_recovery() AS in_recovery",
        ))
        .await?;
    let in_recovery = match row {
        Some(row) => row.try_get::<bool>("", "in_recovery")?,
        None => false,
    };
    Ok(!in_recovery)
}
