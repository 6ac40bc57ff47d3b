//! A schema one release ahead: a test-only migration shaped like the expand
//! step a next release would ship (a new table, a new nullable column on a
//! platform table), which the tree's code does not know. Applied after the
//! tree's migrations, it makes the database the tree's release meets during
//! a rolling upgrade or after a rollback (docs/operations.md, "Upgrades and
//! rollbacks").

use migration::{MigrationTrait, MigratorTrait, SchemaManager};
use sea_orm::DbErr;

/// The test-only migration's name: later than any shipped one.
pub const EXPAND_STEP: &str = "m29991231_000001_expand_future_release";

/// The tree's migrations, then [`EXPAND_STEP`].
pub struct Ahead;

impl MigratorTrait for Ahead {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        let mut all = migration::Migrator::migrations();
        all.push(Box::new(ExpandStep));
        all
    }
}

/// Migrates `db` one expand step past the tree: the tree's pending
/// migrations first (as the tree applies them), then [`EXPAND_STEP`].
///
/// # Errors
/// A statement failing.
pub async fn migrate_ahead(db: &sea_orm::DatabaseConnection) -> Result<(), DbErr> {
    migration::apply(db).await?;
    Ahead::up(db, None).await
}

struct ExpandStep;

impl migration::MigrationName for ExpandStep {
    fn name(&self) -> &str {
        EXPAND_STEP
    }
}

#[migration::async_trait::async_trait]
impl MigrationTrait for ExpandStep {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use migration::{Alias, ColumnDef, Table};
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("future_audit"))
                    .col(
                        ColumnDef::new(Alias::new("id"))
                            .big_integer()
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(Alias::new("note")).text().null())
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("inbox_message"))
                    .add_column(ColumnDef::new(Alias::new("future_note")).text().null())
                    .to_owned(),
            )
            .await
    }
}
