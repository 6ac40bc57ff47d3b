//! The test-only domain the platform tests run on: a ledger. A `ledger.record`
//! message adds an entry to an account and bumps its balance (a bulk
//! `update_many`, so rollbacks of bulk writes are tested too), and emits a
//! `ledger.recorded` event; the `hook` consumer POSTs each recorded event to
//! a webhook through a two-phase claim.
//!
//! It is deliberately not the example domain (credits): a fork replaces
//! that, and every platform test must keep passing after it (see
//! `docs/fork.md`, proved by `scripts/fork-check`). Its tables are created
//! by [`create_tables`], not by the migrator, for the same reason.

use std::time::Duration;

use chrono::Utc;
use futures::future::BoxFuture;
use sea_orm::sea_query::{Expr, ExprTrait, Index};
use sea_orm::{
    ActiveValue::{NotSet, Set},
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, Schema,
};
use serde::{Deserialize, Serialize};

use service::{ConsumerName, Ctx, Envelope, Handle, HandlerError, MessageId, NewEvent};

/// The consumer that records entries.
pub const LEDGER_CONSUMER: &str = "ledger";
/// The consumer that POSTs recorded entries to a webhook.
pub const HOOK_CONSUMER: &str = "hook";
/// The stream of the ledger's subjects.
pub const LEDGER_STREAM: &str = "LEDGER";
/// Incoming requests.
pub const RECORD_SUBJECT: &str = "ledger.record";
/// The events the ledger emits.
pub const RECORDED_SUBJECT: &str = "ledger.recorded";

/// `ledger_entry`: one recorded entry. `reference`, when given, is unique
/// (`ix_ledger_entry_reference`): a business constraint, so tests can tell
/// a real conflict apart from an inbox duplicate.
pub mod entry {
    use sea_orm::entity::prelude::*;

    /// An entry.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "ledger_entry")]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub message_id: String,
        pub account_id: String,
        pub amount: i64,
        pub reference: Option<String>,
        pub created_at: DateTimeUtc,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// `ledger_balance`: the running total of an account.
pub mod balance {
    use sea_orm::entity::prelude::*;

    /// A balance.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "ledger_balance")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub account_id: String,
        pub balance: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// Creates the ledger's tables and index if missing.
pub async fn create_tables(db: &DatabaseConnection) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let schema = Schema::new(backend);
    let mut entries = schema.create_table_from_entity(entry::Entity);
    let mut balances = schema.create_table_from_entity(balance::Entity);
    if backend == sea_orm::DbBackend::MySql {
        // The database's default, which seawall's migrations made a binary
        // collation (as `migration`'s `columns::binary_text`): this pool's
        // connections predate that change and would still use the old one.
        let row = db
            .query_one_raw(sea_orm::Statement::from_string(
                backend,
                "SELECT DEFAULT_CHARACTER_SET_NAME AS s, DEFAULT_COLLATION_NAME AS c \
                 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = DATABASE()",
            ))
            .await?
            .ok_or_else(|| DbErr::Custom("no database selected".into()))?;
        let (set, collation): (String, String) = (row.try_get("", "s")?, row.try_get("", "c")?);
        for table in [&mut entries, &mut balances] {
            table
                .character_set(set.as_str())
                .collate(collation.as_str());
        }
    }
    db.execute(&*entries.if_not_exists()).await?;
    db.execute(&*balances.if_not_exists()).await?;
    let index = Index::create()
        .name("ix_ledger_entry_reference")
        .table(entry::Entity)
        .col(entry::Column::Reference)
        .unique()
        .to_owned();
    match db.execute(&index).await {
        Ok(_) => Ok(()),
        // Created by an earlier start (MySQL has no CREATE INDEX IF NOT EXISTS).
        Err(err)
            if err.to_string().contains("exist")
                || err.to_string().contains("Duplicate key name") =>
        {
            Ok(())
        }
        Err(err) => Err(err),
    }
}

/// A `ledger.record` payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryRequest {
    /// The account.
    pub account_id: String,
    /// A positive amount.
    pub amount: i64,
    /// Optional business reference, unique across entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

impl EntryRequest {
    /// Parses and checks a payload.
    pub fn parse(payload: &[u8]) -> Result<Self, String> {
        let req: Self =
            serde_json::from_slice(payload).map_err(|e| format!("malformed entry: {e}"))?;
        if req.account_id.trim().is_empty() || req.account_id.len() > 255 {
            return Err("invalid entry: account_id must be 1 to 255 bytes".into());
        }
        if req.amount <= 0 {
            return Err(format!(
                "invalid entry: amount must be positive, got {}",
                req.amount
            ));
        }
        Ok(req)
    }
}

/// The `ledger.recorded` payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// The request's message id.
    pub message_id: String,
    /// The account.
    pub account_id: String,
    /// The balance after the entry.
    pub balance: i64,
}

/// Records `req` on the context's transaction: the entry, the balance and
/// the `ledger.recorded` event (ordered per account).
pub async fn record(ctx: &Ctx<'_>, req: &EntryRequest) -> Result<Recorded, HandlerError> {
    let (txn, message_id) = (ctx.txn(), &ctx.envelope().message_id);
    entry::Entity::insert(entry::ActiveModel {
        id: NotSet,
        message_id: Set(message_id.to_string()),
        account_id: Set(req.account_id.clone()),
        amount: Set(req.amount),
        reference: Set(req.reference.clone()),
        created_at: Set(Utc::now()),
    })
    .exec_without_returning(txn)
    .await?;
    let balance = add(txn, &req.account_id, req.amount).await?;
    let recorded = Recorded {
        message_id: message_id.to_string(),
        account_id: req.account_id.clone(),
        balance,
    };
    let payload = serde_json::to_vec(&recorded).map_err(|e| DbErr::Json(e.to_string()))?;
    let event = NewEvent::new(RECORDED_SUBJECT, payload).with_ordering_key(req.account_id.clone());
    ctx.emit(event).await?;
    Ok(recorded)
}

/// Adds `amount` to an account's balance (created at 0 if missing) with a
/// bulk update on `conn`; returns the new balance.
pub async fn add<C: ConnectionTrait>(
    conn: &C,
    account_id: &str,
    amount: i64,
) -> Result<i64, DbErr> {
    balance::Entity::insert(balance::ActiveModel {
        account_id: Set(account_id.to_owned()),
        balance: Set(0),
    })
    .on_conflict_do_nothing_on([balance::Column::AccountId])
    .exec_without_returning(conn)
    .await?;
    balance::Entity::update_many()
        .col_expr(
            balance::Column::Balance,
            Expr::col(balance::Column::Balance).add(amount),
        )
        .filter(balance::Column::AccountId.eq(account_id))
        .exec(conn)
        .await?;
    Ok(balance_of(conn, account_id).await?.unwrap_or(0))
}

/// An account's balance, if it has one.
pub async fn balance_of<C: ConnectionTrait>(
    conn: &C,
    account_id: &str,
) -> Result<Option<i64>, DbErr> {
    Ok(balance::Entity::find_by_id(account_id.to_owned())
        .one(conn)
        .await?
        .map(|b| b.balance))
}

/// The `ledger` consumer's handler.
#[derive(Debug, Clone, Default)]
pub struct LedgerHandler {
    /// Simulated work after the writes, so crashes and races can land while
    /// a transaction is open.
    pub work: Duration,
}

impl Handle<Recorded> for LedgerHandler {
    fn handle<'a>(&'a self, ctx: &'a Ctx<'a>) -> BoxFuture<'a, Result<Recorded, HandlerError>> {
        Box::pin(async move {
            let req =
                EntryRequest::parse(&ctx.envelope().payload).map_err(HandlerError::Rejected)?;
            let recorded = record(ctx, &req).await?;
            if !self.work.is_zero() {
                tokio::time::sleep(self.work).await;
            }
            Ok(recorded)
        })
    }
}

/// A `ledger.record` envelope.
pub fn entry_envelope(id: &str, account: &str, amount: i64, reference: Option<&str>) -> Envelope {
    let req = EntryRequest {
        account_id: account.into(),
        amount,
        reference: reference.map(Into::into),
    };
    Envelope::new(
        MessageId::parse(id).expect("valid id"),
        RECORD_SUBJECT,
        serde_json::to_vec(&req).expect("json"),
    )
}

/// The ledger consumer's name.
pub fn ledger_consumer() -> ConsumerName {
    ConsumerName::parse(LEDGER_CONSUMER).expect("valid consumer name")
}

/// Short names, as `entity::prelude` has for the platform's tables.
pub use balance::Entity as Balance;
pub use entry::Entity as Entry;
