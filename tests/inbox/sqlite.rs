//! How SQLite connections are opened: durable commits by default, and no
//! connection that SQLite opened read-only kept in the pool.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use service::db::{SqliteOptions, SqliteSync};

use crate::support::{Backend, TestDb};

async fn synchronous(db: &DatabaseConnection) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Sqlite,
            "PRAGMA synchronous",
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

/// `PRAGMA synchronous` on connections the pool hands out: 2 is FULL, 1
/// NORMAL. Several at once, so more than the first connection is read.
#[tokio::test]
async fn commits_are_synced_unless_normal_is_chosen() {
    let t = TestDb::new(Backend::Sqlite).await;
    let full = service::db::connect(&t.url, 4).await.unwrap();
    let normal = service::db::connect_with(
        &t.url,
        4,
        SqliteOptions {
            synchronous: SqliteSync::Normal,
            ..SqliteOptions::default()
        },
    )
    .await
    .unwrap();
    let (a, b, c) = tokio::join!(synchronous(&full), synchronous(&full), synchronous(&full));
    assert_eq!((a, b, c), (2, 2, 2), "FULL by default");
    assert_eq!(synchronous(&normal).await, 1, "NORMAL when chosen");
}

/// A file that cannot be written when a connection opens: SQLite would
/// open it read-only, for good; the pool refuses it instead, as an outage,
/// and opens a writable one once the file is writable again.
#[tokio::test]
async fn a_connection_opened_while_the_file_is_read_only_is_refused() {
    let t = TestDb::new(Backend::Sqlite).await;
    let path = t
        .url
        .trim_start_matches("sqlite://")
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let chattr = |flag: &str| {
        let status = std::process::Command::new("chattr")
            .args([flag, &path])
            .status()
            .expect("chattr");
        assert!(status.success(), "chattr {flag} {path}");
    };
    chattr("+i");
    let mut opts = service::db::options(&t.url, 1, SqliteOptions::default());
    opts.acquire_timeout(std::time::Duration::from_secs(2));
    let refused = sea_orm::Database::connect(opts).await;
    chattr("-i");
    let err = refused.expect_err("a read-only connection is refused");
    assert!(service::classify::is_outage(&err), "{err}");
    let db = service::db::connect(&t.url, 1).await.unwrap();
    db.execute_unprepared("CREATE TABLE written (x INTEGER)")
        .await
        .unwrap();
}
