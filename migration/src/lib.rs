//! Schema migrations for seawall.
//!
//! The schema is the contract that makes the inbox correct: the unique index
//! `ix_inbox_message_id_consumer` decides which of two racing instances wins.
//! Every index carries an explicit name so that duplicate classification (and
//! operators reading an error) can tell which rule a write broke, on every
//! backend.
//!
//! # Layout
//! - [`Migrator`]: the ordered list of migrations; `Migrator::up` is idempotent.
//! - `columns`: backend-aware column shapes shared by the migrations.

pub use sea_orm_migration::prelude::*;

mod columns;
mod m20261130_000001_create_inbox_message;
mod m20261130_000002_create_outbox_message;
mod m20261130_000003_create_dead_letter;
mod m20261130_000004_create_demo_domain;
mod m20261130_000005_create_outbox_notify_trigger;
mod m20261130_000006_add_inbox_claim_message;
mod m20261130_000007_create_admin_indexes;
mod m20261130_000008_partial_outbox_indexes;

/// Applies seawall's migrations in order. Already applied ones are skipped,
/// so running it at every start-up is safe.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261130_000001_create_inbox_message::Migration),
            Box::new(m20261130_000002_create_outbox_message::Migration),
            Box::new(m20261130_000003_create_dead_letter::Migration),
            Box::new(m20261130_000004_create_demo_domain::Migration),
            Box::new(m20261130_000005_create_outbox_notify_trigger::Migration),
            Box::new(m20261130_000006_add_inbox_claim_message::Migration),
            Box::new(m20261130_000007_create_admin_indexes::Migration),
            Box::new(m20261130_000008_partial_outbox_indexes::Migration),
        ]
    }
}
