//! The connection options a PostgreSQL `database_url` may carry, checked at
//! start-up: seawall opens two kinds of connection from it (the pool,
//! through sqlx, and the WAL relay's replication connection), and neither
//! may ignore an option in silence. An option both honour passes; one they
//! cannot honour stops start-up with its name and the remedy, because an
//! ignored `channel_binding=require` is a silent downgrade and an ignored
//! `target_session_attrs=read-write` a primary that is not one.

/// Query keys both connections honour, under libpq's names and the
/// spellings sqlx also takes.
const HONOURED: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "user",
    "password",
    "dbname",
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "options",
    "application_name",
    "fallback_application_name",
    "statement-cache-capacity",
];

/// The `PG*` variables that stand for an option neither connection
/// honours, by the option's name: set in the environment, they would be
/// ignored as silently as in the URL.
const VARIABLES: &[(&str, &str)] = &[
    ("PGCHANNELBINDING", "channel_binding"),
    ("PGTARGETSESSIONATTRS", "target_session_attrs"),
    ("PGCONNECT_TIMEOUT", "connect_timeout"),
    ("PGSSLROOTCERT", "sslrootcert"),
    ("PGGSSENCMODE", "gssencmode"),
    ("PGHOST", "host"),
    ("PGHOSTADDR", "hostaddr"),
    ("PGPORT", "port"),
];

/// Checks the options of PostgreSQL URL `url`; the error names the first
/// option neither connection would honour, and what to do instead.
///
/// # Errors
/// A sentence naming the option, for the configuration error of the key
/// the URL came from.
pub fn check(url: &str) -> Result<(), String> {
    let authority = url
        .split_once("://")
        .map_or("", |(_, rest)| rest.split(['/', '?']).next().unwrap_or(""));
    if authority.contains(',') {
        return Err(multi_host());
    }
    let parsed = url::Url::parse(url).map_err(|e| format!("is not a URL: {e}"))?;
    for (key, value) in parsed.query_pairs() {
        refused(&key, &value)?;
    }
    Ok(())
}

/// Checks the `PG*` variables of `env` as [`check`] checks a URL's
/// options (the relay, like libpq, reads them where the URL is silent).
///
/// # Errors
/// A sentence naming the variable and the option it stands for.
pub fn check_env(env: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    for (variable, key) in VARIABLES {
        if let Some(value) = env(variable).filter(|v| !v.is_empty()) {
            refused(key, &value).map_err(|why| format!("the environment's {variable}: {why}"))?;
        }
    }
    Ok(())
}

/// The error for option `key` set to `value`, if it cannot be honoured.
fn refused(key: &str, value: &str) -> Result<(), String> {
    let remedy = match (key, value) {
        ("channel_binding", "disable" | "prefer") => return Ok(()),
        ("channel_binding", _) => {
            "channel_binding=require is not supported by seawall's connections (the pool's sqlx and the WAL relay authenticate with SCRAM without channel binding); use sslmode=verify-full to authenticate the server instead"
        }
        ("target_session_attrs", "any") => return Ok(()),
        ("gssencmode", "disable" | "allow" | "prefer") => return Ok(()),
        ("gssencmode", _) => {
            "gssencmode=require is not supported: seawall's connections do not speak GSSAPI encryption; use TLS (sslmode)"
        }
        ("target_session_attrs", _) => {
            "target_session_attrs is not supported: point database_url at the primary's address (a Patroni or pgbouncer endpoint that follows the leader)"
        }
        ("connect_timeout", _) => {
            "connect_timeout is not supported by seawall's connections: remove it (the pool gives up acquiring a connection after its own timeout, and the WAL relay retries with backoff)"
        }
        ("keepalives" | "keepalives_idle" | "keepalives_interval" | "keepalives_count", _) => {
            "TCP keepalive options are not supported by seawall's connections: remove them (the WAL relay ends a replication session that stays silent, see docs/outbox.md)"
        }
        ("sslrootcert" | "ssl-root-cert" | "ssl-ca", "system") => {
            "sslrootcert=system is not supported: give the system's CA bundle as a file (for example /etc/ssl/certs/ca-certificates.crt)"
        }
        ("host" | "hostaddr" | "port", v) if v.contains(',') => return Err(multi_host()),
        (k, _) if HONOURED.contains(&k) => return Ok(()),
        _ => {
            return Err(format!(
                "option {key:?} is not one seawall's connections honour (they take {}): remove it",
                HONOURED.join(", ")
            ));
        }
    };
    Err(format!("option {key:?}: {remedy}"))
}

/// The error for a URL naming several hosts.
fn multi_host() -> String {
    "names several hosts, which seawall's connections do not try in turn: give one host (a Patroni or pgbouncer endpoint that follows the leader)".into()
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn honoured_options_pass() {
        for url in [
            "postgres://u:p@h:5432/d",
            "postgres://h/d?sslmode=verify-full&sslrootcert=/ca.pem&application_name=x",
            "postgres:///d?host=/run/postgresql&channel_binding=prefer",
            "postgresql://h/d?target_session_attrs=any&options=-c%20search_path%3Dapp",
            "postgres://h/d?gssencmode=disable&fallback_application_name=x",
        ] {
            assert_eq!(check(url), Ok(()), "{url}");
        }
    }

    #[test]
    fn variables_standing_for_refused_options_are_refused_by_name() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            super::check_env(&vars(&[("PGUSER", "app"), ("PGGSSENCMODE", "disable")])),
            Ok(())
        );
        for (pairs, named) in [
            (&[("PGCHANNELBINDING", "require")][..], "PGCHANNELBINDING"),
            (&[("PGSSLROOTCERT", "system")][..], "PGSSLROOTCERT"),
            (&[("PGHOST", "a,b")][..], "PGHOST"),
            (
                &[("PGTARGETSESSIONATTRS", "read-write")][..],
                "PGTARGETSESSIONATTRS",
            ),
        ] {
            let err = super::check_env(&vars(pairs)).unwrap_err();
            assert!(err.contains(named), "{err}");
        }
    }

    #[test]
    fn options_no_connection_honours_are_refused_by_name() {
        for (url, named) in [
            ("postgres://h/d?channel_binding=require", "channel_binding"),
            ("postgres://h/d?connect_timeout=5", "connect_timeout"),
            ("postgres://h/d?keepalives_idle=30", "keepalives_idle"),
            (
                "postgres://h/d?target_session_attrs=read-write",
                "target_session_attrs",
            ),
            ("postgres://h/d?sslrootcert=system", "sslrootcert=system"),
            ("postgres://h/d?sslmdoe=require", "sslmdoe"),
            ("postgres://a:5432,b:5432/d", "several hosts"),
            ("postgres:///d?host=a,b", "several hosts"),
        ] {
            let err = check(url).unwrap_err();
            assert!(err.contains(named), "{url}: {err}");
        }
    }
}
