//! Column shapes that differ per backend.
//!
//! Identifiers that take part in indexes are bounded `varchar`s because MySQL
//! cannot index unbounded text; times keep microseconds everywhere because
//! MySQL's plain `timestamp` would truncate them and break ordering by time.

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
