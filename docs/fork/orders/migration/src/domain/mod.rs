//! The orders service's migrations, run after the platform's.

use sea_orm_migration::MigrationTrait;

mod m20261201_000001_create_orders;

/// The migrations in the order they apply.
pub fn migrations() -> Vec<Box<dyn MigrationTrait>> {
    vec![Box::new(m20261201_000001_create_orders::Migration)]
}
