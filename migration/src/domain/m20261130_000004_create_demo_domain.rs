//! The demo domain: accounts and the credits applied to them.

use crate::columns::{
    MESSAGE_ID_LEN, NAME_LEN, binary_text, bounded, create_index_if_missing, utc,
};
use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::{big_integer, big_pk_auto};

#[derive(DeriveMigrationName)]
pub struct Migration;

// Column names mirror the entity; clippy's naming lint does not apply to idens.
#[allow(clippy::enum_variant_names)]
#[derive(DeriveIden)]
enum Account {
    Table,
    AccountId,
    Balance,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Credit {
    Table,
    Id,
    MessageId,
    AccountId,
    Amount,
    Reference,
    CreatedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_database_backend();
        let mut accounts = Table::create()
            .table(Account::Table)
            .if_not_exists()
            .col(bounded(Account::AccountId, NAME_LEN, false).primary_key())
            .col(big_integer(Account::Balance).default(0))
            .col(utc(db, Account::UpdatedAt, false))
            .to_owned();
        let mut credits = Table::create()
            .table(Credit::Table)
            .if_not_exists()
            .col(big_pk_auto(Credit::Id))
            .col(bounded(Credit::MessageId, MESSAGE_ID_LEN, false))
            .col(bounded(Credit::AccountId, NAME_LEN, false))
            .col(big_integer(Credit::Amount))
            .col(bounded(Credit::Reference, NAME_LEN, true))
            .col(utc(db, Credit::CreatedAt, false))
            .to_owned();
        for table in [&mut accounts, &mut credits] {
            binary_text(manager.get_connection(), table).await?;
        }
        manager.create_table(accounts).await?;
        manager.create_table(credits).await?;
        // Indexes only if missing, so that a run stopped half-way on MySQL
        // (DDL commits there as it goes) can run again: see `columns`.
        // The business key: a second credit with the same reference is a real
        // error, never an inbox duplicate.
        create_index_if_missing(
            manager,
            Credit::Table,
            Index::create()
                .name("ix_credit_reference")
                .col(Credit::Reference)
                .unique()
                .to_owned(),
        )
        .await?;
        // Not unique on purpose: the naive check-then-insert demo reads it.
        create_index_if_missing(
            manager,
            Credit::Table,
            Index::create()
                .name("ix_credit_message_id")
                .col(Credit::MessageId)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Credit::Table).if_exists().to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Account::Table).if_exists().to_owned())
            .await
    }
}
