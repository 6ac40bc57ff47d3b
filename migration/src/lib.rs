//! Schema migrations for seawall.
//!
//! The schema is the contract that makes the inbox correct: the unique index
//! `ix_inbox_message_id_consumer` decides which of two racing instances wins.
//! Every index carries an explicit name so that duplicate classification (and
//! operators reading an error) can tell which rule a write broke, on every
//! backend.
//!
//! # Layout
//! - [`apply`]: what start-up and `seawall migrate` call: pending
//!   migrations, one process at a time; a newer release's migrations are
//!   tolerated and reported.
//! - [`status`]: this release's migrations against the database's, read
//!   only (probes, `seawall migrate --status`, processes waiting for the
//!   migration job).
//! - [`Migrator`]: the ordered list of migrations. Shipped ones are never
//!   edited or renamed (`shipped.txt` holds their names and hashes).
//! - `columns`: backend-aware column shapes shared by the migrations.
//! - [`domain`]: the domain's migrations, run after the platform's (a fork
//!   replaces this folder; see `docs/fork.md`).

pub use sea_orm_migration::prelude::*;

mod apply;
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
mod m20261207_000017_one_open_dead_letter;
mod m20261207_000018_add_wal_relay_recorded_generation;
mod m20261207_000019_create_table_mode_guard;
#[cfg(test)]
mod shipped;
mod status;

pub use apply::{MYSQL_MIGRATION_LOCK, POSTGRES_MIGRATION_LOCK, apply};
pub use status::{Status, status};

/// seawall's migrations, then the domain's, in order. Apply them with
/// [`apply`], not `Migrator::up`, which refuses a database a newer release
/// has migrated further.
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
            Box::new(m20261207_000017_one_open_dead_letter::Migration),
            Box::new(m20261207_000018_add_wal_relay_recorded_generation::Migration),
            Box::new(m20261207_000019_create_table_mode_guard::Migration),
        ];
        // The domain's tables come after the platform's: sea-orm records
        // each migration by name, so the order only matters on a fresh
        // database, where no domain table needs a platform one.
        migrations.extend(domain::migrations());
        migrations
    }
}
