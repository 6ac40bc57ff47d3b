//! The domain's migrations: here, the example domain's accounts and
//! credits. A fork replaces this folder with its own (see `docs/fork.md`);
//! the platform reaches it only through [`migrations`].

use sea_orm_migration::MigrationTrait;

mod m20261130_000004_create_demo_domain;

/// The domain's migrations in the order they apply, after the platform's.
/// Name each `mYYYYMMDD_NNNNNN_verb_noun`: the name is what the database
/// records as applied, so a migration is never renamed once shipped.
pub fn migrations() -> Vec<Box<dyn MigrationTrait>> {
    vec![Box::new(m20261130_000004_create_demo_domain::Migration)]
}
