//! The replication connection that streams the WAL relay's slot (the slot's
//! own statements are `service::wal::slot`'s), made from `database_url` and
//! the environment the way libpq (and the pool, through sqlx) makes one: the
//! same server, user, password and TLS, so a server that accepts the pool
//! accepts the relay too.
//!
//! Each setting comes from the URL's query (`host`, `hostaddr`, `port`,
//! `user`, `password`, `dbname`, `sslmode`, `sslrootcert`, `sslcert`,
//! `sslkey`, `options`), else from the URL itself, else from the `PG*`
//! variable of that name, else from libpq's default; a missing password is
//! looked up in the password file (`PGPASSFILE`, or `~/.pgpass`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use pgwire_replication::{ReplicationConfig, TlsConfig};

use super::WalError;

/// The replication connection's settings, from `database_url` and the
/// process's environment.
pub(super) fn replication_config(
    url: &str,
    slot: &str,
    holder_timeout: Duration,
) -> Result<ReplicationConfig, WalError> {
    let config = connection(url, slot, &|name| std::env::var(name).ok())?;
    with_sender_timeout(config, holder_timeout)
}

/// `config` with the session's `wal_sender_timeout` set to `timeout`
/// (PostgreSQL lets each replication connection set its own): how long
/// the server keeps the slot for this session once it falls silent. A
/// value in the connection's own `options` is refused rather than
/// overridden in silence.
fn with_sender_timeout(
    config: ReplicationConfig,
    timeout: Duration,
) -> Result<ReplicationConfig, WalError> {
    let given = config.options.clone().unwrap_or_default();
    if given.contains("wal_sender_timeout") {
        return Err(WalError::Url(
            "options (or PGOPTIONS) sets wal_sender_timeout, which the WAL relay sets itself from relay_lease_ms (so a standby takes over a silent holder within the duplicate window): remove it there and set relay_lease_ms".into(),
        ));
    }
    // At least 1 ms: 0 would mean never.
    let millis = timeout.as_millis().clamp(1, u128::from(u32::MAX));
    let options = format!("{given} -c wal_sender_timeout={millis}");
    Ok(config.with_options(options.trim_start()))
}

/// The default slot name for `database_url`: after the database the
/// replication connection opens (`dbname`, the URL's path, `PGDATABASE`,
/// else the user's name, as libpq picks it), so services sharing a cluster
/// get a slot each whichever way their URL names the database.
pub fn default_slot_name(database_url: &str) -> String {
    match connection(database_url, "", &|name| std::env::var(name).ok()) {
        Ok(config) => service::wal::slot::slot_name_for(&config.database),
        Err(_) => service::wal::slot::legacy_slot_name(database_url),
    }
}

/// A variable of the environment, by name.
type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// [`replication_config`] with the environment given.
fn connection(url: &str, slot: &str, env: Env<'_>) -> Result<ReplicationConfig, WalError> {
    let parsed = url::Url::parse(url).map_err(|e| WalError::Url(e.to_string()))?;
    let sources = Sources {
        query: parsed.query_pairs().into_owned().collect(),
        env,
    };
    // A socket directory may come percent-encoded in the URL's host; an
    // IPv6 address comes in brackets.
    let url_host = match parsed.host_str() {
        Some(host) => Some(decode(host.trim_start_matches('[').trim_end_matches(']'))?),
        None => None,
    };
    let host = sources.setting("host", url_host, "PGHOST");
    let hostaddr = sources.setting("hostaddr", None, "PGHOSTADDR");
    let port = match sources.setting("port", parsed.port().map(|p| p.to_string()), "PGPORT") {
        Some(port) => port
            .parse::<u16>()
            .map_err(|_| WalError::Url(format!("port {port:?} is not a port number")))?,
        None => 5432,
    };
    // Without a host, the server's socket where it usually is, as sqlx
    // looks for it; else TCP on localhost.
    let host = host.unwrap_or_else(|| default_host(port));
    let url_user = match parsed.username() {
        "" => None,
        user => Some(decode(user)?),
    };
    let user = sources
        .setting("user", url_user, "PGUSER")
        .or_else(|| env("USER"))
        .unwrap_or_else(|| "postgres".into());
    let path = decode(parsed.path().trim_start_matches('/'))?;
    let database = sources
        .setting("dbname", Some(path), "PGDATABASE")
        .unwrap_or_else(|| user.clone());
    let url_password = parsed.password().map(decode).transpose()?;
    let password = sources
        .setting("password", url_password, "PGPASSWORD")
        .or_else(|| password_file(env, &host, port, &database, &user))
        .unwrap_or_default();
    let mut tls = tls_config(&sources)?;
    // `hostaddr` is where to connect; `host` stays the name TLS checks.
    let address = match hostaddr {
        Some(addr) => {
            tls = tls.with_sni_hostname(host.clone());
            addr
        }
        None => host,
    };
    let mut config = ReplicationConfig::new(address, user, password, database, slot, slot)
        .with_port(port)
        .with_tls(tls)
        .with_status_interval(Duration::from_secs(1))
        .with_wakeup_interval(Duration::from_secs(1))
        // Few: the read-ahead is bounded in bytes past the library
        // (`super::ahead`), not in messages.
        .with_buffer_size(super::ahead::LIBRARY_MESSAGES)
        .with_application_name(format!("seawall-relay {}", std::process::id()));
    if let Some(options) = sources.setting("options", None, "PGOPTIONS") {
        config = config.with_options(options);
    }
    Ok(config)
}

/// Where the connection's settings come from: the URL's query and the
/// environment, looked up in libpq's order so both connections agree.
struct Sources<'a> {
    /// The URL's query, by key.
    query: BTreeMap<String, String>,
    /// The environment.
    env: Env<'a>,
}

impl Sources<'_> {
    /// The setting `key`, with `from_url` the URL's own part for it and
    /// `var` its `PG*` variable: one lookup for every setting, so none of
    /// them takes its sources in another order.
    fn setting(&self, key: &str, from_url: Option<String>, var: &str) -> Option<String> {
        // The query first (under libpq's name, or one of the spellings sqlx
        // also takes), then the URL's own part, then the environment.
        let aliases: &[&str] = match key {
            "sslmode" => &["ssl-mode"],
            "sslrootcert" => &["ssl-root-cert", "ssl-ca"],
            "sslcert" => &["ssl-cert"],
            "sslkey" => &["ssl-key"],
            _ => &[],
        };
        std::iter::once(key)
            .chain(aliases.iter().copied())
            .find_map(|k| self.query.get(k).cloned())
            .or(from_url)
            .filter(|v| !v.is_empty())
            .or_else(|| (self.env)(var).filter(|v| !v.is_empty()))
    }
}

/// A part of the URL, percent-decoded: a user, password or socket
/// directory may hold characters a URL cannot.
fn decode(s: &str) -> Result<String, WalError> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|e| WalError::Url(e.to_string()))
}

/// The host when none is given, for the server's port: the pool (through
/// sqlx) connects there without one, and the relay must reach the same
/// server.
fn default_host(port: u16) -> String {
    ["/var/run/postgresql", "/private/tmp", "/tmp"]
        .into_iter()
        .find(|dir| {
            std::path::Path::new(dir)
                .join(format!(".s.PGSQL.{port}"))
                .exists()
        })
        .unwrap_or("localhost")
        .to_owned()
}

/// The connection's TLS, from `sslmode` and its certificates as libpq reads
/// them: a server that requires TLS of the pool requires it of the relay.
fn tls_config(sources: &Sources<'_>) -> Result<TlsConfig, WalError> {
    let file = |key: &str, var: &str| sources.setting(key, None, var).map(PathBuf::from);
    let root = file("sslrootcert", "PGSSLROOTCERT");
    let mode = sources
        .setting("sslmode", None, "PGSSLMODE")
        .unwrap_or_else(|| "prefer".into());
    let mut tls = match mode.as_str() {
        "disable" => TlsConfig::disabled(),
        // TLS when the server offers it, as the pool does.
        "allow" | "prefer" => TlsConfig {
            mode: pgwire_replication::SslMode::Prefer,
            ..TlsConfig::default()
        },
        // libpq checks the chain of `require` when a root certificate is
        // given.
        "require" if root.is_some() => TlsConfig::verify_ca(root),
        "require" => TlsConfig::require(),
        "verify-ca" => TlsConfig::verify_ca(root),
        "verify-full" => TlsConfig::verify_full(root),
        other => return Err(WalError::Url(format!("unknown sslmode {other:?}"))),
    };
    match (file("sslcert", "PGSSLCERT"), file("sslkey", "PGSSLKEY")) {
        (Some(cert), Some(key)) => tls = tls.with_client_cert(cert, key),
        (None, None) => {}
        _ => {
            return Err(WalError::Url(
                "sslcert and sslkey go together: a client certificate needs its key".into(),
            ));
        }
    }
    Ok(tls)
}

/// The password the password file has for this connection, as libpq finds
/// it: the first line whose `host:port:database:user` fields match (`*`
/// matches anything, `\` escapes), in `PGPASSFILE` or `~/.pgpass`. A file
/// others may read is ignored, as libpq ignores it.
fn password_file(
    env: Env<'_>,
    host: &str,
    port: u16,
    database: &str,
    user: &str,
) -> Option<String> {
    let path = match env("PGPASSFILE") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env("HOME")?).join(".pgpass"),
    };
    let text = std::fs::read_to_string(&path).ok()?;
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).ok()?.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(path = %path.display(), "the password file is readable by others and is ignored (chmod 0600 it)");
            return None;
        }
    }
    // The default socket directory is `localhost` in the file.
    let host = if host == "/var/run/postgresql" || host == "/tmp" {
        "localhost"
    } else {
        host
    };
    let port = port.to_string();
    let wanted = [host, port.as_str(), database, user];
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .find_map(|line| {
            let fields = pgpass_fields(line)?;
            let matches = fields[..4]
                .iter()
                .zip(wanted)
                .all(|((field, escaped), value)| (field == "*" && !escaped) || field == value);
            matches.then(|| fields[4].0.clone())
        })
}

/// The five fields of a password file line, unescaped, each with whether
/// it held an escape (an escaped `*` is no wildcard); `None` when it has
/// fewer. The password ends at an unescaped `:`, as in libpq.
fn pgpass_fields(line: &str) -> Option<Vec<(String, bool)>> {
    let mut fields = vec![(String::new(), false)];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let field = fields.last_mut()?;
                field.0.push(chars.next().unwrap_or('\\'));
                field.1 = true;
            }
            ':' if fields.len() == 5 => break,
            ':' => fields.push((String::new(), false)),
            c => fields.last_mut()?.0.push(c),
        }
    }
    (fields.len() == 5).then_some(fields)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use pgwire_replication::SslMode;

    use super::*;

    fn with_env(url: &str, vars: &[(&str, &str)]) -> Result<ReplicationConfig, WalError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        connection(url, "s", &|name| vars.get(name).cloned())
    }

    #[test]
    fn the_replication_connection_follows_database_url() {
        let c = with_env(
            "postgres://app%40x:p%2Fw@db.example:6543/orders?sslmode=require",
            &[("PGPASSWORD", "not this"), ("PGSSLMODE", "disable")],
        )
        .unwrap();
        assert_eq!((c.host.as_str(), c.port), ("db.example", 6543));
        assert_eq!((c.user.as_str(), c.password.as_str()), ("app@x", "p/w"));
        assert_eq!(c.database, "orders");
        assert_eq!(c.tls.mode, SslMode::Require);
        assert!(with_env("postgres://h/d?sslmode=sometimes", &[]).is_err());
        assert!(with_env("postgres://h/d?port=x", &[]).is_err());
    }

    #[test]
    fn the_session_sets_its_own_wal_sender_timeout() {
        let timeout = Duration::from_millis(2500);
        let plain = with_sender_timeout(with_env("postgres://h/d", &[]).unwrap(), timeout).unwrap();
        assert_eq!(plain.options.as_deref(), Some("-c wal_sender_timeout=2500"));
        let given = with_env("postgres://h/d?options=-c%20search_path%3Dapp", &[]).unwrap();
        let both = with_sender_timeout(given, timeout).unwrap();
        assert_eq!(
            both.options.as_deref(),
            Some("-c search_path=app -c wal_sender_timeout=2500")
        );
        let zero = with_sender_timeout(with_env("postgres://h/d", &[]).unwrap(), Duration::ZERO);
        assert!(zero.unwrap().options.unwrap().ends_with("=1"));
        let theirs = with_env(
            "postgres://h/d",
            &[("PGOPTIONS", "-c wal_sender_timeout=0")],
        );
        let refused = with_sender_timeout(theirs.unwrap(), timeout).unwrap_err();
        assert!(refused.to_string().contains("relay_lease_ms"), "{refused}");
    }

    #[test]
    fn the_default_slot_follows_the_database_the_connection_opens() {
        let named = |url: &str, vars: &[(&str, &str)]| {
            service::wal::slot::slot_name_for(&with_env(url, vars).unwrap().database)
        };
        assert_eq!(named("postgres://h/Orders", &[]), "seawall_orders");
        assert_eq!(
            named("postgres://h/?dbname=billing", &[]),
            "seawall_billing"
        );
        assert_eq!(
            named("postgres://h", &[("PGDATABASE", "crm")]),
            "seawall_crm"
        );
        assert_eq!(named("postgres://app@h", &[]), "seawall_app");
    }

    #[test]
    fn tls_is_preferred_as_the_pool_prefers_it() {
        for url in [
            "postgres://h/d",
            "postgres://h/d?sslmode=prefer",
            "postgres://h/d?sslmode=allow",
        ] {
            assert_eq!(
                with_env(url, &[]).unwrap().tls.mode,
                SslMode::Prefer,
                "{url}"
            );
        }
        let env = with_env("postgres://h/d", &[("PGSSLMODE", "verify-full")]).unwrap();
        assert_eq!(env.tls.mode, SslMode::VerifyFull);
        let root = with_env("postgres://h/d?sslmode=require&sslrootcert=/ca.pem", &[]).unwrap();
        assert_eq!(root.tls.mode, SslMode::VerifyCa);
        assert_eq!(root.tls.ca_pem_path, Some(PathBuf::from("/ca.pem")));
        let mtls = with_env("postgres://h/d?ssl-cert=/c.pem", &[("PGSSLKEY", "/k.pem")]).unwrap();
        assert!(mtls.tls.is_mtls());
        assert!(with_env("postgres://h/d?sslcert=/c.pem", &[]).is_err());
    }

    #[test]
    fn missing_parts_come_from_the_query_then_the_environment() {
        let c = with_env(
            "postgres:///?host=/run/postgresql&port=5433&dbname=app",
            &[
                ("PGUSER", "svc"),
                ("PGPASSWORD", "secret"),
                ("PGHOST", "ignored"),
            ],
        )
        .unwrap();
        assert!(c.is_unix_socket());
        assert_eq!((c.host.as_str(), c.port), ("/run/postgresql", 5433));
        assert_eq!((c.user.as_str(), c.password.as_str()), ("svc", "secret"));
        assert_eq!(c.database, "app");
        let env = with_env(
            "postgres://",
            &[
                ("PGHOST", "pg.internal"),
                ("PGPORT", "6000"),
                ("PGUSER", "u"),
            ],
        )
        .unwrap();
        assert_eq!(
            (env.host.as_str(), env.port, env.database.as_str()),
            ("pg.internal", 6000, "u")
        );
        let socket = with_env("postgres://%2Frun%2Fpg/d", &[]).unwrap();
        assert_eq!(socket.host, "/run/pg");
        let v6 = with_env("postgres://[::1]:5433/d", &[]).unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 5433));
        let addr = with_env(
            "postgres://db.example/d?hostaddr=10.0.0.7&sslmode=verify-full",
            &[],
        )
        .unwrap();
        assert_eq!(addr.host, "10.0.0.7");
        assert_eq!(addr.tls.sni_hostname.as_deref(), Some("db.example"));
    }

    #[test]
    fn a_missing_password_is_found_in_the_password_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(
            &file,
            "# comment\nother:5432:*:app:nope\ndb.example:6543:*:app:wrong\\:one\n*:*:orders:app:a\\:b\\\\c\n",
        )
        .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let path = file.display().to_string();
        let env = [("PGPASSFILE", path.as_str())];
        let c = with_env("postgres://app@db.example:6543/orders", &env).unwrap();
        assert_eq!(c.password, "wrong:one");
        let c = with_env("postgres://app@db.example:5432/orders", &env).unwrap();
        assert_eq!(c.password, "a:b\\c");
        let star = dir.path().join("star");
        std::fs::write(&star, "\\*:*:*:app:literal-star\n*:*:*:app:any:trailing\n").unwrap();
        std::fs::set_permissions(&star, std::fs::Permissions::from_mode(0o600)).unwrap();
        let star_path = star.display().to_string();
        let star_env = [("PGPASSFILE", star_path.as_str())];
        let c = with_env("postgres://app@db.example/orders", &star_env).unwrap();
        assert_eq!(
            c.password, "any",
            "an escaped * is no wildcard; the password ends at a colon"
        );
        let given = with_env("postgres://app:given@db.example:5432/orders", &env).unwrap();
        assert_eq!(given.password, "given");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let open = with_env("postgres://app@db.example:5432/orders", &env).unwrap();
        assert_eq!(open.password, "");
    }
}
