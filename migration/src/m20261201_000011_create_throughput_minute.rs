//! Per-minute throughput counts, so the dashboard's chart reads a few
//! hundred small rows instead of grouping every row of the last minutes
//! (a million at 1,000 messages/s, which took the stats to 0.7 s).
//!
//! The relay and the consumers add to these counts in the transactions that
//! publish and process, each session into its own row. The table starts
//! empty: the chart fills from the first minute after this migration.

use crate::columns::utc;
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum ThroughputMinute {
    Table,
    Minute,
    Tally,
    Shard,
    N,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(ThroughputMinute::Table)
                    .if_not_exists()
                    .col(utc(backend, ThroughputMinute::Minute, false))
                    .col(
                        ColumnDef::new(ThroughputMinute::Tally)
                            .string_len(16)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(ThroughputMinute::Shard)
                            .big_integer()
                            .not_null(),
                    )
                    .col(ColumnDef::new(ThroughputMinute::N).big_integer().not_null())
                    .primary_key(
                        Index::create()
                            .name("pk_throughput_minute")
                            .col(ThroughputMinute::Minute)
                            .col(ThroughputMinute::Tally)
                            .col(ThroughputMinute::Shard),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(ThroughputMinute::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
