//! Column shapes that differ per backend.
//!
//! Identifiers that take part in indexes are bounded `varchar`s because MySQL
//! cannot index unbounded text; times keep microseconds everywhere because
//! MySQL's plain `timestamp` would truncate them and break ordering by time.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

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

/// On MySQL and MariaDB, stores any Unicode character and compares text byte
/// for byte, whatever the database's default (often case-insensitive, which
/// would make an index take `Order-1` and `order-1` for one key). The other
/// backends already do both.
pub fn binary_text(
    backend: DbBackend,
    table: &mut TableCreateStatement,
) -> &mut TableCreateStatement {
    if backend == DbBackend::MySql {
        table.character_set("utf8mb4").collate("utf8mb4_bin");
    }
    table
}
