//! The admin API on big tables as a busy service has them: p50/p95 per
//! endpoint with the last ~17 minutes at 1,000 messages/s (1,000,000 rows in
//! the outbox and as many in the inbox) on top of a week of history, on
//! PostgreSQL; and what a dashboard left open costs per refresh.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use tokio_util::sync::CancellationToken;

use crate::cpu::CpuSample;
use crate::pg::{self, PgServer};
use crate::report::{Column, Figures, Report, quantile};

const TOKEN: &str = "bench";

/// Rows of one stretch of time: `count` rows, evenly spaced, the last one
/// `ends_ago` before now and each `step` after the one before.
struct Stretch {
    first: u64,
    count: u64,
    step: String,
    ends_ago: String,
}

impl Stretch {
    /// The SQL time of row `g` (a column of `generate_series`).
    fn at(&self) -> String {
        let last = self.first + self.count - 1;
        format!(
            "(now() - {} - ({last} - g) * interval '{}')",
            self.ends_ago, self.step
        )
    }
}

/// Fills the tables as a busy service leaves them: `recent` rows from the
/// last minutes at 1,000 messages/s on top of `history` rows spread over the
/// week before. Almost all are published/processed; a few are pending, dead,
/// claimed, expired, quarantined, spread over the whole time.
async fn fill(db: &DatabaseConnection, recent: u64, history: u64) -> Result<()> {
    let week_us: u64 = 7 * 86_400_000_000;
    let history_step = format!("{} microseconds", week_us.checked_div(history).unwrap_or(0));
    let stretches = [
        Stretch {
            first: 1,
            count: history,
            step: history_step,
            ends_ago: format!("interval '{} ms'", recent),
        },
        Stretch {
            first: history + 1,
            count: recent,
            step: "1 ms".to_owned(),
            ends_ago: "interval '0 s'".to_owned(),
        },
    ];
    for stretch in stretches.iter().filter(|s| s.count > 0) {
        for sql in [outbox_rows(stretch), inbox_rows(stretch)] {
            db.execute_raw(Statement::from_string(DbBackend::Postgres, sql))
                .await?;
        }
    }
    // The per-minute counts the relay and 16 consumer sessions would have
    // left for the last day (see service::rollup).
    let rollup = "INSERT INTO throughput_minute (minute, tally, shard, n)
         SELECT date_trunc('minute', published_at), 'published', id % 16, count(*) FROM outbox_message
          WHERE published_at >= now() - interval '1 day' GROUP BY 1, 3
         UNION ALL
         SELECT date_trunc('minute', processed_at), 'processed', id % 16, count(*) FROM inbox_message
          WHERE processed_at >= now() - interval '1 day' GROUP BY 1, 3";
    let dead = "INSERT INTO dead_letter (consumer, message_id, subject, payload, headers, error, deliveries, created_at)
         SELECT 'ledger', 'd-' || g, 'ledger.record', convert_to('{}', 'UTF8'), '{}'::json, 'malformed', 1, now() FROM generate_series(1, 500) AS g";
    for sql in [
        rollup,
        dead,
        "VACUUM ANALYZE outbox_message",
        "VACUUM ANALYZE inbox_message",
        "VACUUM ANALYZE dead_letter",
        "VACUUM ANALYZE throughput_minute",
    ] {
        db.execute_raw(Statement::from_string(DbBackend::Postgres, sql.to_owned()))
            .await?;
    }
    Ok(())
}

fn outbox_rows(s: &Stretch) -> String {
    let at = s.at();
    let (first, last) = (s.first, s.first + s.count - 1);
    format!(
        "INSERT INTO outbox_message (message_id, subject, payload, headers, ordering_key, created_at, published_at, attempts, last_error, next_attempt_at, dead_at)
         SELECT 'm-' || g, 'events.s' || (g % 10), convert_to('{{\"n\":' || g || '}}', 'UTF8'), '{{}}'::json,
                CASE WHEN g % 3 = 0 THEN 'key-' || (g % 1000) END,
                {at},
                CASE WHEN g % 200 = 1 OR g % 200 = 2 THEN NULL ELSE {at} + interval '20 ms' END,
                CASE WHEN g % 200 = 2 THEN 10 ELSE 0 END,
                CASE WHEN g % 200 = 2 THEN 'no stream for subject' END,
                now(),
                CASE WHEN g % 200 = 2 THEN now() END
         FROM generate_series({first}, {last}) AS g"
    )
}

fn inbox_rows(s: &Stretch) -> String {
    let at = s.at();
    let (first, last) = (s.first, s.first + s.count - 1);
    format!(
        "INSERT INTO inbox_message (message_id, consumer, received_at, processed_at, claimed_by, claimed_at, lease_until, attempts, quarantined_at)
         SELECT 'm-' || g, CASE WHEN g % 4 = 0 THEN 'hook' ELSE 'ledger' END,
                {at},
                CASE WHEN g % 500 IN (1, 2, 3) THEN NULL ELSE {at} END,
                CASE WHEN g % 500 IN (1, 2, 3) THEN 'w' END,
                CASE WHEN g % 500 IN (1, 2, 3) THEN now() END,
                CASE WHEN g % 500 = 1 THEN now() + interval '1 hour' WHEN g % 500 = 2 THEN now() - interval '1 hour' END,
                1,
                CASE WHEN g % 500 = 3 THEN now() END
         FROM generate_series({first}, {last}) AS g"
    )
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
        "/api/v1/inbox?consumer=hook".to_owned(),
        "/api/v1/dead-letters".to_owned(),
    ]
}

/// Serves the admin API on `db` on a loopback port; returns its base URL.
async fn serve(db: &DatabaseConnection, cancel: CancellationToken) -> Result<String> {
    let state = api::AppState {
        db: db.clone(),
        reads: None,
        nats: None,
        jetstream: None,
        relay_wake: None,
        metrics: None,
        stats: Default::default(),
        checks: Vec::new(),
        config: Arc::new(api::ApiConfig {
            tokens: vec![api::auth::Token::admin(TOKEN)],
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

/// The four requests a dashboard makes on each refresh (every 5 s while it
/// is open), with its default filters.
const DASHBOARD: [&str; 4] = [
    "/api/v1/stats",
    "/api/v1/outbox?limit=50&status=pending",
    "/api/v1/inbox?limit=50&state=expired_claim",
    "/api/v1/dead-letters?limit=50&replayed=false",
];

/// CPU of this process (the API) and PostgreSQL per dashboard refresh, over
/// `refreshes` refreshes made as a browser makes them (the four requests at
/// once).
async fn refresh_cost(http: &reqwest::Client, base: &str, refreshes: usize) -> Result<Figures> {
    let get = |path: &str| {
        let request = http.get(format!("{base}{path}")).bearer_auth(TOKEN).send();
        async move {
            let res = request.await?;
            anyhow::ensure!(
                res.status().is_success(),
                "{} answered {}",
                res.url(),
                res.status()
            );
            res.bytes().await?;
            Ok(())
        }
    };
    let mut samples = Vec::with_capacity(refreshes);
    let before = CpuSample::now();
    for _ in 0..refreshes {
        let t0 = Instant::now();
        futures::future::try_join_all(DASHBOARD.map(get)).await?;
        samples.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    let cpu = CpuSample::now()
        .since(&before)
        .per_thousand(refreshes as u64);
    samples.sort_by(f64::total_cmp);
    // per_thousand gives ms per 1,000 refreshes; a refresh is a thousandth.
    Ok(Figures::new()
        .with("p50_ms", quantile(&samples, 0.5))
        .with("p95_ms", quantile(&samples, 0.95))
        .with("max_ms", quantile(&samples, 1.0))
        .with(
            "cpu_ms_per_refresh_total",
            (cpu.this + cpu.postgres) / 1000.0,
        )
        .with("cpu_ms_per_refresh_api", cpu.this / 1000.0)
        .with("cpu_ms_per_refresh_postgres", cpu.postgres / 1000.0))
}

/// A report with this scenario's columns.
fn report() -> Report {
    Report::new(
        "api",
        vec![
            Column::figure("p50 ms", "p50_ms", 1),
            Column::figure("p95 ms", "p95_ms", 1),
            Column::figure("max ms", "max_ms", 1),
            Column::breakdown(
                "CPU ms per refresh (api+postgres)",
                &[
                    "cpu_ms_per_refresh_total",
                    "cpu_ms_per_refresh_api",
                    "cpu_ms_per_refresh_postgres",
                ],
                1,
            ),
        ],
    )
}

/// One row per endpoint ([`endpoints`]) served from `base`: what each page
/// of the admin API costs a caller on tables of `rows` rows.
async fn endpoint_rows(
    report: &mut Report,
    http: &reqwest::Client,
    base: &str,
    rows: u64,
    requests: usize,
) -> Result<()> {
    for path in endpoints(rows) {
        let samples = latencies(http, &format!("{base}{path}"), requests).await?;
        eprintln!("  {path}: p95 {:.1} ms", quantile(&samples, 0.95));
        report.row(
            path,
            Figures::new()
                .with("p50_ms", quantile(&samples, 0.5))
                .with("p95_ms", quantile(&samples, 0.95))
                .with("max_ms", quantile(&samples, 1.0)),
        );
    }
    Ok(())
}

/// The row of `requests` stats readings made straight on `db`, past the
/// API's cache: the endpoint rows are served from that cache, so they do not
/// show what a reading costs.
async fn stats_reading_row(
    report: &mut Report,
    db: &DatabaseConnection,
    requests: usize,
) -> Result<()> {
    let mut readings = Vec::with_capacity(requests);
    for _ in 0..requests {
        let started = Instant::now();
        service::stats::stats(db, chrono::Utc::now(), None).await?;
        readings.push(started.elapsed().as_secs_f64() * 1e3);
    }
    readings.sort_by(f64::total_cmp);
    eprintln!("  stats reading: p95 {:.1} ms", quantile(&readings, 0.95));
    report.row(
        "stats reading (the queries behind /api/v1/stats and /metrics, once per 5 s)",
        Figures::new()
            .with("p50_ms", quantile(&readings, 0.5))
            .with("p95_ms", quantile(&readings, 0.95))
            .with("max_ms", quantile(&readings, 1.0)),
    );
    Ok(())
}

/// Runs the scenario: `recent` rows per table at 1,000/s up to now, after
/// `history` rows spread over the week before.
pub async fn run(pg: &mut PgServer, recent: u64, history: u64, requests: usize) -> Result<Report> {
    let (db, _url) = pg.fresh("api").await?;
    let mut report = report();
    report.version("PostgreSQL", pg::version(&db).await?);
    let rows = recent + history;
    eprintln!("filling {rows} outbox rows and {rows} inbox rows...");
    let started = Instant::now();
    fill(&db, recent, history).await?;
    report.setup(
        "rows",
        format!(
            "{rows} outbox_message + {rows} inbox_message + 500 dead_letter: {recent} each from the last {:.0} minutes (1,000/s), after {history} spread over the week before",
            recent as f64 / 60_000.0
        ),
    );
    report.setup("fill", format!("{:.1} s", started.elapsed().as_secs_f64()));
    report.setup(
        "requests",
        format!(
            "{requests} per endpoint, sequential, over loopback HTTP, after 3 warm-up requests; a dashboard refresh is its 4 requests at once"
        ),
    );
    let cancel = CancellationToken::new();
    let base = serve(&db, cancel.clone()).await?;
    let http = reqwest::Client::new();
    endpoint_rows(&mut report, &http, &base, rows, requests).await?;
    // What one reading of the stats costs the database: the API shares it
    // for `stats_max_age` (5 s), so this is paid once per window however
    // many callers ask, and the rows above are the answers as served.
    stats_reading_row(&mut report, &db, requests).await?;
    let refresh = refresh_cost(&http, &base, requests).await?;
    eprintln!(
        "  dashboard refresh: p95 {:.1} ms, {:.1} ms CPU",
        refresh.get("p95_ms").unwrap_or(f64::NAN),
        refresh.get("cpu_ms_per_refresh_total").unwrap_or(f64::NAN)
    );
    report.row("dashboard refresh (the 4 requests at once)", refresh);
    cancel.cancel();
    db.close().await.context("closing")?;
    Ok(report)
}
