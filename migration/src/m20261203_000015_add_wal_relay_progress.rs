//! How far the WAL relay got inside a transaction it has not finished.
//!
//! A transaction may hold more events than fit in memory, so the relay
//! publishes it in bounded pieces. The slot can only be confirmed at a
//! commit, so a restart decodes the transaction again from its start; the
//! relay records, with each piece, the transaction (its commit position)
//! and how many of its messages are done, and skips those when it meets the
//! transaction again: a restart does not publish them a second time, even
//! long after JetStream's duplicate window has forgotten them.
//!
//! And which session of the slot's relays holds it: each session that takes
//! the slot bumps `generation`, and a relay records a window only while the
//! generation is its own. A relay frozen past `wal_sender_timeout` loses the
//! slot to a standby; when it wakes, it finds the generation moved on and
//! stops instead of publishing and recording windows the standby has.

use crate::columns::{add_column_if_missing, drop_column_if_present};
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum WalRelayPosition {
    Table,
    TxnLsn,
    TxnMessages,
    Generation,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let counter = |name| {
            ColumnDef::new(name)
                .big_integer()
                .not_null()
                .default(0)
                .to_owned()
        };
        // One column per statement (SQLite alters one at a time), each only
        // if missing: a run stopped on MySQL half-way keeps the first ones.
        for column in [
            ColumnDef::new(WalRelayPosition::TxnLsn)
                .big_integer()
                .to_owned(),
            counter(WalRelayPosition::TxnMessages),
            counter(WalRelayPosition::Generation),
        ] {
            add_column_if_missing(manager, WalRelayPosition::Table, column).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            WalRelayPosition::Generation,
            WalRelayPosition::TxnMessages,
            WalRelayPosition::TxnLsn,
        ] {
            drop_column_if_present(manager, WalRelayPosition::Table, column).await?;
        }
        Ok(())
    }
}
