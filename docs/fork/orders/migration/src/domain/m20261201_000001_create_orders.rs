//! The orders table.

use sea_orm_migration::prelude::*;

use crate::columns::binary_text;
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
        let mut orders = Table::create()
            .table(Orders::Table)
            .if_not_exists()
            .col(string_len(Orders::OrderId, 200).primary_key())
            .col(big_integer(Orders::Amount))
            .col(timestamp_with_time_zone(Orders::AcceptedAt))
            .to_owned();
        // Order ids compared byte for byte on MySQL too.
        binary_text(manager.get_connection(), &mut orders).await?;
        manager.create_table(orders).await
    }
}
