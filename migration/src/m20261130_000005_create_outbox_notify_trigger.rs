//! PostgreSQL only: notify relays when outbox rows commit.
//!
//! The statement-level trigger calls `pg_notify('seawall_outbox', '')`; the
//! notification is delivered when the inserting transaction commits (and never
//! if it rolls back), so relays in other processes wake up without polling.
//! Other backends rely on in-process wake-ups and polling.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let db = manager.get_connection();
        db.execute_unprepared(
            "CREATE OR REPLACE FUNCTION fn_outbox_message_notify() RETURNS trigger AS $$
             BEGIN PERFORM pg_notify('seawall_outbox', ''); RETURN NULL; END
             $$ LANGUAGE plpgsql",
        )
        .await?;
        db.execute_unprepared("DROP TRIGGER IF EXISTS tr_outbox_message_notify ON outbox_message")
            .await?;
        db.execute_unprepared(
            "CREATE TRIGGER tr_outbox_message_notify AFTER INSERT ON outbox_message
             FOR EACH STATEMENT EXECUTE FUNCTION fn_outbox_message_notify()",
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let db = manager.get_connection();
        db.execute_unprepared("DROP TRIGGER IF EXISTS tr_outbox_message_notify ON outbox_message")
            .await?;
        db.execute_unprepared("DROP FUNCTION IF EXISTS fn_outbox_message_notify()")
            .await?;
        Ok(())
    }
}
