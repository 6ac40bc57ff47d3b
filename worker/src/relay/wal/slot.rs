//! The replication connection that streams the WAL relay's slot (the slot's
//! own statements are `service::wal::slot`'s).

use std::collections::BTreeMap;
use std::time::Duration;

use pgwire_replication::{ReplicationConfig, TlsConfig};

use super::WalError;

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
            // Decoded messages waiting for the reader: each may be as large
            // as one `enqueue_all`, so the buffer is counted in few of them
            // (the library's default of 8,192 would hold a gigabyte of
            // 128 KiB events).
            .with_buffer_size(BUFFERED_MESSAGES)
            .with_application_name(format!("seawall-relay {}", std::process::id())),
    )
}

/// Replication messages buffered between the stream and the reader.
const BUFFERED_MESSAGES: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

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
