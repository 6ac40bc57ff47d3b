//! What a database holds against what this release knows.
//!
//! A release runs on a schema one release ahead of it: during a rolling
//! upgrade the previous release's pods run beside the new one's after its
//! migrations ran, and after a rollback the previous release runs on the
//! new schema for good. So a migration recorded in the database that this
//! release does not know is a newer release's expand step, to be reported
//! ([`Status::unknown`]), not a reason to stop; only a migration this
//! release needs and the database lacks ([`Status::pending`]) is one.
//! docs/operations.md ("Upgrades and rollbacks") holds the rule that makes
//! this safe: every shipped migration works with the release before it.

use std::collections::BTreeSet;

use sea_orm_migration::sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, Statement,
};
use sea_orm_migration::{MigratorTrait, SchemaManager, seaql_migrations};

use crate::Migrator;

/// The migrations of this release and of the database, compared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// Known to this release and applied, in this release's order.
    pub applied: Vec<String>,
    /// Known to this release and not applied: the release needs them.
    pub pending: Vec<String>,
    /// Applied, but unknown to this release: a newer release's (or
    /// another branch's) migrations, in name order.
    pub unknown: Vec<String>,
}

impl Status {
    /// `known` (this release's migrations, in order) against `recorded`
    /// (the names the database's migration table holds).
    pub(crate) fn of(known: &[String], recorded: &BTreeSet<String>) -> Self {
        let (applied, pending) = known.iter().cloned().partition(|m| recorded.contains(m));
        let unknown = recorded
            .iter()
            .filter(|m| !known.contains(m))
            .cloned()
            .collect();
        Self {
            applied,
            pending,
            unknown,
        }
    }
}

/// The names of this release's migrations, in the order they apply.
pub(crate) fn known() -> Vec<String> {
    Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect()
}

/// The names the migration table holds (none on a database never migrated).
pub(crate) async fn recorded<C: ConnectionTrait>(db: &C) -> Result<BTreeSet<String>, DbErr> {
    Ok(seaql_migrations::Entity::find()
        .all(db)
        .await?
        .into_iter()
        .map(|m| m.version)
        .collect())
}

/// Reads the database's migrations against this release's, without
/// writing: the migration table is not created when it is missing, so a
/// role without DDL rights (a probe, `seawall migrate --status` on a
/// read-only replica) can ask.
///
/// # Errors
/// The database cannot be read.
pub async fn status(db: &DatabaseConnection) -> Result<Status, DbErr> {
    let recorded = if migration_table_exists(db).await? {
        recorded(db).await?
    } else {
        BTreeSet::new()
    };
    Ok(Status::of(&known(), &recorded))
}

/// Whether the migration table exists. On PostgreSQL asked of the catalog
/// (`to_regclass`), not of `information_schema`, which lists only the
/// tables the role may use: a role without rights on the table would read
/// every migration as pending, and wait for ever, where reading the table
/// tells it the permission it lacks.
async fn migration_table_exists(db: &DatabaseConnection) -> Result<bool, DbErr> {
    let table = Migrator::migration_table_name().to_string();
    if db.get_database_backend() != DbBackend::Postgres {
        return SchemaManager::new(db).has_table(&table).await;
    }
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT to_regclass($1) IS NOT NULL AS found",
            [table.into()],
        ))
        .await?;
    Ok(row
        .and_then(|r| r.try_get::<bool>("", "found").ok())
        .unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_newer_releases_migration_is_unknown_and_a_missing_one_pending() {
        let known = names(&["m1", "m2", "m3"]);
        let recorded: BTreeSet<String> = names(&["m1", "m2", "m9"]).into_iter().collect();
        let status = Status::of(&known, &recorded);
        assert_eq!(status.applied, names(&["m1", "m2"]));
        assert_eq!(status.pending, names(&["m3"]));
        assert_eq!(status.unknown, names(&["m9"]));
    }
}
