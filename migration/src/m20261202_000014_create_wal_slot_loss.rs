//! Every time the WAL relay found its slot gone and made a new one.
//!
//! A logical slot can disappear under seawall: dropped by hand, or
//! invalidated by `max_slot_wal_keep_size` (PostgreSQL then refuses to decode
//! from it). Whatever was committed between the last window the relay
//! recorded and the new slot's start was never decoded, so those events were
//! never published. The relay that recreates the slot writes a row here
//! (from its last recorded position, in `wal_relay_position`), which says
//! what was lost and when, outlives the process that noticed, and is what
//! the `api` exports to the `SeawallWalSlotRecreated` alert: a counter in
//! the relay alone would be lost when the loss is found at start-up, before
//! any scrape.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::big_pk_auto;

use crate::columns::{bounded, utc};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum WalSlotLoss {
    Table,
    Id,
    Slot,
    RelayedTo,
    RestartedAt,
    RecreatedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(WalSlotLoss::Table)
                    .if_not_exists()
                    .col(big_pk_auto(WalSlotLoss::Id))
                    .col(bounded(WalSlotLoss::Slot, 63, false))
                    .col(
                        ColumnDef::new(WalSlotLoss::RelayedTo)
                            .big_integer()
                            .not_null(),
                    )
                    // Filled in once the new slot exists.
                    .col(
                        ColumnDef::new(WalSlotLoss::RestartedAt)
                            .big_integer()
                            .null(),
                    )
                    .col(utc(db, WalSlotLoss::RecreatedAt, false))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(WalSlotLoss::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
