//! A fresh database per test on a real server or file.
//!
//! PostgreSQL and MariaDB come from `scripts/services` (started by
//! `scripts/test`), which exports their URLs; each test creates its own
//! database there, so tests run in parallel without seeing each other.

use migration::{Migrator, MigratorTrait};

use crate::ledger as domain;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, EntityTrait, PaginatorTrait, Statement,
};

/// The backends the suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    MySql,
}

/// A fresh, migrated database.
pub struct TestDb {
    pub backend: Backend,
    pub url: String,
    pub db: DatabaseConnection,
    _dir: Option<tempfile::TempDir>,
}

pub fn server_url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run the suite with `scripts/test`, which starts the database servers"
        )
    })
}

impl TestDb {
    /// Creates an empty database on `backend`, applies the migrations and
    /// creates the test domain's tables.
    pub async fn new(backend: Backend) -> Self {
        Self::migrated(Self::empty(backend).await).await
    }

    /// A database like [`TestDb::new`]'s on the Patroni cluster of
    /// `scripts/services start ha`, through HAProxy's read-write port.
    pub async fn on_ha_cluster() -> Self {
        Self::on_postgres(&server_url("SEAWALL_HA_PG_URL")).await
    }

    /// A database like [`TestDb::new`]'s on the PostgreSQL server at
    /// `base` (`postgres://user@host:port`), such as a test's own
    /// [`crate::postgres::PrivatePostgres`].
    pub async fn on_postgres(base: &str) -> Self {
        let (url, db) = create_postgres(base).await;
        Self::migrated(Self {
            backend: Backend::Postgres,
            url,
            db,
            _dir: None,
        })
        .await
    }

    async fn migrated(t: Self) -> Self {
        Migrator::up(&t.db, None).await.expect("migrations apply");
        domain::create_tables(&t.db)
            .await
            .expect("the test domain's tables");
        t
    }

    /// Creates an empty database on `backend`, without any table.
    pub async fn empty(backend: Backend) -> Self {
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let (url, dir) = match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}?mode=rwc", dir.path().join("test.db").display());
                (url, Some(dir))
            }
            Backend::Postgres => {
                let (url, db) = create_postgres(&server_url("SEAWALL_TEST_PG_URL")).await;
                return Self {
                    backend,
                    url,
                    db,
                    _dir: None,
                };
            }
            Backend::MySql => {
                let base = server_url("SEAWALL_TEST_MYSQL_URL");
                create_database(&base, DbBackend::MySql, &name).await;
                (format!("{base}/{name}"), None)
            }
        };
        let db = connect(&url, 20).await;
        Self {
            backend,
            url,
            db,
            _dir: dir,
        }
    }

    /// A migrated SQLite database in `dir`, a directory the caller owns (a
    /// small file system of the test's own, say, that it can fill).
    pub async fn sqlite_in(dir: &std::path::Path) -> Self {
        let url = format!("sqlite://{}?mode=rwc", dir.join("test.db").display());
        let db = connect(&url, 20).await;
        Self::migrated(Self {
            backend: Backend::Sqlite,
            url,
            db,
            _dir: None,
        })
        .await
    }

    /// Another, independent pool on the same database (a second "instance").
    pub async fn second_pool(&self) -> DatabaseConnection {
        connect(&self.url, 20).await
    }

    /// Counts rows of an entity.
    pub async fn count<E: EntityTrait>(&self, _entity: E) -> u64
    where
        E::Model: Send + Sync,
    {
        E::find().count(&self.db).await.expect("count")
    }
}

/// The number a PostgreSQL `SELECT count(*) ...` query `sql` returns.
pub async fn pg_count(db: &DatabaseConnection, sql: &str) -> i64 {
    db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .expect("count query")
        .expect("a row")
        .try_get_by_index::<i64>(0)
        .expect("a count")
}

/// Published events and processed messages in the stats' throughput
/// chart, each summed over its minutes.
pub async fn charted(db: &DatabaseConnection) -> (u64, u64) {
    let stats = service::stats::stats(db, chrono::Utc::now(), None)
        .await
        .expect("stats");
    stats
        .throughput
        .iter()
        .fold((0, 0), |(p, q), m| (p + m.published, q + m.processed))
}

pub async fn connect(url: &str, max: u32) -> DatabaseConnection {
    service::db::connect(url, max)
        .await
        .expect("connect to the test database")
}

/// A new database on the PostgreSQL server at `base`: its URL and a pool.
async fn create_postgres(base: &str) -> (String, DatabaseConnection) {
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    create_database(&format!("{base}/postgres"), DbBackend::Postgres, &name).await;
    let url = format!("{base}/{name}");
    let db = connect(&url, 20).await;
    (url, db)
}

async fn create_database(admin_url: &str, backend: DbBackend, name: &str) {
    let admin = sea_orm::Database::connect(admin_url)
        .await
        .expect("connect to the test server");
    admin
        .execute_raw(Statement::from_string(
            backend,
            format!("CREATE DATABASE {name}"),
        ))
        .await
        .expect("create test database");
    admin.close().await.ok();
}

/// Generates one `#[tokio::test]` per listed backend, calling `$body(Backend)`.
#[macro_export]
macro_rules! on_backends {
    ($name:ident: $($backend:ident),+) => {
        mod $name {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $backend() {
                    super::$name($crate::backend_named(stringify!($backend))).await;
                }
            )+
        }
    };
}

pub fn backend_named(name: &str) -> Backend {
    match name {
        "sqlite" => Backend::Sqlite,
        "postgres" => Backend::Postgres,
        "mysql" => Backend::MySql,
        other => panic!("unknown backend {other}"),
    }
}
