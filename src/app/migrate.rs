//! `migrate` as a command: what the binaries print when they apply or list
//! the migrations (see `migration::apply`, `migration::status`).

use anyhow::{Context, Result};

use super::{connect_db_waiting, wait_out_database};
use crate::config::Settings;

/// `seawall migrate`: applies the pending migrations and says what the
/// database holds; `--status` only says. Migrations of a newer release are
/// noted, not refused: the command exits 0 on a schema ahead of it.
///
/// # Errors
/// The database unreachable, or a migration failing.
pub async fn migrate(settings: &Settings, status_only: bool) -> Result<()> {
    // As a job during a rollout, it meets what start-up meets: a database
    // restarting, or a lock held by the running release's traffic past
    // the migration's lock timeout. Both are waited out, as start-up does.
    let db = connect_db_waiting(
        &settings.database_url,
        settings.tool_pool_size(),
        settings.sqlite(),
    )
    .await?;
    let url = crate::config::redact(&settings.database_url);
    let status = if status_only {
        migration::status(&db)
            .await
            .context("reading the applied migrations")?
    } else {
        let status = wait_out_database("applying migrations", || migration::apply(&db)).await?;
        println!("migrations applied to {url}");
        status
    };
    if status_only {
        for (state, names) in [
            ("applied", &status.applied),
            ("pending", &status.pending),
            ("unknown", &status.unknown),
        ] {
            for name in names {
                println!("{state:<8} {name}");
            }
        }
    }
    if !status.unknown.is_empty() {
        println!(
            "note: {url} holds {} migration(s) this release does not know (a newer release's): {}; this release runs beside them (docs/operations.md, upgrades and rollbacks)",
            status.unknown.len(),
            status.unknown.join(", ")
        );
    }
    Ok(())
}
