//! Secrets kept out of what is printed and logged: database and NATS URLs
//! carry passwords and tokens, in their user info or their query.

/// Hides the secrets of a URL before it is printed or logged: its user
/// info's password (a NATS URL's lone user info is a token, hidden too),
/// and query parameters that carry one (`password`, `sslpassword`,
/// `token`, ...); in each URL of a comma-separated list, as NATS takes one
/// per server.
pub fn redact(urls: &str) -> String {
    urls.split(',')
        .map(redact_one)
        .collect::<Vec<_>>()
        .join(",")
}

fn redact_one(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let base = redact_user_info(base);
    let Some(query) = query else {
        return base;
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

/// `scheme://user:secret@host` with the secret hidden (the whole user
/// info on NATS schemes, where a lone one is a token).
fn redact_user_info(url: &str) -> String {
    let (Some(scheme), Some(at)) = (url.find("://"), url.rfind('@')) else {
        return url.to_owned();
    };
    if at < scheme {
        return url.to_owned();
    }
    let creds = &url[scheme + 3..at];
    match creds.split_once(':') {
        Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
        None if matches!(&url[..scheme], "nats" | "tls" | "ws" | "wss") => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        None => url.to_owned(),
    }
}

/// Whether a URL's query parameter `key` carries a secret.
fn is_secret_parameter(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password") || key.contains("secret") || key == "token"
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_and_tokens_leave_no_url_that_is_printed() {
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
            (
                "mysql://root:s3cret@db/seawall",
                "mysql://root:***@db/seawall",
            ),
            (
                "nats://user:s3cret@n1:4222,nats://user:s3cret@n2:4222",
                "nats://user:***@n1:4222,nats://user:***@n2:4222",
            ),
            ("nats://s3cret@n1:4222", "nats://***@n1:4222"),
            ("tls://s3cret@n1:4222", "tls://***@n1:4222"),
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
}
