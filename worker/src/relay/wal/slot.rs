//! The WAL relay's slot: its name, its creation and checks at start-up,
//! dropping it, and the replication connection that streams it.

use std::collections::BTreeMap;
use std::time::Duration;

use pgwire_replication::{ReplicationConfig, TlsConfig};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, FromQueryResult, Statement};

use super::WalError;

/// A SQL literal-free check of a slot name: PostgreSQL allows lower-case
/// letters, digits and underscores, at most 63 bytes.
pub fn valid_slot_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The default slot name for a database URL: `seawall_` and the database
/// name (lower-cased, other characters as `_`), so services sharing a
/// PostgreSQL cluster get a slot each.
pub fn default_slot_name(database_url: &str) -> String {
    let database = url::Url::parse(database_url)
        .ok()
        .map(|u| u.path().trim_start_matches('/').to_owned())
        .unwrap_or_default();
    let mut slot: String = format!("seawall_{database}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    slot.truncate(63);
    slot
}

#[derive(Debug, FromQueryResult)]
struct Setting {
    value: String,
}

#[derive(Debug, FromQueryResult)]
struct SlotRow {
    plugin: Option<String>,
    slot_type: String,
    database: Option<String>,
    active: bool,
}

async fn one_text(db: &DatabaseConnection, sql: &str) -> Result<String, DbErr> {
    Ok(
        Setting::find_by_statement(Statement::from_string(DbBackend::Postgres, sql))
            .one(db)
            .await?
            .map(|s| s.value)
            .unwrap_or_default(),
    )
}

async fn slot_row(db: &DatabaseConnection, slot: &str) -> Result<Option<SlotRow>, DbErr> {
    SlotRow::find_by_statement(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT plugin::text AS plugin, slot_type, database::text AS database, active FROM pg_replication_slots WHERE slot_name = $1",
        [slot.into()],
    ))
    .one(db)
    .await
}

/// Checks that the server can run the WAL relay and creates its slot and
/// publication when missing. Several relays starting at once create them
/// once.
///
/// # Errors
/// [`WalError::WalLevel`] naming the setting to change,
/// [`WalError::ForeignSlot`] for a slot of that name made for something
/// else, or the database error (for example missing `REPLICATION`
/// privilege).
pub async fn prepare(db: &DatabaseConnection, slot: &str) -> Result<(), WalError> {
    let level = one_text(db, "SELECT current_setting('wal_level') AS value").await?;
    if level != "logical" {
        return Err(WalError::WalLevel(level));
    }
    let database = one_text(db, "SELECT current_database()::text AS value").await?;
    if slot_row(db, slot).await?.is_none() {
        // A new slot starts at its creation; an old slot's position says
        // nothing about it.
        db.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "DELETE FROM wal_relay_position WHERE slot = $1",
            [slot.into()],
        ))
        .await?;
        let created = db
            .execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                [slot.into()],
            ))
            .await;
        // Another relay may have created it in the meantime.
        if let Err(err) = created
            && slot_row(db, slot).await?.is_none()
        {
            return Err(err.into());
        }
    }
    wait_consistent(db, slot).await?;
    let Some(row) = slot_row(db, slot).await? else {
        return Err(WalError::ForeignSlot {
            slot: slot.to_owned(),
            problem: "vanished while being checked".into(),
        });
    };
    let problem = if row.slot_type != "logical" || row.plugin.as_deref() != Some("pgoutput") {
        Some(format!(
            "is a {} slot of plugin {:?}, not a logical pgoutput slot",
            row.slot_type, row.plugin
        ))
    } else if row.database.as_deref() != Some(database.as_str()) {
        Some(format!(
            "belongs to database {:?}, not {database:?}",
            row.database
        ))
    } else {
        None
    };
    if let Some(problem) = problem {
        return Err(WalError::ForeignSlot {
            slot: slot.to_owned(),
            problem,
        });
    }
    // An empty publication: logical messages reach the slot whatever the
    // publication holds, and no table's changes are decoded for nothing.
    let exists = one_text(
        db,
        &format!("SELECT count(*)::text AS value FROM pg_publication WHERE pubname = '{slot}'"),
    )
    .await?;
    if exists == "0" {
        let created = db
            .execute_unprepared(&format!("CREATE PUBLICATION {slot}"))
            .await;
        if let Err(err) = created
            && !err.to_string().contains("already exists")
        {
            return Err(err.into());
        }
    }
    Ok(())
}

/// How long start-up waits for another process's slot creation to finish.
const SLOT_CREATION_WAIT: Duration = Duration::from_secs(120);

/// Waits until `slot` decodes every transaction that commits from now on.
/// A slot another process is still creating is listed before it is: its
/// creation waits for the transactions running at its start to end, and
/// events committed until then would never reach it. Its confirmed
/// position appears once it is ready.
async fn wait_consistent(db: &DatabaseConnection, slot: &str) -> Result<(), WalError> {
    let deadline = tokio::time::Instant::now() + SLOT_CREATION_WAIT;
    loop {
        let ready = one_text(
            db,
            &format!(
                "SELECT (count(*) FILTER (WHERE confirmed_flush_lsn IS NOT NULL))::text AS value \
                 FROM pg_replication_slots WHERE slot_name = '{slot}'"
            ),
        )
        .await?;
        if ready != "0" {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(WalError::ForeignSlot {
                slot: slot.to_owned(),
                problem: format!(
                    "has not become ready in {SLOT_CREATION_WAIT:?} (its creation waits for every transaction running when it began to end)"
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Drops the slot and its publication (`seawall relay --drop-slot`): the
/// WAL it retained is freed, and events not yet relayed from it are gone.
/// Returns whether a slot was dropped.
///
/// # Errors
/// [`WalError::SlotActive`] while a relay streams from it; the database
/// error otherwise.
pub async fn drop_slot(db: &DatabaseConnection, slot: &str) -> Result<bool, WalError> {
    let dropped = match slot_row(db, slot).await? {
        Some(row) if row.active => return Err(WalError::SlotActive(slot.to_owned())),
        Some(_) => {
            db.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_drop_replication_slot($1)",
                [slot.into()],
            ))
            .await?;
            true
        }
        None => false,
    };
    db.execute_unprepared(&format!("DROP PUBLICATION IF EXISTS {slot}"))
        .await?;
    // A new slot of the same name starts from its own creation.
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "DELETE FROM wal_relay_position WHERE slot = $1",
        [slot.into()],
    ))
    .await?;
    Ok(dropped)
}

/// The replication connection's settings, from `database_url`.
pub(super) fn replication_config(url: &str, slot: &str) -> Result<ReplicationConfig, WalError> {
    let parsed = url::Url::parse(url).map_err(|e| WalError::Url(e.to_string()))?;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|e| WalError::Url(e.to_string()))
    };
    let host = parsed.host_str().unwrap_or("localhost").to_owned();
    let user = match parsed.username() {
        "" => "postgres".to_owned(),
        user => decode(user)?,
    };
    let password = decode(parsed.password().unwrap_or(""))?;
    let database = match decode(parsed.path().trim_start_matches('/'))? {
        d if d.is_empty() => user.clone(),
        d => d,
    };
    let query: BTreeMap<String, String> = parsed.query_pairs().into_owned().collect();
    let root = query.get("sslrootcert").map(Into::into);
    let tls = match query.get("sslmode").map(String::as_str) {
        None | Some("disable" | "allow" | "prefer") => TlsConfig::disabled(),
        Some("require") => TlsConfig::require(),
        Some("verify-ca") => TlsConfig::verify_ca(root),
        Some("verify-full") => TlsConfig::verify_full(root),
        Some(other) => return Err(WalError::Url(format!("unknown sslmode {other:?}"))),
    };
    Ok(
        ReplicationConfig::new(host, user, password, database, slot, slot)
            .with_port(parsed.port().unwrap_or(5432))
            .with_tls(tls)
            .with_status_interval(Duration::from_secs(1))
            .with_wakeup_interval(Duration::from_secs(1))
            .with_application_name(format!("seawall-relay {}", std::process::id())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_follow_the_database() {
        assert_eq!(
            default_slot_name("postgres://u:p@h:5432/Orders-Prod?sslmode=require"),
            "seawall_orders_prod"
        );
        assert!(valid_slot_name(&default_slot_name(
            "postgres://h/t_0123456789abcdef0123456789abcdef"
        )));
        assert!(!valid_slot_name("Seawall"));
        assert!(!valid_slot_name(&"a".repeat(64)));
        assert!(!valid_slot_name("x; DROP TABLE y"));
    }

    #[test]
    fn the_replication_connection_follows_database_url() {
        let c = replication_config(
            "postgres://app%40x:p%2Fw@db.example:6543/orders?sslmode=require",
            "seawall_orders",
        )
        .unwrap();
        assert_eq!((c.host.as_str(), c.port), ("db.example", 6543));
        assert_eq!((c.user.as_str(), c.password.as_str()), ("app@x", "p/w"));
        assert_eq!(c.database, "orders");
        assert!(c.tls.mode.requires_tls());
        assert!(replication_config("postgres://h/d?sslmode=sometimes", "s").is_err());
    }
}
