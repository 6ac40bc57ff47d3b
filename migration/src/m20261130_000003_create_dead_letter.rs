//! The dead-letter table.

use crate::columns::{
    CONSUMER_LEN, MESSAGE_ID_LEN, NAME_LEN, bounded, bytes, create_index_if_missing, text, utc,
};
use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::{big_pk_auto, integer, json};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum DeadLetter {
    Table,
    Id,
    Consumer,
    MessageId,
    Subject,
    Payload,
    Headers,
    Error,
    Deliveries,
    CreatedAt,
    ReplayedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(DeadLetter::Table)
                    .if_not_exists()
                    .col(big_pk_auto(DeadLetter::Id))
                    .col(bounded(DeadLetter::Consumer, CONSUMER_LEN, false))
                    .col(bounded(DeadLetter::MessageId, MESSAGE_ID_LEN, true))
                    .col(bounded(DeadLetter::Subject, NAME_LEN, false))
                    .col(bytes(db, DeadLetter::Payload))
                    .col(json(DeadLetter::Headers))
                    .col(text(DeadLetter::Error, false))
                    .col(integer(DeadLetter::Deliveries).default(0))
                    .col(utc(db, DeadLetter::CreatedAt, false))
                    .col(utc(db, DeadLetter::ReplayedAt, true))
                    .to_owned(),
            )
            .await?;
        create_index_if_missing(
            manager,
            DeadLetter::Table,
            Index::create()
                .name("ix_dead_letter_consumer")
                .col(DeadLetter::Consumer)
                .col(DeadLetter::Id)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(DeadLetter::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
