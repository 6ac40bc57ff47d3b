//! The admin API on big tables: p50/p95 per endpoint with 1,000,000 rows in
//! the outbox and 1,000,000 in the inbox, on PostgreSQL.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use tokio_util::sync::CancellationToken;

use crate::pg::{self, PgServer};
use crate::report::{Column, Figures, Report, quantile};

const TOKEN: &str = "bench";

/// Fills the tables with `rows` rows each, as a long-running system would
/// have them: almost all published/processed over the last week, a few
/// pending, dead, claimed, expired, quarantined.
async fn fill(db: &sea_orm::DatabaseConnection, rows: u64) -> Result<()> {
    let outbox = format!(
        "INSERT INTO outbox_message (message_id, subject, payload, headers, ordering_key, created_at, published_at, attempts, last_error, next_attempt_at, dead_at)
         SELECT 'm-' || g, 'events.s' || (g % 10), convert_to('{{\"n\":' || g || '}}', 'UTF8'), '{{}}'::json,
                CASE WHEN g % 3 = 0 THEN 'key-' || (g % 1000) END,
                now() - ((({rows} - g)::float8 / {rows}) * interval '7 days'),
                CASE WHEN g % 200 = 1 OR g % 200 = 2 THEN NULL ELSE now() - ((({rows} - g)::float8 / {rows}) * interval '7 days') + interval '20 ms' END,
                CASE WHEN g % 200 = 2 THEN 10 ELSE 0 END,
                CASE WHEN g % 200 = 2 THEN 'no stream for subject' END,
                now(),
                CASE WHEN g % 200 = 2 THEN now() END
         FROM generate_series(1, {rows}) AS g"
    );
    let inbox = format!(
        "INSERT INTO inbox_message (message_id, consumer, received_at, processed_at, claimed_by, claimed_at, lease_until, attempts, quarantined_at)
         SELECT 'm-' || g, CASE WHEN g % 4 = 0 THEN 'notify' ELSE 'credit' END,
                now() - ((({rows} - g)::float8 / {rows}) * interval '7 days'),
                CASE WHEN g % 500 IN (1, 2, 3) THEN NULL ELSE now() - ((({rows} - g)::float8 / {rows}) * interval '7 days') END,
                CASE WHEN g % 500 IN (1, 2, 3) THEN 'w' END,
                CASE WHEN g % 500 IN (1, 2, 3) THEN now() END,
                CASE WHEN g % 500 = 1 THEN now() + interval '1 hour' WHEN g % 500 = 2 THEN now() - interval '1 hour' END,
                1,
                CASE WHEN g % 500 = 3 THEN now() END
         FROM generate_series(1, {rows}) AS g"
    );
    let dead = "INSERT INTO dead_letter (consumer, message_id, subject, payload, headers, error, deliveries, created_at)
         SELECT 'credit', 'd-' || g, 'credits.requested', convert_to('{}', 'UTF8'), '{}'::json, 'malformed', 1, now() FROM generate_series(1, 500) AS g";
    for sql in [
        outbox.as_str(),
        inbox.as_str(),
        dead,
        "VACUUM ANALYZE outbox_message",
        "VACUUM ANALYZE inbox_message",
        "VACUUM ANALYZE dead_letter",
    ] {
        db.execute_raw(Statement::from_string(DbBackend::Postgres, sql.to_owned()))
            .await?;
    }
    Ok(())
}

/// The endpoints measured: list pages with each filter, and the stats a
/// dashboard polls.
fn endpoints(rows: u64) -> Vec<String> {
    let mid = rows / 2;
    vec![
        "/api/v1/stats".to_owned(),
        "/api/v1/outbox".to_owned(),
        "/api/v1/outbox?status=pending".to_owned(),
        "/api/v1/outbox?status=dead".to_owned(),
        "/api/v1/outbox?status=published&limit=500".to_owned(),
        "/api/v1/outbox?subject=events.s3".to_owned(),
        format!("/api/v1/outbox?after={mid}"),
        "/api/v1/outbox?message_id=m-4242".to_owned(),
        "/api/v1/inbox".to_owned(),
        "/api/v1/inbox?state=expired_claim".to_owned(),
        "/api/v1/inbox?state=quarantined".to_owned(),
        "/api/v1/inbox?consumer=notify".to_owned(),
        "/api/v1/dead-letters".to_owned(),
    ]
}

/// Serves the admin API on `db` on a loopback port; returns its base URL.
async fn serve(db: &DatabaseConnection, cancel: CancellationToken) -> Result<String> {
    let state = api::AppState {
        db: db.clone(),
        nats: None,
        jetstream: None,
        relay_wake: None,
        metrics: None,
        config: Arc::new(api::ApiConfig {
            token: Some(TOKEN.into()),
            ..api::ApiConfig::default()
        }),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(api::serve_listener(listener, state, cancel));
    Ok(base)
}

/// Milliseconds per request of `requests` sequential GETs of `url`, sorted,
/// after 3 unmeasured warm-up requests.
async fn latencies(http: &reqwest::Client, url: &str, requests: usize) -> Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(requests);
    for i in 0..requests + 3 {
        let t0 = Instant::now();
        let res = http.get(url).bearer_auth(TOKEN).send().await?;
        let status = res.status();
        res.bytes().await?;
        anyhow::ensure!(status.is_success(), "{url} answered {status}");
        if i >= 3 {
            samples.push(t0.elapsed().as_secs_f64() * 1000.0);
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples)
}

/// Runs the scenario.
pub async fn run(pg: &mut PgServer, rows: u64, requests: usize) -> Result<Report> {
    let (db, _url) = pg.fresh("api").await?;
    let mut report = Report::new(
        "api",
        vec![
            Column::figure("p50 ms", "p50_ms", 1),
            Column::figure("p95 ms", "p95_ms", 1),
            Column::figure("max ms", "max_ms", 1),
        ],
    );
    report.version("PostgreSQL", pg::version(&db).await?);
    eprintln!("filling {rows} outbox rows and {rows} inbox rows...");
    let started = Instant::now();
    fill(&db, rows).await?;
    report.setup(
        "rows",
        format!("{rows} outbox_message + {rows} inbox_message + 500 dead_letter"),
    );
    report.setup("fill", format!("{:.1} s", started.elapsed().as_secs_f64()));
    report.setup(
        "requests",
        format!(
            "{requests} per endpoint, sequential, over loopback HTTP, after 3 warm-up requests"
        ),
    );
    let cancel = CancellationToken::new();
    let base = serve(&db, cancel.clone()).await?;
    let http = reqwest::Client::new();
    for path in endpoints(rows) {
        let samples = latencies(&http, &format!("{base}{path}"), requests).await?;
        eprintln!("  {path}: p95 {:.1} ms", quantile(&samples, 0.95));
        report.row(
            path,
            Figures::new()
                .with("p50_ms", quantile(&samples, 0.5))
                .with("p95_ms", quantile(&samples, 0.95))
                .with("max_ms", quantile(&samples, 1.0)),
        );
    }
    cancel.cancel();
    db.close().await.context("closing")?;
    Ok(report)
}
