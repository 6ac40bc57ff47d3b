//! Secrets kept out of what is printed and logged: database and NATS URLs
//! carry passwords and tokens, in their user info or their query.

/// Hides the secrets of a database URL before it is printed or logged: its
/// user info's password (up to the URL's last `@`, so a password holding
/// `?`, `/` or `,` is hidden whole) and the values of query parameters
/// that carry one (`password`, `sslpassword`, `token`, ...).
pub fn redact(url: &str) -> String {
    let scheme = url.split("://").next().unwrap_or_default();
    redact_url(url, is_token_scheme(scheme))
}

/// [`redact`] for a NATS server list: each comma-separated URL, trimmed,
/// with or without a scheme, its lone user info hidden too (a token).
pub fn redact_servers(list: &str) -> String {
    list.split(',')
        .map(|url| {
            let url = url.trim();
            let token = match url.split_once("://") {
                Some((scheme, _)) => is_token_scheme(scheme),
                None => true,
            };
            redact_url(url, token)
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// NATS schemes, where a user info without a password is a token.
fn is_token_scheme(scheme: &str) -> bool {
    matches!(
        scheme.to_ascii_lowercase().as_str(),
        "nats" | "tls" | "ws" | "wss"
    )
}

fn redact_url(url: &str, token: bool) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let shown = match url[start..].rfind('@') {
        Some(at) => {
            let at = start + at;
            let creds = &url[start..at];
            let creds = match creds.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None if token => "***".to_owned(),
                None => creds.to_owned(),
            };
            format!("{}{creds}{}", &url[..start], &url[at..])
        }
        None => url.to_owned(),
    };
    redact_query(&shown)
}

/// The query's secret parameters hidden.
fn redact_query(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if is_secret_parameter(key) => format!("{key}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{base}?{}", query.join("&"))
}

/// Whether a URL's query parameter `key` carries a secret; a name written
/// with percent-escapes is read as the name it spells.
fn is_secret_parameter(key: &str) -> bool {
    let key = percent_decoded(key).to_ascii_lowercase();
    key.contains("password") || key.contains("secret") || key == "token"
}

/// `text` with its `%XX` escapes decoded (invalid ones kept as written).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::{redact, redact_servers};

    #[test]
    fn passwords_and_tokens_leave_no_database_url_that_is_printed() {
        for (url, shown) in [
            (
                "postgres://seawall:s3cret@db:5432/seawall",
                "postgres://seawall:***@db:5432/seawall",
            ),
            (
                "postgres://db/seawall?user=seawall&password=s3cret&sslmode=require",
                "postgres://db/seawall?user=seawall&password=***&sslmode=require",
            ),
            (
                "postgresql://u@db/x?sslpassword=s3cret",
                "postgresql://u@db/x?sslpassword=***",
            ),
            ("postgres://u:pa,s3cret@db/x", "postgres://u:***@db/x"),
            ("postgres://u:pa?s3cret@h/db", "postgres://u:***@h/db"),
            (
                "postgres://u:p@h1:5432,h2:5432/db?target_session_attrs=read-write",
                "postgres://u:***@h1:5432,h2:5432/db?target_session_attrs=read-write",
            ),
            (
                "postgres://h/db?password=s3cret&application_name=a@b",
                "postgres://h/db?password=***&application_name=a@b",
            ),
            (
                "postgres://h/db?pass%77ord=s3cret",
                "postgres://h/db?pass%77ord=***",
            ),
            (
                "mysql://root:s3cret@db/seawall",
                "mysql://root:***@db/seawall",
            ),
            (
                "sqlite://seawall.db?mode=rwc",
                "sqlite://seawall.db?mode=rwc",
            ),
            (
                "postgres://seawall@db/seawall",
                "postgres://seawall@db/seawall",
            ),
        ] {
            assert_eq!(redact(url), shown, "{url}");
            assert!(!redact(url).contains("s3cret"), "{url}");
        }
    }

    #[test]
    fn passwords_and_tokens_leave_no_nats_server_list_that_is_printed() {
        for (list, shown) in [
            (
                "nats://user:s3cret@n1:4222,nats://user:s3cret@n2:4222",
                "nats://user:***@n1:4222,nats://user:***@n2:4222",
            ),
            (
                "nats://a@n1:4222, NATS://s3cret@n2:4222",
                "nats://***@n1:4222,NATS://***@n2:4222",
            ),
            ("tls://s3cret@n1:4222", "tls://***@n1:4222"),
            ("user:s3cret@n1:4222,s3cret@n2", "user:***@n1:4222,***@n2"),
            ("nats://n1:4222", "nats://n1:4222"),
        ] {
            assert_eq!(redact_servers(list), shown, "{list}");
            assert!(!redact_servers(list).contains("s3cret"), "{list}");
        }
    }
}
