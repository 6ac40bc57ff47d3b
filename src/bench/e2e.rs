//! End to end: `credits.requested` published to JetStream, through the
//! consumer, the inbox, the outbox and the relay, to a subscriber of
//! `credits.applied`. The scenario deletes and recreates the CREDITS stream,
//! so point it only at a NATS server of its own (the scripts start one).

use std::time::{Duration, Instant};

use std::future::IntoFuture;

use anyhow::{Context, Result};
use async_nats::jetstream::{self, message::PublishMessage};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use migration::MigratorTrait;
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio_util::sync::CancellationToken;

use seawall::{Application, Roles, Settings, demo};
use service::demo::credits::{APPLIED_SUBJECT, CREDITS_STREAM, CreditRequest, REQUESTED_SUBJECT};

use super::cpu::{self, CpuSample};
use super::report::Report;

/// Messages sent through before measuring (then `ANALYZE` on PostgreSQL).
const WARM_UP: u64 = 2_000;

/// Sends `messages` requests with ids `{run}-{i}` through a fresh CREDITS
/// stream; returns messages per second.
async fn measure(
    db: DatabaseConnection,
    nats_url: &str,
    js: &jetstream::Context,
    client: &async_nats::Client,
    messages: u64,
    run: &str,
) -> Result<f64> {
    let _ = js.delete_stream(CREDITS_STREAM).await;
    // The same process `seawall run` starts, without the API.
    let settings = Settings {
        nats_url: nats_url.to_owned(),
        consumer_concurrency: 32,
        ..Settings::default()
    };
    let roles = Roles {
        relay: true,
        consume: true,
        api: false,
    };
    let app = Application::build(&settings, roles, demo::domain(&settings)?, db, None).await?;
    let stop = CancellationToken::new();
    let running = tokio::spawn(app.run_until(stop.clone()));
    let mut applied = client.subscribe(APPLIED_SUBJECT).await?;
    client.flush().await?;
    let payload = serde_json::to_vec(&CreditRequest {
        account_id: "bench".into(),
        amount: 1,
        reference: None,
    })?;
    let started = Instant::now();
    let mut acks = FuturesUnordered::new();
    for i in 0..messages {
        // Accounts spread over 500 ids so handlers do not all contend on one row.
        let payload = serde_json::to_vec(&CreditRequest {
            account_id: format!("bench-{}", i % 500),
            amount: 1,
            reference: None,
        })
        .unwrap_or_else(|_| payload.clone());
        let msg = PublishMessage::build()
            .payload(payload.into())
            .message_id(format!("{run}-{i}"));
        acks.push(js.send_publish(REQUESTED_SUBJECT, msg).await?.into_future());
        // Keep a bounded window of PubAcks in flight: the context caps them,
        // and the relay shares this context.
        while acks.len() >= 1_000 {
            if let Some(ack) = acks.next().await {
                ack?;
            }
        }
    }
    while let Some(ack) = acks.next().await {
        ack?;
    }
    let mut received = 0;
    while received < messages {
        tokio::time::timeout(Duration::from_secs(60), applied.next())
            .await
            .context("events stopped arriving")?
            .context("subscription closed")?;
        received += 1;
    }
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    stop.cancel();
    running.await??;
    Ok(rate)
}

/// Runs the scenario on SQLite and PostgreSQL.
pub async fn run(pg: &str, nats_url: &str, messages: u64) -> Result<Report> {
    let mut report = Report::new("e2e");
    let client = seawall::nats::connect(nats_url).await?;
    report
        .versions
        .push(("nats-server".into(), client.server_info().version.clone()));
    let js = jetstream::new(client.clone());
    report.setup.push(("messages".into(), format!("{messages} credits.requested published pipelined; timed until the subscriber saw every credits.applied")));
    report.setup.push((
        "process".into(),
        "consumer (32 in flight) + inbox + outbox + relay in one process, like `seawall run`"
            .into(),
    ));
    let dir = tempfile::tempdir()?;
    let sqlite = service::db::connect(
        &format!("sqlite://{}?mode=rwc", dir.path().join("e2e.db").display()),
        16,
    )
    .await?;
    migration::Migrator::up(&sqlite, None).await?;
    let (pg_db, _) = super::fresh_pg(pg, "e2e").await?;
    report
        .versions
        .push(("PostgreSQL".into(), super::pg_version(&pg_db).await?));
    report.setup.push((
        "warm-up".into(),
        format!("{WARM_UP} messages through the same path first, then ANALYZE (PostgreSQL)"),
    ));
    report.setup.push((
        "CPU".into(),
        "user+system time of this process, all postgres and all nats-server processes, per 1,000 messages".into(),
    ));
    for (label, db) in [("SQLite", sqlite), ("PostgreSQL", pg_db)] {
        let warm = WARM_UP.min(messages);
        measure(db.clone(), nats_url, &js, &client, warm, "e2e-warm").await?;
        if db.get_database_backend() == sea_orm::DbBackend::Postgres {
            db.execute_unprepared("ANALYZE").await?;
        }
        let before = CpuSample::now();
        let rate = measure(db, nats_url, &js, &client, messages, "e2e").await?;
        let [this, pg, nats, total] = CpuSample::now().since(&before).per_thousand(messages);
        eprintln!("  {label}: {rate:.0} messages/s");
        report.row(
            label,
            vec![
                ("messages/s end to end", format!("{rate:.0}")),
                (
                    "CPU ms/1k msgs (seawall+PG+NATS)",
                    cpu::breakdown(total, &[this, pg, nats], 0),
                ),
            ],
        );
    }
    Ok(report)
}
