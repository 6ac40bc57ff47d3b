//! Where the WAL relay has durably got to, per slot.
//!
//! PostgreSQL persists a logical slot's confirmed position only at
//! checkpoints: after a crash the slot goes back to the last one and sends
//! minutes of events again, longer ago than JetStream's duplicate window
//! remembers. The WAL relay records the end of every window it published in
//! this table, in a committed transaction, and starts each session there;
//! the server then skips what committed before it.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum WalRelayPosition {
    Table,
    Slot,
    Lsn,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(WalRelayPosition::Table)
                    .if_not_exists()
                    .col(
                        ColumnDef::new(WalRelayPosition::Slot)
                            .string_len(63)
                            .not_null()
                            .primary_key(),
                    )
                    .col(
                        ColumnDef::new(WalRelayPosition::Lsn)
                            .big_integer()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(WalRelayPosition::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
