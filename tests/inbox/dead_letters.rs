//! One open dead letter per (consumer, message id): a copy of a message
//! that was already given up on (by this process or another, racing its
//! redelivery) leaves no second row, on every backend; a replayed row no
//! longer counts, rows without an id are all kept, and the migration keeps
//! the copies stored before it.

use std::collections::BTreeMap;

use chrono::Utc;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};

use entity::dead_letter;
use migration::MigratorTrait;
use service::dead_letter::{DeadLetter, Recorded};

use crate::on_backends;
use crate::support::{Backend, TestDb};

async fn give_up<C: ConnectionTrait>(db: &C, consumer: &str, id: Option<&str>) -> Recorded {
    record(db, consumer, id, &BTreeMap::new()).await
}

async fn record<C: ConnectionTrait>(
    db: &C,
    consumer: &str,
    id: Option<&str>,
    headers: &BTreeMap<String, String>,
) -> Recorded {
    DeadLetter {
        consumer,
        message_id: id,
        subject: "ledger.record",
        payload: b"not json",
        headers,
        error: "unusable message",
        deliveries: 1,
    }
    .record(db)
    .await
    .unwrap()
}

async fn replay(t: &TestDb, consumer: &str, id: &str) {
    dead_letter::Entity::update_many()
        .col_expr(dead_letter::Column::ReplayedAt, Expr::value(Utc::now()))
        .filter(dead_letter::Column::Consumer.eq(consumer))
        .filter(dead_letter::Column::MessageId.eq(id))
        .exec(&t.db)
        .await
        .unwrap();
}

/// Without the unique index over open rows, every copy wrote a row.
async fn a_message_has_one_open_dead_letter_per_consumer(backend: Backend) {
    let t = TestDb::new(backend).await;
    assert_eq!(
        give_up(&t.db, "ledger", Some("m-1")).await,
        Recorded::Written
    );
    assert_eq!(
        give_up(&t.db, "ledger", Some("m-1")).await,
        Recorded::AlreadyOpen
    );
    assert_eq!(
        give_up(&t.db, "audit", Some("m-1")).await,
        Recorded::Written
    );
    // Ids compare byte for byte (MariaDB's collation included).
    assert_eq!(
        give_up(&t.db, "ledger", Some("M-1")).await,
        Recorded::Written
    );
    for _ in 0..2 {
        assert_eq!(give_up(&t.db, "ledger", None).await, Recorded::Written);
        // Two events of the WAL relay's may share an id: each keeps its row.
        assert_eq!(
            give_up(&t.db, "wal-relay", Some("m-1")).await,
            Recorded::Written
        );
    }
    // Replayed, the row is closed: the message failing again opens another.
    replay(&t, "ledger", "m-1").await;
    assert_eq!(
        give_up(&t.db, "ledger", Some("m-1")).await,
        Recorded::Written
    );
    assert_eq!(t.count(dead_letter::Entity).await, 8);
}
on_backends!(a_message_has_one_open_dead_letter_per_consumer: sqlite, postgres, mysql);

/// Copies written before the migration stay; all but the first of each
/// are marked as copies of it, so the index can be made, and from then on
/// the message has one open row.
async fn the_migration_keeps_copies_stored_before_it(backend: Backend) {
    let t = TestDb::new(backend).await;
    let last = migration::Migrator::migrations()
        .into_iter()
        .find(|m| m.name() == "m20261207_000017_one_open_dead_letter")
        .expect("the migration is listed");
    last.down(&migration::SchemaManager::new(&t.db))
        .await
        .unwrap();
    for _ in 0..3 {
        give_up(&t.db, "ledger", Some("m-1")).await;
    }
    give_up(&t.db, "ledger", Some("m-2")).await;
    last.up(&migration::SchemaManager::new(&t.db))
        .await
        .unwrap();
    // Again over its own work, as after an interrupted run.
    last.up(&migration::SchemaManager::new(&t.db))
        .await
        .unwrap();

    assert_eq!(t.count(dead_letter::Entity).await, 4, "nothing deleted");
    let marked =
        t.db.query_one_raw(sea_orm::Statement::from_string(
            t.db.get_database_backend(),
            "SELECT COUNT(*) AS n FROM dead_letter WHERE duplicate_of = \
             (SELECT MIN(id) FROM dead_letter WHERE message_id = 'm-1')",
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get::<i64>("", "n")
        .unwrap();
    assert_eq!(marked, 2, "the later copies point at the first");
    assert_eq!(
        give_up(&t.db, "ledger", Some("m-1")).await,
        Recorded::AlreadyOpen
    );
    assert_eq!(
        give_up(&t.db, "ledger", Some("m-2")).await,
        Recorded::AlreadyOpen
    );
    replay(&t, "ledger", "m-1").await;
    assert_eq!(
        give_up(&t.db, "ledger", Some("m-1")).await,
        Recorded::Written
    );
}
on_backends!(the_migration_keeps_copies_stored_before_it: sqlite, postgres, mysql);

/// A replayed copy that fails before the operator's replay has marked its
/// dead letter replayed (the row is marked once the broker has the copy)
/// finds the row it was replayed from still open. Its header names that
/// row: the row is closed and the new failure recorded. Without it the
/// copy was terminated as "already dead-lettered", and the row then read
/// "replayed" with the failure gone. A header naming another row changes
/// nothing.
async fn a_replay_that_fails_at_once_records_its_failure(backend: Backend) {
    let t = TestDb::new(backend).await;
    assert_eq!(
        give_up(&t.db, "ledger", Some("m-1")).await,
        Recorded::Written
    );
    let first = dead_letter::Entity::find()
        .one(&t.db)
        .await
        .unwrap()
        .unwrap()
        .id;
    assert_eq!(replayed_copy(&t, first + 100).await, Recorded::AlreadyOpen);
    assert_eq!(replayed_copy(&t, first).await, Recorded::Written);
    let rows = dead_letter::Entity::find().all(&t.db).await.unwrap();
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .any(|r| r.id == first && r.replayed_at.is_some())
    );
    assert!(
        rows.iter()
            .any(|r| r.id != first && r.replayed_at.is_none())
    );
}
on_backends!(a_replay_that_fails_at_once_records_its_failure: sqlite, postgres, mysql);

/// A copy of `m-1` replayed from dead letter `letter`, given up on again.
async fn replayed_copy(t: &TestDb, letter: i64) -> Recorded {
    let headers = BTreeMap::from([(
        service::dead_letter::REPLAY_LETTER_HEADER.to_owned(),
        letter.to_string(),
    )]);
    record(&t.db, "ledger", Some("m-1"), &headers).await
}
