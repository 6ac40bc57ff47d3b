//! The orders table.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::{big_integer, string_len, timestamp_with_time_zone};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Orders {
    Table,
    OrderId,
    Amount,
    AcceptedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Orders::Table)
                    .if_not_exists()
                    .col(string_len(Orders::OrderId, 200).primary_key())
                    .col(big_integer(Orders::Amount))
                    .col(timestamp_with_time_zone(Orders::AcceptedAt))
                    .to_owned(),
            )
            .await
    }
}
