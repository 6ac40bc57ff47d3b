//! Which session's positions the slot's confirmed position can be checked
//! against.
//!
//! A slot can be dropped and made again by someone else (an operator, or
//! Patroni recreating a permanent slot on a new leader) while no relay
//! looks: the new slot starts at its creation, the server skips what was
//! committed before, and the relay used to learn nothing of it. A relay of
//! this release records every position before it confirms it to the slot,
//! so a slot confirmed past the recorded position was remade, and the
//! events between are lost. `recorded_generation` is the `generation` of
//! the session that recorded that way once its record caught up with the
//! slot; while it differs from `generation` (a previous release's session,
//! which confirms positions it never records, took the slot over), no loss
//! is read from the difference.
//!
//! A new nullable column: the previous release does not name it, and its
//! sessions bump `generation` past it, which is what marks their positions
//! as not checkable.

use crate::columns::{add_column_if_missing, drop_column_if_present};
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum WalRelayPosition {
    Table,
    RecordedGeneration,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let column = ColumnDef::new(WalRelayPosition::RecordedGeneration)
            .big_integer()
            .to_owned();
        add_column_if_missing(manager, WalRelayPosition::Table, column).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_column_if_present(
            manager,
            WalRelayPosition::Table,
            WalRelayPosition::RecordedGeneration,
        )
        .await
    }
}
