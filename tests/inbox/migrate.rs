//! Several instances starting at once against a fresh database all migrate
//! it without tripping over each other (a deployment of three replicas does
//! exactly this).

use sea_orm::{ConnectionTrait, Statement};

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
                migration::apply(&db).await
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
on_backends!(instances_migrating_a_fresh_database_at_once_all_succeed: sqlite, postgres);
