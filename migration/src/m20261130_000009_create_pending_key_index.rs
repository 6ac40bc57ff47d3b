//! An index of the *pending* rows of each ordering key, on PostgreSQL and
//! SQLite: `ix_outbox_message_key_pending` (`ordering_key, id`) for rows not
//! yet published and not dead.
//!
//! The relay asks, for every keyed row it might take, whether an earlier row
//! of the same key is blocked (backing off or leased). Through the key index
//! over all rows that question walks every row the key ever had, published
//! ones included, and a busy key makes every round slower than the last;
//! through this one it sees only the handful still pending.
//!
//! MySQL has no partial indexes; there the full key index answers.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

const NAME: &str = "ix_outbox_message_key_pending";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() == DbBackend::MySql {
            return Ok(());
        }
        manager
            .get_connection()
            .execute_unprepared(&format!(
                "CREATE INDEX IF NOT EXISTS {NAME} ON outbox_message (ordering_key, id) \
                 WHERE ordering_key IS NOT NULL AND published_at IS NULL AND dead_at IS NULL"
            ))
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() == DbBackend::MySql {
            return Ok(());
        }
        manager
            .get_connection()
            .execute_unprepared(&format!("DROP INDEX IF EXISTS {NAME}"))
            .await?;
        Ok(())
    }
}
