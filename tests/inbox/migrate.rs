//! Several instances starting at once against a fresh database all migrate
//! it without tripping over each other (a deployment of three replicas does
//! exactly this); a migration applies again over its own half-done work; a
//! schema a newer release migrated further is not refused.

use sea_orm::{ConnectionTrait, Statement, TransactionTrait};

use migration::MigratorTrait;

use crate::on_backends;
use crate::support::{Backend, TestDb};

async fn instances_migrating_a_fresh_database_at_once_all_succeed(backend: Backend) {
    let t = TestDb::empty(backend).await;
    let mut pools = Vec::new();
    for _ in 0..4 {
        pools.push(t.second_pool().await);
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(pools.len()));
    let tasks: Vec<_> = pools
        .into_iter()
        .map(|db| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                migration::apply(&db).await.map(|_| ())
            })
        })
        .collect();
    for task in tasks {
        task.await
            .unwrap()
            .expect("every instance's migration succeeds");
    }
    let row =
        t.db.query_one_raw(Statement::from_string(
            t.db.get_database_backend(),
            "SELECT COUNT(*) AS n FROM seaql_migrations",
        ))
        .await
        .unwrap()
        .unwrap();
    let applied: i64 = row.try_get("", "n").unwrap();
    assert_eq!(applied as usize, migration::Migrator::migrations().len());
}
on_backends!(instances_migrating_a_fresh_database_at_once_all_succeed: sqlite, postgres, mysql);

/// On MySQL/MariaDB a migration's DDL commits statement by statement, so
/// one interrupted half-way (a SIGTERM, a lost connection) has applied its
/// first statements and is not recorded: the next run applies it again
/// from the start. Every statement must therefore find its own effect
/// already there and go on; the test runs each migration's `up` again on
/// a fully migrated database.
async fn every_migration_applies_again_over_its_own_effects(backend: Backend) {
    let t = TestDb::empty(backend).await;
    migration::apply(&t.db).await.unwrap();
    // In one transaction, as `apply` runs them (on MySQL the DDL commits
    // statement by statement all the same).
    let txn = t.db.begin().await.unwrap();
    let manager = migration::SchemaManager::new(&txn);
    for m in migration::Migrator::migrations() {
        m.up(&manager)
            .await
            .unwrap_or_else(|err| panic!("{} applied again: {err}", m.name()));
    }
    txn.commit().await.unwrap();
    let status = migration::status(&t.db).await.unwrap();
    assert!(
        status.pending.is_empty() && status.unknown.is_empty(),
        "{status:?}"
    );
}
on_backends!(every_migration_applies_again_over_its_own_effects: sqlite, postgres, mysql);

/// A database a newer release migrated one expand step further (the kit's
/// `ahead` migration) is what this release meets during a rolling upgrade
/// and after a rollback: `apply` leaves the unknown migration alone and
/// reports it, where sea-orm-migration's own `up` refuses the database.
async fn a_schema_one_expand_step_ahead_is_reported_not_refused(backend: Backend) {
    let t = TestDb::empty(backend).await;
    testkit::ahead::migrate_ahead(&t.db).await.unwrap();
    let refused = migration::Migrator::up(&t.db, None).await.unwrap_err();
    assert!(refused.to_string().contains("is missing"), "{refused}");
    let status = migration::apply(&t.db)
        .await
        .expect("the release applies (nothing) on a schema ahead of it");
    assert_eq!(status.unknown, [testkit::ahead::EXPAND_STEP]);
    assert!(status.pending.is_empty(), "{status:?}");
    assert_eq!(
        status.applied.len(),
        migration::Migrator::migrations().len()
    );
    assert_eq!(migration::status(&t.db).await.unwrap(), status);
}
on_backends!(a_schema_one_expand_step_ahead_is_reported_not_refused: sqlite, postgres, mysql);
