//! Applying this release's pending migrations, one process at a time, and
//! tolerating a database that a newer release has migrated further (see
//! [`crate::status`]).
//!
//! sea-orm-migration's `Migrator::up` refuses a database that holds a
//! migration it does not know ("its file is missing"), which stops the
//! previous release during a rolling upgrade and after a rollback. So the
//! pending migrations are applied here, each recorded in sea-orm-migration's
//! own table (`seaql_migrations`, same rows), and unknown ones are only
//! reported.
//!
//! One at a time, per backend:
//! - PostgreSQL: the whole run in one transaction behind a
//!   transaction-scoped advisory lock. DDL is transactional there, so a run
//!   that fails or is interrupted (SIGTERM, a lost connection) leaves
//!   nothing half-done.
//! - SQLite: one `BEGIN IMMEDIATE` transaction, which holds the database's
//!   write lock; also all-or-nothing.
//! - MySQL/MariaDB: DDL commits implicitly and cannot roll back, so the run
//!   holds a named lock (`GET_LOCK`) on a connection of its own for its
//!   whole length (a session lock, released when that connection closes,
//!   however the run ends), and every step of every migration is written to
//!   apply again after an interruption.

use std::time::{SystemTime, UNIX_EPOCH};

use sea_orm_migration::sea_orm::{
    ActiveValue, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, RuntimeErr,
    SqliteTransactionMode, SqlxMySqlConnector, Statement, TransactionOptions, TransactionTrait,
    sqlx,
};
use sea_orm_migration::{MigratorTrait, SchemaManager, seaql_migrations};

use crate::Migrator;
use crate::status::{Status, known, recorded};

/// Key of the PostgreSQL advisory lock [`apply`] holds ("seawall" in hex-ish).
pub const POSTGRES_MIGRATION_LOCK: i64 = 0x5EA_3A11;

/// The name of the MySQL/MariaDB lock [`apply`] holds (`GET_LOCK`), as an
/// SQL expression: one lock per database, since a named lock is the whole
/// server's (another service's migration on the same server must not hold
/// this one up), within MySQL's 64 characters whatever the database's name.
pub const MYSQL_MIGRATION_LOCK: &str =
    "CONCAT('seawall_migrate_', LEFT(SHA2(DATABASE(), 256), 40))";

/// Applies the pending migrations, one process at a time, and says what
/// the database holds afterwards (including migrations unknown to this
/// release, which are left alone).
///
/// # Errors
/// The first failing statement's error.
pub async fn apply(db: &DatabaseConnection) -> Result<Status, DbErr> {
    match db.get_database_backend() {
        DbBackend::Postgres => {
            let txn = db.begin().await?;
            txn.execute_unprepared(&format!(
                "SELECT pg_advisory_xact_lock({POSTGRES_MIGRATION_LOCK})"
            ))
            .await?;
            // A migration that waits for a table's lock (a long transaction
            // holding it) queues every other session's access to that table
            // behind it: give up after a few seconds instead, as a lock
            // timeout, which start-up retries (`seawall::app::wait_out_database`).
            txn.execute_unprepared("SET LOCAL lock_timeout = '5s'")
                .await?;
            let status = run_pending(&SchemaManager::new(&txn), Lock::Transaction).await?;
            txn.commit().await?;
            Ok(status)
        }
        DbBackend::Sqlite => {
            let txn = db
                .begin_with_options(TransactionOptions {
                    sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
                    ..TransactionOptions::default()
                })
                .await?;
            let status = run_pending(&SchemaManager::new(&txn), Lock::Transaction).await?;
            txn.commit().await?;
            Ok(status)
        }
        _ => {
            let single = one_connection(db).await?;
            let status = under_named_lock(&single).await;
            // Closing the connection releases the lock, whatever happened.
            single.close().await?;
            status
        }
    }
}

/// A pool of exactly one connection to `db`'s MySQL server: a named lock
/// belongs to a session, so the lock and every migration must use the same
/// connection, and that connection must close (not go back to a pool)
/// when the run ends, or is dropped half-way. The pool never replaces it
/// on its own (no lifetime, no idle limit, no test before use): a
/// replacement would run the next migration without the lock. A
/// connection that breaks fails the run instead.
async fn one_connection(db: &DatabaseConnection) -> Result<DatabaseConnection, DbErr> {
    let options = db.get_mysql_connection_pool().connect_options();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .test_before_acquire(false)
        .connect_with((*options).clone())
        .await
        .map_err(|err| DbErr::Conn(RuntimeErr::SqlxError(err.into())))?;
    Ok(SqlxMySqlConnector::from_sqlx_mysql_pool(pool))
}

/// How long a MySQL migration statement waits for a table's metadata lock
/// (a transaction of the running release holding it) before it gives up,
/// as PostgreSQL's `lock_timeout` below: a DDL statement waiting for it
/// queues every later query on that table behind it. Start-up and
/// `seawall migrate` retry the run (`seawall::app::wait_out_database`).
const MYSQL_LOCK_WAIT_TIMEOUT_S: u32 = 5;

/// How long [`under_named_lock`] waits for another migrator, in seconds: a
/// year, i.e. as long as it holds the lock (MySQL reads a negative wait as
/// "for ever", MariaDB answers it with NULL).
const MYSQL_LOCK_WAIT_S: u32 = 365 * 24 * 3600;

/// Takes [`MYSQL_MIGRATION_LOCK`] (waiting as long as another migrator
/// holds it, as PostgreSQL's advisory lock does), runs the pending
/// migrations and lets the lock go.
async fn under_named_lock(db: &DatabaseConnection) -> Result<Status, DbErr> {
    db.execute_unprepared(&format!(
        "SET SESSION lock_wait_timeout = {MYSQL_LOCK_WAIT_TIMEOUT_S}"
    ))
    .await?;
    let taken = mysql_flag(
        db,
        &format!("GET_LOCK({MYSQL_MIGRATION_LOCK}, {MYSQL_LOCK_WAIT_S})"),
    )
    .await?;
    if taken != Some(1) {
        return Err(DbErr::Migration(format!(
            "the migration lock could not be taken (GET_LOCK answered {taken:?})"
        )));
    }
    let status = run_pending(&SchemaManager::new(db), Lock::Session).await?;
    let released = mysql_flag(db, &format!("RELEASE_LOCK({MYSQL_MIGRATION_LOCK})")).await?;
    if released != Some(1) {
        return Err(lock_lost());
    }
    Ok(status)
}

/// The integer a MySQL expression answers (`NULL` as `None`).
async fn mysql_flag<C: ConnectionTrait>(db: &C, expression: &str) -> Result<Option<i64>, DbErr> {
    Ok(db
        .query_one_raw(Statement::from_string(
            DbBackend::MySql,
            format!("SELECT {expression} AS flag"),
        ))
        .await?
        .and_then(|row| row.try_get::<Option<i64>>("", "flag").ok().flatten()))
}

/// Checks that this session still holds the MySQL migration lock: a
/// session that lost it (its connection replaced) must not go on
/// migrating beside another migrator.
async fn still_held<C: ConnectionTrait>(db: &C) -> Result<(), DbErr> {
    let held = mysql_flag(
        db,
        &format!("IS_USED_LOCK({MYSQL_MIGRATION_LOCK}) = CONNECTION_ID()"),
    )
    .await?;
    if held == Some(1) {
        Ok(())
    } else {
        Err(lock_lost())
    }
}

fn lock_lost() -> DbErr {
    DbErr::Migration(
        "this migrator no longer holds the migration lock (its connection was replaced); stopped, run it again".into(),
    )
}

/// What keeps a run the only one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lock {
    /// The run's transaction (PostgreSQL's advisory lock, SQLite's write
    /// lock): it cannot be lost without the run failing.
    Transaction,
    /// A MySQL session's named lock, checked before each step.
    Session,
}

/// Applies, in order, each of this release's migrations the database has
/// not recorded, recording each as it is applied.
async fn run_pending(manager: &SchemaManager<'_>, lock: Lock) -> Result<Status, DbErr> {
    let db = manager.get_connection();
    Migrator::install(db).await?;
    let mut done = recorded(db).await?;
    for migration in Migrator::migrations() {
        let name = migration.name().to_owned();
        if done.contains(&name) {
            continue;
        }
        tracing::info!(migration = %name, "applying migration");
        if lock == Lock::Session {
            still_held(db).await?;
        }
        migration.up(manager).await?;
        if lock == Lock::Session {
            still_held(db).await?;
        }
        record(db, &name).await?;
        done.insert(name);
    }
    Ok(Status::of(&known(), &done))
}

/// Records `name` as sea-orm-migration does (its table, applied at the
/// Unix time in seconds), so its tools read the same history.
async fn record<C: ConnectionTrait>(db: &C, name: &str) -> Result<(), DbErr> {
    let applied_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    seaql_migrations::Entity::insert(seaql_migrations::ActiveModel {
        version: ActiveValue::Set(name.to_owned()),
        applied_at: ActiveValue::Set(applied_at),
    })
    .exec(db)
    .await?;
    Ok(())
}
