//! Column shapes that differ per backend, and the guards that let a
//! migration run again.
//!
//! Identifiers that take part in indexes are bounded `varchar`s because MySQL
//! cannot index unbounded text; times keep microseconds everywhere because
//! MySQL's plain `timestamp` would truncate them and break ordering by time.
//!
//! MySQL and MariaDB commit each DDL statement as it runs, so a migration
//! stopped half-way (the process killed between two statements) keeps what
//! it did but is not recorded as applied, and the next start runs all of it
//! again. Each of its statements must therefore accept finding its effect
//! already there. MySQL 8 has neither `CREATE INDEX IF NOT EXISTS` nor
//! `ADD COLUMN IF NOT EXISTS` (MariaDB has both), and sea-query leaves an
//! index's `if_not_exists` out on MySQL without a word, so the guards below
//! ask the catalogue first (through `SchemaManager::has_index` and
//! `has_column`, which read `information_schema` on MySQL and PostgreSQL and
//! `sqlite_master`/`pragma_table_info` on SQLite).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement};

/// Longest message id accepted anywhere (bytes). `service` enforces the same bound.
pub const MESSAGE_ID_LEN: u32 = 200;
/// Longest consumer name accepted anywhere.
pub const CONSUMER_LEN: u32 = 64;
/// Longest subject or other indexed name.
pub const NAME_LEN: u32 = 255;

/// A UTC time column.
pub fn utc<T: IntoIden>(backend: DbBackend, col: T, nullable: bool) -> ColumnDef {
    let mut def = ColumnDef::new(col);
    match backend {
        DbBackend::MySql => def.custom(Alias::new("datetime(6)")),
        _ => def.timestamp_with_time_zone(),
    };
    if nullable {
        def.null()
    } else {
        def.not_null()
    };
    def
}

/// A binary payload column, large enough for broker messages on every backend.
pub fn bytes<T: IntoIden>(backend: DbBackend, col: T) -> ColumnDef {
    let mut def = ColumnDef::new(col);
    match backend {
        DbBackend::MySql => def.custom(Alias::new("longblob")),
        _ => def.blob(),
    };
    def.not_null();
    def
}

/// A bounded string column.
pub fn bounded<T: IntoIden>(col: T, len: u32, nullable: bool) -> ColumnDef {
    let mut def = ColumnDef::new(col);
    def.string_len(len);
    if nullable {
        def.null()
    } else {
        def.not_null()
    };
    def
}

/// An unbounded text column (never indexed).
pub fn text<T: IntoIden>(col: T, nullable: bool) -> ColumnDef {
    let mut def = ColumnDef::new(col);
    def.text();
    if nullable {
        def.null()
    } else {
        def.not_null()
    };
    def
}

/// On MySQL and MariaDB, gives `table` the database's default character set
/// and collation: seawall's migrations make those `utf8mb4` with a binary
/// collation that does not pad, so ids are compared byte for byte (a
/// case-insensitive default would take `Order-1` and `order-1` for one
/// key). Said on the table because a connection opened before that
/// migration still creates tables with the old default. The other
/// backends already compare byte for byte.
///
/// # Errors
/// The look-up's error.
pub async fn binary_text<C: ConnectionTrait>(
    db: &C,
    table: &mut TableCreateStatement,
) -> Result<(), DbErr> {
    if db.get_database_backend() != DbBackend::MySql {
        return Ok(());
    }
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::MySql,
            "SELECT DEFAULT_CHARACTER_SET_NAME AS s, DEFAULT_COLLATION_NAME AS c \
             FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = DATABASE()",
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("no database selected".into()))?;
    table
        .character_set(row.try_get::<String>("", "s")?)
        .collate(row.try_get::<String>("", "c")?);
    Ok(())
}

/// Creates `index` on `table`, unless an index of its name is there already.
///
/// PostgreSQL and SQLite say so in the statement (`IF NOT EXISTS`); on
/// MySQL, which cannot, the catalogue is asked first. The index must be
/// named: the name is what tells it is there.
///
/// # Errors
/// An unnamed index; the look-up's or the statement's error.
pub async fn create_index_if_missing<T: IntoIden>(
    manager: &SchemaManager<'_>,
    table: T,
    mut index: IndexCreateStatement,
) -> Result<(), DbErr> {
    let table = table.into_iden();
    index.table(table.clone());
    if manager.get_database_backend() == DbBackend::MySql {
        let name = index
            .get_index_spec()
            .get_name()
            .ok_or_else(|| DbErr::Custom(format!("an index on {table} has no name")))?;
        if manager.has_index(table.to_string(), name).await? {
            return Ok(());
        }
    } else {
        index.if_not_exists();
    }
    manager.create_index(index).await
}

/// Drops the index `name` from `table`, if it is there.
///
/// Asked of the catalogue on every backend: MySQL 8 has no
/// `DROP INDEX IF EXISTS` (sea-query panics when asked for one there).
///
/// # Errors
/// The look-up's or the statement's error.
pub async fn drop_index_if_present<T: IntoIden>(
    manager: &SchemaManager<'_>,
    table: T,
    name: &str,
) -> Result<(), DbErr> {
    let table = table.into_iden();
    if !manager.has_index(table.to_string(), name).await? {
        return Ok(());
    }
    manager
        .drop_index(Index::drop().name(name).table(table).to_owned())
        .await
}

/// Adds `column` to `table`, unless the table has a column of that name.
///
/// Asked of the catalogue on every backend: MySQL 8 has no
/// `ADD COLUMN IF NOT EXISTS`, and SQLite neither (sea-query leaves it out
/// there); one column per statement, as SQLite alters one at a time.
///
/// # Errors
/// The look-up's or the statement's error.
pub async fn add_column_if_missing<T: IntoIden>(
    manager: &SchemaManager<'_>,
    table: T,
    column: ColumnDef,
) -> Result<(), DbErr> {
    let table = table.into_iden();
    if manager
        .has_column(table.to_string(), column.get_column_name())
        .await?
    {
        return Ok(());
    }
    manager
        .alter_table(Table::alter().table(table).add_column(column).to_owned())
        .await
}

/// Drops `column` from `table`, if it is there (the counterpart of
/// [`add_column_if_missing`], for the same reasons).
///
/// # Errors
/// The look-up's or the statement's error.
pub async fn drop_column_if_present<T: IntoIden, C: IntoIden>(
    manager: &SchemaManager<'_>,
    table: T,
    column: C,
) -> Result<(), DbErr> {
    let (table, column) = (table.into_iden(), column.into_iden());
    if !manager
        .has_column(table.to_string(), column.to_string())
        .await?
    {
        return Ok(());
    }
    manager
        .alter_table(Table::alter().table(table).drop_column(column).to_owned())
        .await
}
