//! Opening a database the way the inbox needs it.

use std::time::Duration;

use sea_orm::sqlx::sqlite::{SqliteConnection, SqliteJournalMode, SqliteSynchronous};
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

/// When SQLite makes a commit durable (its `synchronous` pragma, with WAL
/// journaling).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSync {
    /// The WAL is synced at every commit: a commit that returned, and so a
    /// message acked after it, survives an OS crash or a power cut.
    #[default]
    Full,
    /// The WAL is synced at checkpoints only: faster, and a power cut or an
    /// OS crash may roll back the last commits (a process crash does not).
    /// Their messages were acked, so they are lost.
    Normal,
}

/// How SQLite connections are opened (other engines ignore it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqliteOptions {
    /// See [`SQLITE_BUSY_TIMEOUT`].
    pub busy_timeout: Duration,
    /// See [`SqliteSync`].
    pub synchronous: SqliteSync,
    /// Whether the pool is for writing: a connection SQLite opened
    /// read-only is then refused (a pool only for reads takes it).
    pub writes: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            busy_timeout: SQLITE_BUSY_TIMEOUT,
            synchronous: SqliteSync::Full,
            writes: true,
        }
    }
}

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
    connect_with(url, max_connections, SqliteOptions::default()).await
}

/// [`connect`] with SQLite opened as `sqlite` says.
///
/// # Errors
/// The connection error.
pub async fn connect_with(
    url: &str,
    max_connections: u32,
    sqlite: SqliteOptions,
) -> Result<DatabaseConnection, DbErr> {
    Database::connect(options(url, max_connections, sqlite)).await
}

/// Connection options for [`connect_with`].
///
/// A SQLite file that is not writable when a connection opens (its
/// permissions changed, a read-only mount) gives a connection that stays
/// read-only after the file is writable again; such a connection is
/// refused as the outage it is (unless the pool is for reads only, or the
/// URL asked for `mode=ro`), so the pool never keeps one.
pub fn options(url: &str, max_connections: u32, sqlite: SqliteOptions) -> ConnectOptions {
    let mut opts = ConnectOptions::new(url.to_owned());
    let synchronous = match sqlite.synchronous {
        SqliteSync::Full => SqliteSynchronous::Full,
        SqliteSync::Normal => SqliteSynchronous::Normal,
    };
    let wants_writes = sqlite.writes
        && !url
            .split_once('?')
            .is_some_and(|(_, query)| query.split('&').any(|p| p == "mode=ro"));
    opts.max_connections(max_connections)
        .min_connections(1)
        // SeaORM hands sqlx one deadline for opening and for borrowing a
        // connection (a connect timeout would be overwritten by this).
        .acquire_timeout(Duration::from_secs(30))
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(move |o| {
            o.journal_mode(SqliteJournalMode::Wal)
                .synchronous(synchronous)
                .busy_timeout(sqlite.busy_timeout)
        })
        .map_sqlx_sqlite_pool_opts(move |pool| {
            let pool = pool.after_release(|conn, _| Box::pin(outside_any_transaction(conn)));
            if !wants_writes {
                return pool;
            }
            pool.after_connect(|conn, _| {
                Box::pin(async move {
                    if opened_read_only(conn).await? {
                        return Err(sea_orm::sqlx::Error::Io(std::io::Error::new(
                            std::io::ErrorKind::ReadOnlyFilesystem,
                            "the SQLite database file is not writable",
                        )));
                    }
                    Ok(())
                })
            })
        });
    opts
}

/// Whether a connection coming back to the pool is outside any transaction,
/// as SQLite and sqlx both see it; one that is not is closed instead of
/// kept.
///
/// SQLite rolls a transaction back by itself on some errors (a full disk,
/// an I/O error); the `ROLLBACK` that follows then fails ("no transaction
/// is active") and sqlx keeps counting the transaction as open. The next
/// transaction on that connection would become a savepoint inside it:
/// its writes "commit" by releasing the savepoint, but nothing ever
/// commits them, and a consumer would acknowledge messages whose effects
/// vanish when the connection closes. The check runs after the rollback
/// that dropping a failed transaction queues on the connection.
async fn outside_any_transaction(
    conn: &mut SqliteConnection,
) -> Result<bool, sea_orm::sqlx::Error> {
    let autocommit = {
        let mut handle = conn.lock_handle().await?;
        // SAFETY: the locked handle guarantees no other call runs on this
        // connection meanwhile.
        unsafe { libsqlite3_sys::sqlite3_get_autocommit(handle.as_raw_handle().as_ptr()) != 0 }
    };
    let counted_open = sea_orm::sqlx::Connection::is_in_transaction(conn);
    let clean = autocommit && !counted_open;
    if !clean {
        tracing::warn!(
            sqlite_in_transaction = !autocommit,
            sqlx_in_transaction = counted_open,
            "closing a SQLite connection left inside a transaction after an error"
        );
    }
    Ok(clean)
}

/// Whether SQLite opened this connection's main database read-only (it does
/// so, without an error, when the file is not writable).
async fn opened_read_only(conn: &mut SqliteConnection) -> Result<bool, sea_orm::sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    // SAFETY: the locked handle guarantees no other call runs on this
    // connection meanwhile, and the schema name is a NUL-terminated literal.
    let state = unsafe {
        libsqlite3_sys::sqlite3_db_readonly(handle.as_raw_handle().as_ptr(), c"main".as_ptr())
    };
    Ok(state == 1)
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
