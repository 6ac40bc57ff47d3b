//! What a database error means for the inbox: duplicate, retry, or failure,
//! and whose fault it is.
//!
//! Each backend reports a unique violation differently, and only a violation
//! of the inbox index may be read as "already processed" (docs/architecture.md, rule 4).
//! Reading every unique violation as a duplicate would silently drop messages
//! whose business write broke a real constraint.
//!
//! [`blame`] says whether a failure belongs to the message at all. An
//! *outage* (the database unreachable or changing hands) and a *resource*
//! failure (it answers but cannot do the work now: a lock or statement
//! timeout, a full disk, no memory, an I/O error, read-only, shutting down)
//! are the infrastructure's; a consumer holds the delivery through them
//! instead of spending its deliveries or writing a dead letter.

use sea_orm::error::{ConnAcquireErr, RuntimeErr};
use sea_orm::{DbErr, sqlx};

/// Name of the unique index on (message_id, consumer).
pub const INBOX_INDEX: &str = "ix_inbox_message_id_consumer";

/// The inbox table, as MySQL 8 prefixes it to key names.
const INBOX_TABLE: &str = "inbox_message";

/// The column list SQLite prints when the inbox index rejects a row.
const SQLITE_INBOX_COLUMNS: &str = "inbox_message.message_id, inbox_message.consumer";

/// The backend-neutral facts of a database error, extracted once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorShape {
    /// An error the database server or engine returned.
    Database {
        /// Which engine produced it.
        backend: Engine,
        /// PostgreSQL SQLSTATE, SQLite extended result code, or MySQL SQLSTATE.
        code: Option<String>,
        /// MySQL's numeric error (1062 for a duplicate key).
        number: Option<u16>,
        /// The constraint name, where the driver reports one (PostgreSQL).
        constraint: Option<String>,
        /// The engine's message text.
        message: String,
    },
    /// The connection broke or could not be obtained: the unit may be re-run.
    ConnectionLost(String),
    /// Anything else (decode errors, bugs): not retried.
    Other(String),
}

/// The database engines seawall classifies errors for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// PostgreSQL.
    Postgres,
    /// SQLite.
    Sqlite,
    /// MySQL or MariaDB.
    MySql,
}

/// What a failed unit of work should lead to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// The inbox index rejected the marker: the message was already handled.
    InboxDuplicate,
    /// Another unique constraint rejected a write; a real error.
    UniqueViolation {
        /// Index name, or the column list where the engine reports only that.
        constraint: String,
    },
    /// Worth re-running the whole unit in a new transaction.
    Transient {
        /// Short label for logs and metrics (`serialization`, `deadlock`, `busy`...).
        reason: &'static str,
    },
    /// The database answers but cannot do this work now (a lock or statement
    /// timeout, a full disk, no memory, an I/O error, read-only, shutting
    /// down). Re-running at once would meet it again, so the executor returns
    /// it; the caller backs off (see [`blame`]).
    Resource {
        /// Short label for logs and metrics (`lock_timeout`, `disk_full`...).
        reason: &'static str,
    },
    /// Not retried.
    Permanent,
}

/// Whose fault a failed unit of work is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The message's own (or the handler's): it counts against its deliveries.
    Message,
    /// The database is unreachable or changing hands: wait until it answers.
    Outage,
    /// The database answers but cannot do the work now: back off and try
    /// again, up to a patience, without spending a delivery.
    Resource,
}

/// Whose fault `err` is (see [`Blame`]).
pub fn blame(err: &DbErr) -> Blame {
    match classify(err) {
        Failure::Transient {
            reason: OUTAGE_CONNECTION | OUTAGE_RESTART | OUTAGE_READ_ONLY,
        } => Blame::Outage,
        Failure::Resource { .. } => Blame::Resource,
        _ => Blame::Message,
    }
}

/// Classifies a SeaORM error.
pub fn classify(err: &DbErr) -> Failure {
    classify_shape(&shape_of(err))
}

/// True when `err` says the database itself is unreachable or changing hands
/// (connection refused or lost, the server shutting down, a standby that
/// answers read-only during a failover), as opposed to a failure of the unit
/// that ran. A consumer waits such an outage out instead of spending the
/// message's deliveries on it.
pub fn is_outage(err: &DbErr) -> bool {
    blame(err) == Blame::Outage
}

/// True when PostgreSQL refused `err`'s statement because an earlier one
/// failed in the same transaction (SQLSTATE `25P02`): the transaction is
/// aborted, and its `COMMIT` would answer `ROLLBACK` without an error.
pub fn is_aborted_transaction(err: &DbErr) -> bool {
    matches!(
        shape_of(err),
        ErrorShape::Database { backend: Engine::Postgres, code: Some(code), .. } if code == "25P02"
    )
}

/// True when `err` is a PostgreSQL deadlock, lock timeout or statement
/// timeout (SQLSTATE `40P01`, `55P03`, `57014`): PostgreSQL aborts the
/// statement's (sub)transaction only, so rolling back to a savepoint made
/// before it leaves the rest of the transaction as it was. (InnoDB rolls a
/// deadlocked transaction back whole; SQLite has neither.)
pub fn is_confined_to_statement(err: &DbErr) -> bool {
    matches!(
        shape_of(err),
        ErrorShape::Database { backend: Engine::Postgres, code: Some(code), .. }
            if matches!(code.as_str(), "40P01" | "55P03" | "57014")
    )
}

const OUTAGE_CONNECTION: &str = "connection";
const OUTAGE_RESTART: &str = "server_restart";
const OUTAGE_READ_ONLY: &str = "read_only";

/// Extracts the backend-neutral facts from a SeaORM error.
pub fn shape_of(err: &DbErr) -> ErrorShape {
    let runtime = match err {
        DbErr::ConnectionAcquire(ConnAcquireErr::Timeout) => {
            return ErrorShape::ConnectionLost("connection pool timed out".into());
        }
        DbErr::ConnectionAcquire(ConnAcquireErr::ConnectionClosed) => {
            return ErrorShape::ConnectionLost("connection closed".into());
        }
        DbErr::Conn(r) | DbErr::Exec(r) | DbErr::Query(r) => r,
        other => return ErrorShape::Other(other.to_string()),
    };
    let sqlx_err = match runtime {
        RuntimeErr::SqlxError(e) => e.as_ref(),
        other => return ErrorShape::Other(other.to_string()),
    };
    match sqlx_err {
        sqlx::Error::Database(db) => database_shape(db.as_ref()),
        sqlx::Error::Io(e) => ErrorShape::ConnectionLost(e.to_string()),
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            ErrorShape::ConnectionLost(sqlx_err.to_string())
        }
        // Also what a connection attempt meets when the server (or a proxy
        // in front of it) hangs up mid-handshake. A protocol error that is
        // really the statement's own keeps recurring while the database
        // answers; the consumer then counts it against the message.
        sqlx::Error::Protocol(p) => ErrorShape::ConnectionLost(p.clone()),
        // A TLS handshake cut during a failover: the server went away.
        sqlx::Error::Tls(e) => ErrorShape::ConnectionLost(e.to_string()),
        other => ErrorShape::Other(other.to_string()),
    }
}

fn database_shape(db: &dyn sqlx::error::DatabaseError) -> ErrorShape {
    let (backend, number) =
        if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
            (Engine::MySql, Some(my.number()))
        } else if db
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .is_some()
        {
            (Engine::Postgres, None)
        } else {
            (Engine::Sqlite, None)
        };
    ErrorShape::Database {
        backend,
        code: db.code().map(|c| c.into_owned()),
        number,
        constraint: db.constraint().map(str::to_owned),
        message: db.message().to_owned(),
    }
}

/// Classifies extracted error facts. Pure, so it can be tested over every
/// shape without a database.
pub fn classify_shape(shape: &ErrorShape) -> Failure {
    match shape {
        ErrorShape::ConnectionLost(_) => Failure::Transient {
            reason: OUTAGE_CONNECTION,
        },
        ErrorShape::Other(_) => Failure::Permanent,
        ErrorShape::Database {
            backend,
            code,
            number,
            constraint,
            message,
        } => match backend {
            Engine::Postgres => classify_postgres(code.as_deref(), constraint.as_deref()),
            Engine::Sqlite => classify_sqlite(code.as_deref(), message),
            Engine::MySql => classify_mysql(*number, message),
        },
    }
}

fn classify_postgres(code: Option<&str>, constraint: Option<&str>) -> Failure {
    match code {
        Some("23505") => match constraint {
            Some(INBOX_INDEX) => Failure::InboxDuplicate,
            Some(name) => Failure::UniqueViolation {
                constraint: name.to_owned(),
            },
            None => Failure::UniqueViolation {
                constraint: "unknown".into(),
            },
        },
        Some("40001") => Failure::Transient {
            reason: "serialization",
        },
        Some("40P01") => Failure::Transient { reason: "deadlock" },
        // lock_timeout (or NOWAIT) while another session holds the lock,
        // statement_timeout, and class 53/58: the server cannot do the work
        // now. disk_full, out_of_memory, insufficient_resources, io_error,
        // system_error. (53300, too many connections, is an outage below.)
        Some("55P03") => Failure::Resource {
            reason: "lock_timeout",
        },
        Some("57014") => Failure::Resource {
            reason: "statement_timeout",
        },
        Some("53100") => Failure::Resource {
            reason: "disk_full",
        },
        Some("53200") => Failure::Resource {
            reason: "out_of_memory",
        },
        Some("53000") => Failure::Resource {
            reason: "insufficient_resources",
        },
        Some("58030" | "58000") => Failure::Resource { reason: "io_error" },
        // Class 08: connection exceptions; 57P01..03: server shutting down or restarting.
        Some(c) if c.starts_with("08") => Failure::Transient {
            reason: OUTAGE_CONNECTION,
        },
        Some("57P01" | "57P02" | "57P03") => Failure::Transient {
            reason: OUTAGE_RESTART,
        },
        // too_many_connections: every process is refused, not this message.
        Some("53300") => Failure::Transient {
            reason: OUTAGE_CONNECTION,
        },
        // A write reached a standby: the primary is failing over (or a proxy
        // still routes to the old one). Re-running on a new connection finds
        // the new primary.
        Some("25006") => Failure::Transient {
            reason: OUTAGE_READ_ONLY,
        },
        _ => Failure::Permanent,
    }
}

fn classify_sqlite(code: Option<&str>, message: &str) -> Failure {
    let Some(code) = code.and_then(|c| c.parse::<i32>().ok()) else {
        return Failure::Permanent;
    };
    match code {
        // SQLITE_CONSTRAINT_UNIQUE (2067) and SQLITE_CONSTRAINT_PRIMARYKEY (1555):
        // the message names the columns, not the index.
        2067 | 1555 => {
            let columns = message
                .split_once("constraint failed: ")
                .map_or(message, |(_, cols)| cols)
                .trim();
            if columns == SQLITE_INBOX_COLUMNS {
                Failure::InboxDuplicate
            } else {
                Failure::UniqueViolation {
                    constraint: columns.to_owned(),
                }
            }
        }
        c if c & 0xff == 5 => Failure::Transient { reason: "busy" },
        c if c & 0xff == 6 => Failure::Transient { reason: "locked" },
        // SQLITE_NOMEM, SQLITE_READONLY (the file or its directory made
        // read-only), SQLITE_IOERR, SQLITE_FULL (the disk), SQLITE_CANTOPEN.
        c if c & 0xff == 7 => Failure::Resource {
            reason: "out_of_memory",
        },
        c if c & 0xff == 8 => Failure::Resource {
            reason: "read_only",
        },
        c if c & 0xff == 10 => Failure::Resource { reason: "io_error" },
        c if c & 0xff == 13 => Failure::Resource {
            reason: "disk_full",
        },
        c if c & 0xff == 14 => Failure::Resource {
            reason: "cannot_open",
        },
        _ => Failure::Permanent,
    }
}

fn classify_mysql(number: Option<u16>, message: &str) -> Failure {
    match number {
        // "Duplicate entry 'x-y' for key 'ix_inbox_message_id_consumer'" (MySQL 8
        // prefixes the key with the table: 'inbox_message.ix_...').
        Some(1062) => {
            let key = message
                .rsplit_once("for key ")
                .map(|(_, k)| k.trim().trim_matches(|c| c == '\'' || c == '`'))
                .unwrap_or("unknown");
            // Index names are per table in MySQL: an index of that name on
            // another table is a business constraint, not the inbox.
            let (table, name) = key
                .rsplit_once('.')
                .map_or((None, key), |(t, n)| (Some(t), n));
            if name == INBOX_INDEX && table.is_none_or(|t| t == INBOX_TABLE) {
                Failure::InboxDuplicate
            } else {
                Failure::UniqueViolation {
                    constraint: key.to_owned(),
                }
            }
        }
        Some(1213) => Failure::Transient { reason: "deadlock" },
        Some(1205) => Failure::Resource {
            reason: "lock_timeout",
        },
        // The server (or a replica promoted late) refuses writes: read_only
        // and super_read_only (1290, 1836), innodb_read_only (1874).
        Some(1290 | 1836 | 1874) => Failure::Resource {
            reason: "read_only",
        },
        // max_execution_time (MySQL) and max_statement_time (MariaDB).
        Some(3024 | 1969) => Failure::Resource {
            reason: "statement_timeout",
        },
        // Disk or table full, out of memory, out of sort memory.
        Some(1021 | 1114) => Failure::Resource {
            reason: "disk_full",
        },
        Some(1037 | 1038 | 1041) => Failure::Resource {
            reason: "out_of_memory",
        },
        // Server shutting down.
        Some(1053) => Failure::Transient {
            reason: OUTAGE_RESTART,
        },
        // Server gone, lost during a query, too many connections.
        Some(2006 | 2013 | 1040) => Failure::Transient {
            reason: OUTAGE_CONNECTION,
        },
        _ => Failure::Permanent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(
        backend: Engine,
        code: &str,
        number: Option<u16>,
        constraint: Option<&str>,
        message: &str,
    ) -> ErrorShape {
        ErrorShape::Database {
            backend,
            code: Some(code.into()),
            number,
            constraint: constraint.map(Into::into),
            message: message.into(),
        }
    }

    #[test]
    fn postgres_inbox_violation_is_a_duplicate_and_others_are_not() {
        let dup = db(
            Engine::Postgres,
            "23505",
            None,
            Some(INBOX_INDEX),
            "duplicate key",
        );
        assert_eq!(classify_shape(&dup), Failure::InboxDuplicate);
        let other = db(
            Engine::Postgres,
            "23505",
            None,
            Some("ix_credit_reference"),
            "duplicate key",
        );
        assert_eq!(
            classify_shape(&other),
            Failure::UniqueViolation {
                constraint: "ix_credit_reference".into()
            }
        );
    }

    #[test]
    fn sqlite_is_classified_by_column_list() {
        let dup = db(
            Engine::Sqlite,
            "2067",
            None,
            None,
            "UNIQUE constraint failed: inbox_message.message_id, inbox_message.consumer",
        );
        assert_eq!(classify_shape(&dup), Failure::InboxDuplicate);
        let other = db(
            Engine::Sqlite,
            "2067",
            None,
            None,
            "UNIQUE constraint failed: credit.reference",
        );
        assert_eq!(
            classify_shape(&other),
            Failure::UniqueViolation {
                constraint: "credit.reference".into()
            }
        );
        let busy = db(Engine::Sqlite, "517", None, None, "database is locked");
        assert_eq!(classify_shape(&busy), Failure::Transient { reason: "busy" });
    }

    #[test]
    fn mysql_is_classified_by_key_name() {
        let dup = db(
            Engine::MySql,
            "23000",
            Some(1062),
            None,
            "Duplicate entry 'a-credit' for key 'inbox_message.ix_inbox_message_id_consumer'",
        );
        assert_eq!(classify_shape(&dup), Failure::InboxDuplicate);
        let mariadb = db(
            Engine::MySql,
            "23000",
            Some(1062),
            None,
            "Duplicate entry 'r1' for key 'ix_credit_reference'",
        );
        assert_eq!(
            classify_shape(&mariadb),
            Failure::UniqueViolation {
                constraint: "ix_credit_reference".into()
            }
        );
        let same_name_elsewhere = db(
            Engine::MySql,
            "23000",
            Some(1062),
            None,
            "Duplicate entry 'a-credit' for key 'audit_copy.ix_inbox_message_id_consumer'",
        );
        assert_eq!(
            classify_shape(&same_name_elsewhere),
            Failure::UniqueViolation {
                constraint: "audit_copy.ix_inbox_message_id_consumer".into()
            }
        );
    }

    #[test]
    fn serialization_failures_and_deadlocks_are_transient() {
        for code in ["40001", "40P01"] {
            let shape = db(Engine::Postgres, code, None, None, "");
            assert!(matches!(classify_shape(&shape), Failure::Transient { .. }));
        }
        let check = db(Engine::Postgres, "23514", None, None, "check");
        assert_eq!(classify_shape(&check), Failure::Permanent);
    }

    #[test]
    fn resource_failures_are_the_infrastructures_not_the_messages() {
        let resource = [
            db(Engine::Postgres, "55P03", None, None, "lock timeout"),
            db(Engine::Postgres, "57014", None, None, "statement timeout"),
            db(Engine::Postgres, "53100", None, None, "disk full"),
            db(Engine::Postgres, "53200", None, None, "out of memory"),
            db(Engine::Postgres, "58030", None, None, "could not write"),
            db(
                Engine::MySql,
                "HY000",
                Some(1205),
                None,
                "lock wait timeout",
            ),
            db(Engine::MySql, "HY000", Some(1290), None, "--read-only"),
            db(Engine::MySql, "25006", Some(1836), None, "read-only mode"),
            db(
                Engine::MySql,
                "HY000",
                Some(1969),
                None,
                "max_statement_time",
            ),
            db(Engine::Sqlite, "8", None, None, "readonly database"),
            db(
                Engine::Sqlite,
                "1032",
                None,
                None,
                "readonly database moved",
            ),
            db(Engine::Sqlite, "10", None, None, "disk I/O error"),
            db(Engine::Sqlite, "13", None, None, "database or disk is full"),
        ];
        for shape in resource {
            assert!(
                matches!(classify_shape(&shape), Failure::Resource { .. }),
                "{shape:?}"
            );
        }
        let shutting_down = db(Engine::MySql, "08S01", Some(1053), None, "shutdown");
        assert_eq!(
            classify_shape(&shutting_down),
            Failure::Transient {
                reason: OUTAGE_RESTART
            }
        );
        let constraint = db(Engine::Postgres, "23514", None, None, "check");
        assert_eq!(classify_shape(&constraint), Failure::Permanent);
    }

    #[test]
    fn a_standby_refusing_writes_is_an_outage_not_a_message_failure() {
        let read_only = db(Engine::Postgres, "25006", None, None, "read-only");
        assert_eq!(
            classify_shape(&read_only),
            Failure::Transient {
                reason: OUTAGE_READ_ONLY
            }
        );
    }
}
