//! What an operator meets on a running process's API listener: refused
//! tokens logged (at most a line per ten seconds) and counted, a dashboard
//! no other site can frame, and group commit's batch sizes as a histogram
//! Prometheus can aggregate.

use std::time::Duration;

use crate::helpers::{env, publish_entries, req, with_ledger_stream};
use crate::support::domain::Entry;
use crate::support::process::Seawall;
use crate::support::{Backend, free_port, http_client, wait_until};

const TOKEN: &str = "operate-test-token-0123456789";

/// The value of the unlabelled sample `name` in a Prometheus text page.
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_tokens_are_counted_and_logged_sparingly_the_dashboard_cannot_be_framed_and_batches_are_a_histogram()
 {
    let (t, nats, js) = with_ledger_stream(Backend::Sqlite).await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let env = env(
        &t.url,
        &nats.url(),
        &[
            ("SEAWALL_API_ADDR", &format!("127.0.0.1:{port}")),
            ("SEAWALL_ADMIN_TOKEN", TOKEN),
        ],
    );
    let mut run = Seawall::spawn(&["run"], &env);
    let http = http_client();
    wait_until("the API answers", Duration::from_secs(60), || async {
        http.get(format!("{base}/healthz")).send().await.is_ok()
    })
    .await;

    let page = http.get(format!("{base}/")).send().await.unwrap();
    let header = |name: &str| {
        page.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    assert!(header("content-security-policy").contains("frame-ancestors 'none'"));
    assert_eq!(header("x-content-type-options"), "nosniff");

    for guess in ["guess-token-1", "", "operate-test-token"] {
        let answer = http
            .get(format!("{base}/api/v1/stats"))
            .bearer_auth(guess)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 401);
    }
    let answer = http
        .get(format!("{base}/api/v1/stats"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);

    publish_entries(&js, &[("operate-1".to_owned(), req("acct", 1))]).await;
    crate::helpers::wait_for_rows::<Entry>(&t.db, 1, Duration::from_secs(60)).await;
    let scrape = || async {
        http.get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    wait_until("the batch is recorded", Duration::from_secs(30), || async {
        scrape().await.contains("seawall_inbox_batch_size_bucket")
    })
    .await;
    let metrics = scrape().await;
    assert_eq!(
        sample(&metrics, "seawall_api_auth_failures_total"),
        Some(3.0),
        "{metrics}"
    );
    assert!(
        !metrics.contains("seawall_inbox_batch_size{quantile"),
        "a histogram, not a summary: {metrics}"
    );
    assert_eq!(
        sample(&metrics, "seawall_schema_unknown_migrations"),
        Some(0.0)
    );

    assert!(run.terminate().await.success(), "{}", run.log_text());
    let log = run.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("bearer token")).collect();
    assert_eq!(
        lines.len(),
        1,
        "three refusals within seconds, one line: {log}"
    );
    assert!(
        !log.contains("guess-token") && !log.contains("operate-test-token"),
        "no token, presented or configured, is logged: {log}"
    );
}
