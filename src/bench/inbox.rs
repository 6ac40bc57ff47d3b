//! Inbox cost per message: `Inbox::process` with the demo credit handler
//! (marker + credit + balance + one outbox row) against the same business
//! writes in a bare transaction, at 1 to 64 concurrent workers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Result;
use futures::future::BoxFuture;
use sea_orm::{
    ActiveValue::{NotSet, Set},
    DatabaseConnection, EntityTrait,
};

use entity::credit;
use service::credits::{CreditHandler, CreditRequest, REQUESTED_SUBJECT, add_to_balance};
use service::executor::unit;
use service::{ConsumerName, Envelope, Executor, HandlerError, Inbox, MessageId};

use super::report::Report;

const ACCOUNTS: u64 = 1_000;
/// Messages per mode processed before measuring.
const WARM_UP: u64 = 1_000;

fn envelope(run: &str, i: u64) -> Result<Envelope> {
    let req = CreditRequest {
        account_id: format!("{run}-acct-{}", i % ACCOUNTS),
        amount: 1,
        reference: None,
    };
    Ok(Envelope::new(
        MessageId::parse(format!("{run}-{i}"))?,
        REQUESTED_SUBJECT,
        serde_json::to_vec(&req)?,
    ))
}

#[derive(Clone, Copy)]
enum Mode {
    Seawall { fast_path: bool },
    Baseline,
}

/// Runs `ids` through `workers` tasks; returns messages per second.
async fn measure(
    db: &DatabaseConnection,
    mode: Mode,
    ids: Arc<Vec<u64>>,
    run: &str,
    workers: usize,
) -> Result<f64> {
    let next = Arc::new(AtomicU64::new(0));
    let inbox = Inbox::new(Executor::new(db.clone()))
        .with_fast_path(matches!(mode, Mode::Seawall { fast_path: true }));
    let consumer = ConsumerName::parse("credit")?;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (ids, next, inbox, consumer, run) = (
            ids.clone(),
            next.clone(),
            inbox.clone(),
            consumer.clone(),
            run.to_owned(),
        );
        tasks.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(&i) = ids.get(n) else {
                    return Ok::<_, anyhow::Error>(());
                };
                let env = envelope(&run, i)?;
                match mode {
                    Mode::Seawall { .. } => {
                        inbox
                            .process(&env, &consumer, &CreditHandler::default())
                            .await?;
                    }
                    Mode::Baseline => {
                        let work = unit(move |txn| -> BoxFuture<'_, Result<(), HandlerError>> {
                            let env = env.clone();
                            Box::pin(async move {
                                let req = CreditRequest::parse(&env.payload)
                                    .map_err(HandlerError::Rejected)?;
                                credit::Entity::insert(credit::ActiveModel {
                                    id: NotSet,
                                    message_id: Set(env.message_id.to_string()),
                                    account_id: Set(req.account_id.clone()),
                                    amount: Set(req.amount),
                                    reference: Set(None),
                                    created_at: Set(chrono::Utc::now()),
                                })
                                .exec_without_returning(txn)
                                .await?;
                                add_to_balance(txn, &req.account_id, req.amount).await?;
                                Ok(())
                            })
                        });
                        inbox.executor().run(&work).await?;
                    }
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(ids.len() as f64 / started.elapsed().as_secs_f64())
}

/// Runs the scenario on one backend, adding rows to `report`.
async fn on_backend(
    report: &mut Report,
    label: &str,
    db: &DatabaseConnection,
    messages: u64,
) -> Result<()> {
    let run_id = uuid::Uuid::now_v7().simple().to_string();
    // Warm-up, then fresh planner statistics: without them PostgreSQL plans
    // the first statements against near-empty tables (sequential scans) and
    // keeps those plans while the tables grow, which would measure the
    // planner, not the inbox.
    let warm: Arc<Vec<u64>> = Arc::new((0..WARM_UP).collect());
    measure(
        db,
        Mode::Seawall { fast_path: true },
        warm.clone(),
        &format!("ws-{run_id}"),
        4,
    )
    .await?;
    measure(db, Mode::Baseline, warm, &format!("wb-{run_id}"), 4).await?;
    if db.get_database_backend() == sea_orm::DbBackend::Postgres {
        use sea_orm::ConnectionTrait;
        db.execute_unprepared("ANALYZE").await?;
    }
    for workers in [1usize, 4, 16, 64] {
        let ids: Arc<Vec<u64>> = Arc::new((0..messages).collect());
        let base = measure(
            db,
            Mode::Baseline,
            ids.clone(),
            &format!("b{workers}-{run_id}"),
            workers,
        )
        .await?;
        let sw = measure(
            db,
            Mode::Seawall { fast_path: true },
            ids,
            &format!("s{workers}-{run_id}"),
            workers,
        )
        .await?;
        eprintln!("  {label} {workers} workers: seawall {sw:.0}/s, baseline {base:.0}/s");
        report.row(
            format!("{label}, {workers} workers"),
            vec![
                ("seawall msg/s", format!("{sw:.0}")),
                ("baseline msg/s", format!("{base:.0}")),
                ("seawall/baseline", format!("{:.2}", sw / base)),
            ],
        );
    }
    // 30% duplicates: the first 70% are new, then 30% replay earlier ids.
    for fast_path in [true, false] {
        let prefix = format!("d{fast_path}-{run_id}");
        let fresh = messages * 7 / 10;
        let mut ids: Vec<u64> = (0..fresh).collect();
        ids.extend((0..messages - fresh).map(|i| i % fresh.max(1)));
        let rate = measure(db, Mode::Seawall { fast_path }, Arc::new(ids), &prefix, 16).await?;
        let label2 = if fast_path { "fast path" } else { "index only" };
        eprintln!("  {label} 30% duplicates, {label2}: {rate:.0}/s");
        report.row(
            format!("{label}, 16 workers, 30% duplicates, {label2}"),
            vec![
                ("seawall msg/s", format!("{rate:.0}")),
                ("baseline msg/s", "-".into()),
                ("seawall/baseline", "-".into()),
            ],
        );
    }
    Ok(())
}

/// Runs the scenario on SQLite and PostgreSQL.
pub async fn run(pg: &str, messages: u64) -> Result<Report> {
    let mut report = Report::new("inbox");
    let dir = tempfile::tempdir()?;
    let sqlite = service::db::connect(
        &format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("bench.db").display()
        ),
        16,
    )
    .await?;
    {
        use migration::MigratorTrait;
        migration::Migrator::up(&sqlite, None).await?;
    }
    let (pg_db, _) = super::fresh_pg(pg, "inbox").await?;
    report
        .versions
        .push(("PostgreSQL".into(), super::pg_version(&pg_db).await?));
    report
        .versions
        .push(("SQLite".into(), sqlite_version(&sqlite).await?));
    report.setup.push((
        "messages".into(),
        format!("{messages} per measurement, {ACCOUNTS} accounts, one credit of 1 cent each"),
    ));
    report.setup.push((
        "baseline".into(),
        "the same credit insert and balance update in a bare transaction: no marker, no outbox row"
            .into(),
    ));
    report.setup.push((
        "warm-up".into(),
        format!("{WARM_UP} messages per mode at 4 workers, then ANALYZE (PostgreSQL)"),
    ));
    on_backend(&mut report, "PostgreSQL", &pg_db, messages).await?;
    on_backend(&mut report, "SQLite", &sqlite, messages).await?;
    Ok(report)
}

async fn sqlite_version(db: &DatabaseConnection) -> Result<String> {
    use sea_orm::{ConnectionTrait, DbBackend, Statement};
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Sqlite,
            "SELECT sqlite_version() AS v",
        ))
        .await?
        .ok_or_else(|| anyhow::anyhow!("no version"))?;
    Ok(row.try_get::<String>("", "v")?)
}
