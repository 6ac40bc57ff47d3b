//! Connecting to NATS as it is deployed: one URL or a cluster's seeds, with
//! authentication (a `.creds` file, an nkey seed, user and password, or a
//! token) and TLS (a CA, a client certificate, TLS first). Problems name the
//! configuration key that causes them: a file that is missing or holds no
//! credential, an expired credential, a refused login, a failed handshake,
//! at start-up rather than as a retry loop.

use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use async_nats::{ConnectErrorKind, ConnectOptions, Event, ServerError};
use base64::Engine;

use worker::ServerErrors;

use crate::config::{ConfigError, Settings, invalid};

/// The servers of a NATS URL setting: one URL, or several separated by
/// commas (the seeds of a cluster, so a process can start while one node is
/// down).
///
/// # Errors
/// A URL that does not parse, named.
pub fn servers(url: &str) -> Result<Vec<async_nats::ServerAddr>> {
    url.split(',')
        .map(|u| {
            u.trim()
                .parse::<async_nats::ServerAddr>()
                .with_context(|| format!("invalid NATS URL {:?}", crate::config::redact_servers(u)))
        })
        .collect()
}

/// Connects to `url` without authentication or TLS of its own (tools and
/// benchmarks against a local server).
///
/// # Errors
/// No server answered within 5 s, or the URL is invalid.
pub async fn connect(url: &str) -> Result<async_nats::Client> {
    ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(servers(url)?)
        .await
        .with_context(|| {
            format!(
                "connecting to NATS at {}",
                crate::config::redact_servers(url)
            )
        })
}

/// A connection made from the settings, with what the server reports on its
/// own.
pub struct Connection {
    /// The client.
    pub client: async_nats::Client,
    /// The server's asynchronous errors (permission violations), for the relay.
    pub server_errors: ServerErrors,
}

/// Connects as the settings say. With `eventually`, returns at once and
/// keeps trying in the background (the admin API alone starts while the
/// broker is down and reports it as not ready); otherwise the first attempt
/// must succeed.
///
/// # Errors
/// The URL is invalid, or (not `eventually`) the connection failed; a
/// refused login or a failed TLS handshake names the keys to check.
pub async fn connect_with(settings: &Settings, eventually: bool) -> Result<Connection> {
    let server_errors = ServerErrors::default();
    let mut options = options(settings).await?;
    let recorded = server_errors.clone();
    options = options.event_callback(move |event| {
        let recorded = recorded.clone();
        async move {
            match event {
                Event::ServerError(ServerError::Other(message)) => {
                    tracing::warn!(%message, "NATS server error");
                    recorded.record(message);
                }
                Event::ServerError(ServerError::AuthorizationViolation) => {
                    tracing::error!("NATS refused this connection's credentials");
                }
                other => tracing::info!(event = %other, "NATS connection event"),
            }
        }
    });
    if eventually {
        options = options.retry_on_initial_connect();
    } else {
        options = options.connection_timeout(Duration::from_secs(5));
    }
    let url = &settings.nats_url;
    let client = options.connect(servers(url)?).await.map_err(|err| {
        explain(settings, &err).context(format!(
            "connecting to NATS at {}",
            crate::config::redact_servers(url)
        ))
    })?;
    Ok(Connection {
        client,
        server_errors,
    })
}

/// The client options for the settings' credentials and TLS.
async fn options(settings: &Settings) -> Result<ConnectOptions> {
    let mut options = ConnectOptions::new();
    if let Some(path) = &settings.nats_creds_file {
        options = options
            .credentials_file(path)
            .await
            .map_err(|e| invalid("nats_creds_file", e.to_string()))?;
    }
    if let Some(seed) = &settings.nats_nkey_seed {
        options = options.nkey(seed.clone());
    }
    if let (Some(user), Some(password)) = (&settings.nats_user, &settings.nats_password) {
        options = options.user_and_password(user.clone(), password.clone());
    }
    if let Some(token) = &settings.nats_token {
        options = options.token(token.clone());
    }
    if let Some(ca) = &settings.nats_ca_file {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&settings.nats_cert_file, &settings.nats_key_file) {
        options = options
            .add_client_certificate(cert.clone(), key.clone())
            .require_tls(true);
    }
    if settings.nats_tls_first {
        options = options.tls_first();
    }
    Ok(options)
}

/// The connection error, with the keys that can fix it.
fn explain(settings: &Settings, err: &async_nats::ConnectError) -> anyhow::Error {
    match err.kind() {
        ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
            match auth_keys(settings) {
                Some(keys) => anyhow!(
                    "the server refused the login with {keys} ({err}): check the credential and that it has not expired or been revoked"
                ),
                None => anyhow!(
                    "the server requires authentication ({err}): set nats_creds_file, nats_nkey_seed, nats_user and nats_password, or nats_token"
                ),
            }
        }
        // A certificate the client cannot verify surfaces as an I/O error.
        ConnectErrorKind::Tls => tls_failure(err),
        ConnectErrorKind::Io if is_tls_failure(err) => tls_failure(err),
        _ => anyhow!("{err}"),
    }
}

/// Whether an I/O error is a TLS handshake failing (an unknown issuer, a
/// name mismatch, a server that wants a client certificate).
fn is_tls_failure(err: &async_nats::ConnectError) -> bool {
    let text = err.to_string().to_ascii_lowercase();
    ["certificate", "tls", "handshake"]
        .iter()
        .any(|word| text.contains(word))
}

fn tls_failure(err: &async_nats::ConnectError) -> anyhow::Error {
    anyhow!(
        "the TLS handshake failed ({err}): check nats_ca_file (the CA that signed the server's certificate), nats_cert_file and nats_key_file (a client certificate, if the server requires one) and nats_tls_first"
    )
}

/// The authentication keys set, as the operator wrote them.
fn auth_keys(settings: &Settings) -> Option<&'static str> {
    if settings.nats_creds_file.is_some() {
        Some("nats_creds_file")
    } else if settings.nats_nkey_seed.is_some() {
        Some("nats_nkey_seed")
    } else if settings.nats_user.is_some() {
        Some("nats_user and nats_password")
    } else if settings.nats_token.is_some() {
        Some("nats_token")
    } else {
        None
    }
}

/// Checks the NATS keys together: one way to authenticate at most, pairs
/// complete, a seed that looks like one, a `.creds` file that holds a user
/// JWT and seed and has not expired.
///
/// # Errors
/// The first problem, naming its key.
pub(crate) fn check(settings: &Settings) -> Result<(), ConfigError> {
    let methods: Vec<&str> = [
        ("nats_creds_file", settings.nats_creds_file.is_some()),
        ("nats_nkey_seed", settings.nats_nkey_seed.is_some()),
        ("nats_user", settings.nats_user.is_some()),
        ("nats_token", settings.nats_token.is_some()),
    ]
    .into_iter()
    .filter_map(|(key, set)| set.then_some(key))
    .collect();
    if methods.len() > 1 {
        return Err(invalid(
            "nats_creds_file",
            format!(
                "set one way to authenticate to NATS, not several ({})",
                methods.join(", ")
            ),
        ));
    }
    match (&settings.nats_user, &settings.nats_password) {
        (Some(_), None) => return Err(invalid("nats_password", "nats_user is set without it")),
        (None, Some(_)) => return Err(invalid("nats_user", "nats_password is set without it")),
        _ => {}
    }
    match (&settings.nats_cert_file, &settings.nats_key_file) {
        (Some(_), None) => {
            return Err(invalid("nats_key_file", "nats_cert_file is set without it"));
        }
        (None, Some(_)) => {
            return Err(invalid("nats_cert_file", "nats_key_file is set without it"));
        }
        _ => {}
    }
    if let Some(seed) = &settings.nats_nkey_seed
        && !(seed.starts_with("SU") && seed.len() > 50)
    {
        return Err(invalid(
            "nats_nkey_seed",
            "expected a user nkey seed (it starts with SU)",
        ));
    }
    if let Some(path) = &settings.nats_creds_file {
        check_creds(path)?;
    }
    Ok(())
}

/// A `.creds` file: readable, a user JWT and seed inside, not expired.
fn check_creds(path: &std::path::Path) -> Result<(), ConfigError> {
    let key = "nats_creds_file";
    let contents = std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("{}: {e}", path.display())))?;
    ConnectOptions::with_credentials(&contents).map_err(|e| {
        invalid(
            key,
            format!("{} holds no usable credential: {e}", path.display()),
        )
    })?;
    let jwt = contents
        .lines()
        .skip_while(|line| !line.contains("BEGIN NATS USER JWT"))
        .nth(1)
        .unwrap_or_default()
        .trim();
    if let Some(expires) = jwt_expiry(jwt)
        && expires <= chrono::Utc::now()
    {
        return Err(invalid(
            key,
            format!(
                "the credential in {} expired at {expires}; issue a new one",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// The `exp` claim of a JWT, when it has one.
fn jwt_expiry(jwt: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let payload = jwt.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    chrono::DateTime::from_timestamp(claims.get("exp")?.as_i64()?, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expiry_of_a_jwt_is_read_from_its_claims() {
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"exp":1000}"#);
        let jwt = format!("e30.{claims}.sig");
        assert_eq!(jwt_expiry(&jwt).map(|t| t.timestamp()), Some(1000));
        assert_eq!(jwt_expiry("e30.e30.sig"), None);
        assert_eq!(jwt_expiry("garbage"), None);
    }
}
