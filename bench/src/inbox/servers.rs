//! The databases the inbox scenario runs on besides PostgreSQL's: a MariaDB
//! or MySQL database of its own, SQLite files at either durability, and the
//! version lines that say how each makes a commit durable.

use std::path::Path;

use anyhow::{Context, Result};
use migration::MigratorTrait;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};

/// A database of the scenario's own on a MariaDB or MySQL server, migrated
/// and holding the ledger's tables; dropped by [`Scratch::drop_database`].
pub(super) struct Scratch {
    admin: DatabaseConnection,
    name: String,
    /// The database the rows are measured on.
    pub(super) db: DatabaseConnection,
}

impl Scratch {
    /// Creates it on the server at `base` (no database name).
    pub(super) async fn create(base: &str) -> Result<Self> {
        let name = format!("bench_inbox_{}", uuid::Uuid::now_v7().simple());
        let admin = service::db::connect(base, 1).await?;
        admin
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .with_context(|| format!("creating the database {name}"))?;
        let opened = async {
            let db = service::db::connect(&format!("{base}/{name}"), 32).await?;
            migration::Migrator::up(&db, None).await?;
            testkit::ledger::create_tables(&db).await?;
            anyhow::Ok(db)
        }
        .await;
        match opened {
            Ok(db) => Ok(Self { admin, name, db }),
            Err(err) => {
                // Not left behind when the set-up fails half-way.
                admin
                    .execute_unprepared(&format!("DROP DATABASE {name}"))
                    .await?;
                Err(err)
            }
        }
    }

    /// Closes it and drops it, whatever the measurement's outcome was.
    pub(super) async fn drop_database(self) -> Result<()> {
        self.db.close().await?;
        self.admin
            .execute_unprepared(&format!("DROP DATABASE {}", self.name))
            .await?;
        Ok(())
    }
}

/// A fresh SQLite file in `dir` at `synchronous`, migrated and holding the
/// ledger's tables.
pub(super) async fn sqlite(
    dir: &Path,
    synchronous: service::db::SqliteSync,
) -> Result<DatabaseConnection> {
    let file = dir.join(format!("bench-{synchronous:?}.db"));
    let sqlite = service::db::connect_with(
        &format!("sqlite://{}?mode=rwc", file.display()),
        16,
        service::db::SqliteOptions {
            synchronous,
            ..service::db::SqliteOptions::default()
        },
    )
    .await?;
    migration::Migrator::up(&sqlite, None).await?;
    testkit::ledger::create_tables(&sqlite).await?;
    Ok(sqlite)
}

/// The server's version and how it makes a commit durable: figures taken
/// without a log flush per commit say nothing about production.
pub(super) async fn mysql_version(db: &DatabaseConnection) -> Result<String> {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::MySql,
            "SELECT CONCAT(VERSION(), ' (innodb_flush_log_at_trx_commit ', \
             @@innodb_flush_log_at_trx_commit, ', innodb_doublewrite ', \
             @@innodb_doublewrite, ')') AS v",
        ))
        .await?
        .ok_or_else(|| anyhow::anyhow!("no version"))?;
    Ok(row.try_get::<String>("", "v")?)
}

/// The SQLite library's version, for the report's versions line.
pub(super) async fn sqlite_version(db: &DatabaseConnection) -> Result<String> {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Sqlite,
            "SELECT sqlite_version() AS v",
        ))
        .await?
        .ok_or_else(|| anyhow::anyhow!("no version"))?;
    Ok(row.try_get::<String>("", "v")?)
}
