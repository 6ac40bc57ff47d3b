//! PostgreSQL only: the check a table-mode writer makes inside its
//! transaction that the database is not in WAL mode.
//!
//! The writer takes an advisory lock shared (the key is the caller's) and
//! then reads `wal_relay_position`; the first WAL-mode process takes the
//! same lock exclusively while it records the switch. Both steps must be
//! separate queries: under READ COMMITTED a query's snapshot is taken when
//! it starts, so a single `SELECT` that waited for the lock behind the
//! switch would still read the table as it was before the switch. A
//! VOLATILE function takes a fresh snapshot for each query it runs, so
//! this does both in one round trip. It returns the slot relaying the
//! database, or NULL in table mode.
//!
//! A new function: the previous release does not call it.

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
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE OR REPLACE FUNCTION fn_outbox_table_mode_guard(lock_key bigint) RETURNS text AS $$
                 BEGIN
                   PERFORM pg_advisory_xact_lock_shared(lock_key);
                   RETURN (SELECT p.slot FROM wal_relay_position p
                             JOIN pg_replication_slots s ON s.slot_name = p.slot
                            WHERE s.database = current_database()
                            ORDER BY p.slot LIMIT 1);
                 END
                 $$ LANGUAGE plpgsql VOLATILE",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        manager
            .get_connection()
            .execute_unprepared("DROP FUNCTION IF EXISTS fn_outbox_table_mode_guard(bigint)")
            .await?;
        Ok(())
    }
}
