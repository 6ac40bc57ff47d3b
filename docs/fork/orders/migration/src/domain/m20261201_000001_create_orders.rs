//! The orders table.

use sea_orm_migration::prelude::*;

use crate::columns::{binary_text, bounded, utc};
use sea_orm_migration::schema::big_integer;

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
        // The column helpers keep a shape on every backend: `utc` keeps
        // microseconds on MySQL and MariaDB, where a plain timestamp column
        // drops them (and with them the order of rows written in one second).
        let backend = manager.get_database_backend();
        let mut orders = Table::create()
            .table(Orders::Table)
            .if_not_exists()
            .col(bounded(Orders::OrderId, 200, false).primary_key())
            .col(big_integer(Orders::Amount))
            .col(utc(backend, Orders::AcceptedAt, false))
            .to_owned();
        // Order ids compared byte for byte on MySQL too.
        binary_text(manager.get_connection(), &mut orders).await?;
        manager.create_table(orders).await
    }
}
