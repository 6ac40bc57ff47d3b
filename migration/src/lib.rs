//! Schema migrations for seawall.
//!
//! The schema is the contract that makes the inbox correct: the unique index
//! `ix_inbox_message_id_consumer` decides which of two racing instances wins.
//! Every index carries an explicit name so that duplicate classification (and
//! operators reading an error) can tell which rule a write broke, on every
//! backend.
//!
//! # Layout
//! - [`apply`]: what start-up calls: pending migrations, one process at a time.
//! - [`Migrator`]: the ordered list of migrations; `Migrator::up` is idempotent.
//! - `columns`: backend-aware column shapes shared by the migrations.
//! - [`domain`]: the domain's migrations, run after the platform's (a fork
//!   replaces this folder; see `docs/fork.md`).

pub use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{
    DatabaseConnection, DbBackend, SqliteTransactionMode, TransactionOptions, TransactionTrait,
};

mod columns;
pub mod domain;
mod m20261130_000001_create_inbox_message;
mod m20261130_000002_create_outbox_message;
mod m20261130_000003_create_dead_letter;
mod m20261130_000005_create_outbox_notify_trigger;
mod m20261130_000006_add_inbox_claim_message;
mod m20261130_000007_create_admin_indexes;
mod m20261130_000008_partial_outbox_indexes;
mod m20261130_000009_create_pending_key_index;
mod m20261201_000010_add_outbox_causation;
mod m20261201_000011_create_throughput_minute;
mod m20261201_000012_create_wal_relay_position;
mod m20261202_000013_unbounded_received_subjects;
mod m20261202_000014_create_wal_slot_loss;
mod m20261203_000015_add_wal_relay_progress;
mod m20261204_000016_binary_text_on_mysql;

/// Applies the pending migrations, one process at a time.
///
/// Several instances started together against a fresh database would
/// otherwise all create the same tables and record the same migrations, and
/// all but one would fail. On PostgreSQL the whole run happens in one
/// transaction behind a transaction-scoped advisory lock (DDL is
/// transactional there, so a failed run also leaves nothing half-done); on
/// SQLite in one `BEGIN IMMEDIATE` transaction, which holds the database's
/// write lock. MySQL commits DDL implicitly, so there the migrations run as
/// they are.
///
/// # Errors
/// The first failing statement's error.
pub async fn apply(db: &DatabaseConnection) -> Result<(), DbErr> {
    match db.get_database_backend() {
        DbBackend::Postgres => {
            let txn = db.begin().await?;
            txn.execute_unprepared(&format!("SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
                .await?;
            // A migration that waits for a table's lock (a long transaction
            // holding it) queues every other session's access to that table
            // behind it: give up after a few seconds instead, as a lock
            // timeout, which start-up retries (`seawall::app::wait_out_database`).
            txn.execute_unprepared("SET LOCAL lock_timeout = '5s'")
                .await?;
            Migrator::up(&txn, None).await?;
            txn.commit().await
        }
        DbBackend::Sqlite => {
            let txn = db
                .begin_with_options(TransactionOptions {
                    sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
                    ..TransactionOptions::default()
                })
                .await?;
            Migrator::up(&txn, None).await?;
            txn.commit().await
        }
        _ => Migrator::up(db, None).await,
    }
}

/// Key of the PostgreSQL advisory lock [`apply`] holds ("seawall" in hex-ish).
const MIGRATION_LOCK: i64 = 0x5EA_3A11;

/// Applies seawall's migrations, then the domain's, in order. Already applied ones are skipped,
/// so running it at every start-up is safe.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        let mut migrations: Vec<Box<dyn MigrationTrait>> = vec![
            Box::new(m20261130_000001_create_inbox_message::Migration),
            Box::new(m20261130_000002_create_outbox_message::Migration),
            Box::new(m20261130_000003_create_dead_letter::Migration),
            Box::new(m20261130_000005_create_outbox_notify_trigger::Migration),
            Box::new(m20261130_000006_add_inbox_claim_message::Migration),
            Box::new(m20261130_000007_create_admin_indexes::Migration),
            Box::new(m20261130_000008_partial_outbox_indexes::Migration),
            Box::new(m20261130_000009_create_pending_key_index::Migration),
            Box::new(m20261201_000010_add_outbox_causation::Migration),
            Box::new(m20261201_000011_create_throughput_minute::Migration),
            Box::new(m20261201_000012_create_wal_relay_position::Migration),
            Box::new(m20261202_000013_unbounded_received_subjects::Migration),
            Box::new(m20261202_000014_create_wal_slot_loss::Migration),
            Box::new(m20261203_000015_add_wal_relay_progress::Migration),
            Box::new(m20261204_000016_binary_text_on_mysql::Migration),
        ];
        // The domain's tables come after the platform's: sea-orm records
        // each migration by name, so the order only matters on a fresh
        // database, where no domain table needs a platform one.
        migrations.extend(domain::migrations());
        migrations
    }
}
