//! A tokenless API obeys only loopback hosts and its own origin, so a web
//! page in the operator's browser can neither change state (cross-site form
//! POST) nor read answers (DNS rebinding).

use reqwest::header::{HOST, ORIGIN};

use crate::harness::{TOKEN, TestApi};
use crate::support::Backend;

async fn status_and_code(req: reqwest::RequestBuilder) -> (u16, String) {
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let body: serde_json::Value = res.json().await.unwrap_or_default();
    (
        status,
        body["error"]["code"].as_str().unwrap_or("").to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_foreign_hosts_and_cross_site_changes_get_a_json_403() {
    let api = TestApi::start_with(Backend::Sqlite, None).await;
    let stats = format!("{}/api/v1/stats", api.base);
    let prune = format!("{}/api/v1/prune", api.base);
    let own_host = api.base.trim_start_matches("http://").to_owned();

    // DNS rebinding: the page's own name in Host.
    for path in [&stats, &format!("{}/", api.base)] {
        let (status, code) =
            status_and_code(api.http.get(path).header(HOST, "evil.example:8080")).await;
        assert_eq!((status, code.as_str()), (403, "forbidden"), "{path}");
    }
    for host in [own_host.as_str(), "localhost", "[::1]:1234"] {
        let (status, _) = status_and_code(api.http.get(&stats).header(HOST, host)).await;
        assert_eq!(status, 200, "{host}");
    }

    // No Host at all (HTTP/1.0): nothing says the request is for this machine.
    let mut conn = tokio::net::TcpStream::connect(&own_host).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut conn, b"GET /api/v1/stats HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut conn, &mut answer)
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.0 403"), "{answer}");
    assert!(answer.contains("no Host header"), "{answer}");

    // Cross-site form POSTs.
    let (status, code) =
        status_and_code(api.http.post(&prune).header(ORIGIN, "http://evil.example")).await;
    assert_eq!((status, code.as_str()), (403, "forbidden"));
    let (status, _) = status_and_code(api.http.post(&prune).header(ORIGIN, "null")).await;
    assert_eq!(status, 403);
    let (status, _) =
        status_and_code(api.http.post(&prune).header("sec-fetch-site", "cross-site")).await;
    assert_eq!(status, 403);

    // Same origin, and clients that send no Origin, are served.
    let (status, _) = status_and_code(
        api.http
            .post(&prune)
            .header(ORIGIN, api.base.clone())
            .header("sec-fetch-site", "same-origin"),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = status_and_code(api.http.post(&prune)).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_the_host_and_origin_do_not_matter() {
    let api = TestApi::start(Backend::Sqlite).await;
    let (status, _) = status_and_code(
        api.http
            .post(format!("{}/api/v1/prune", api.base))
            .bearer_auth(TOKEN)
            .header(HOST, "seawall.internal.example")
            .header(ORIGIN, "https://ops.example"),
    )
    .await;
    assert_eq!(status, 200);
}
