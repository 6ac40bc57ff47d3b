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
        // One column per statement: SQLite alters one at a time.
        let counter = |name| {
            ColumnDef::new(name)
                .big_integer()
                .not_null()
                .default(0)
                .to_owned()
        };
        for mut column in [
            ColumnDef::new(WalRelayPosition::TxnLsn)
                .big_integer()
                .to_owned(),
            counter(WalRelayPosition::TxnMessages),
            counter(WalRelayPosition::Generation),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(WalRelayPosition::Table)
                        .add_column(&mut column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            WalRelayPosition::Generation,
            WalRelayPosition::TxnMessages,
            WalRelayPosition::TxnLsn,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(WalRelayPosition::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
