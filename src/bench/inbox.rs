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
    ConnectionTrait, DatabaseConnection, EntityTrait,
};

use entity::demo::credit;
use service::demo::credits::{CreditHandler, CreditRequest, REQUESTED_SUBJECT, add_to_balance};
use service::executor::unit;
use service::{ConsumerName, Envelope, Executor, FastPath, HandlerError, Inbox, MessageId};

use super::cpu::{self, CpuSample};
use super::report::Report;

const ACCOUNTS: u64 = 1_000;
/// Messages per mode processed before measuring.
const WARM_UP: u64 = 1_000;

/// The envelope of message `i`; `redelivered` as the consumer would mark a
/// second delivery.
fn envelope(run: &str, i: u64, redelivered: bool) -> Result<Envelope> {
    let req = CreditRequest {
        account_id: format!("{run}-acct-{}", i % ACCOUNTS),
        amount: 1,
        reference: None,
    };
    Ok(Envelope::new(
        MessageId::parse(format!("{run}-{i}"))?,
        REQUESTED_SUBJECT,
        serde_json::to_vec(&req)?,
    )
    .redelivered(redelivered))
}

#[derive(Clone, Copy)]
enum Mode {
    Seawall { fast_path: FastPath },
    Baseline,
}

/// What one measurement found.
struct Measured {
    /// Messages per second.
    rate: f64,
    /// CPU ms per 1,000 messages: this process, PostgreSQL, NATS, total.
    cpu: [f64; 4],
}

impl Measured {
    /// "total (this process + PostgreSQL)" CPU ms per 1,000 messages.
    fn cpu_cell(&self, backend: &str) -> String {
        let [this, pg, _, total] = self.cpu;
        if backend == "PostgreSQL" {
            cpu::breakdown(total, &[this, pg], 0)
        } else {
            format!("{this:.0}")
        }
    }
}

/// Runs `ids` (message number, delivered before?) through `workers` tasks.
async fn measure(
    db: &DatabaseConnection,
    mode: Mode,
    ids: Arc<Vec<(u64, bool)>>,
    run: &str,
    workers: usize,
) -> Result<Measured> {
    let next = Arc::new(AtomicU64::new(0));
    let fast_path = match mode {
        Mode::Seawall { fast_path } => fast_path,
        Mode::Baseline => FastPath::Never,
    };
    let inbox = Inbox::new(Executor::new(db.clone())).with_fast_path(fast_path);
    let consumer = ConsumerName::parse("credit")?;
    let cpu_before = CpuSample::now();
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
                let Some(&(i, redelivered)) = ids.get(n) else {
                    return Ok::<_, anyhow::Error>(());
                };
                let env = envelope(&run, i, redelivered)?;
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
    let rate = ids.len() as f64 / started.elapsed().as_secs_f64();
    let cpu = CpuSample::now()
        .since(&cpu_before)
        .per_thousand(ids.len() as u64);
    Ok(Measured { rate, cpu })
}

/// Messages `0..n`, each delivered for the first time.
fn fresh(n: u64) -> Vec<(u64, bool)> {
    (0..n).map(|i| (i, false)).collect()
}

/// At 16 workers, what parts of the overhead cost: the same run with the
/// fast-path look-up before every message, and on PostgreSQL without the
/// `LISTEN/NOTIFY` trigger (whose commit-time queue lock serialises
/// committing transactions).
async fn variants(
    report: &mut Report,
    label: &str,
    db: &DatabaseConnection,
    messages: u64,
    run_id: &str,
    base_rate: f64,
    cpu_column: &str,
) -> Result<()> {
    let postgres = db.get_database_backend() == sea_orm::DbBackend::Postgres;
    let mut cases = vec![(
        "fast-path look-up before every message",
        FastPath::Always,
        false,
    )];
    if postgres {
        cases.push(("without the NOTIFY trigger", FastPath::default(), true));
    }
    for (name, fast_path, no_trigger) in cases {
        if no_trigger {
            db.execute_unprepared(
                "ALTER TABLE outbox_message DISABLE TRIGGER tr_outbox_message_notify",
            )
            .await?;
        }
        let ids = Arc::new(fresh(messages));
        let prefix = format!("v{fast_path:?}{no_trigger}-{run_id}");
        let m = measure(db, Mode::Seawall { fast_path }, ids, &prefix, 16).await;
        if no_trigger {
            db.execute_unprepared(
                "ALTER TABLE outbox_message ENABLE TRIGGER tr_outbox_message_notify",
            )
            .await?;
        }
        let m = m?;
        eprintln!("  {label} 16 workers, {name}: {:.0}/s", m.rate);
        report.row(
            format!("{label}, 16 workers, {name}"),
            vec![
                ("seawall msg/s", format!("{:.0}", m.rate)),
                ("baseline msg/s", format!("{base_rate:.0}")),
                ("seawall/baseline", format!("{:.2}", m.rate / base_rate)),
                (cpu_column, m.cpu_cell(label)),
            ],
        );
    }
    Ok(())
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
    let warm = Arc::new(fresh(WARM_UP));
    measure(
        db,
        Mode::Seawall {
            fast_path: FastPath::default(),
        },
        warm.clone(),
        &format!("ws-{run_id}"),
        4,
    )
    .await?;
    measure(db, Mode::Baseline, warm, &format!("wb-{run_id}"), 4).await?;
    if db.get_database_backend() == sea_orm::DbBackend::Postgres {
        db.execute_unprepared("ANALYZE").await?;
    }
    let cpu_column = if label == "PostgreSQL" {
        "CPU ms/1k msgs seawall (process+PG) / baseline"
    } else {
        "CPU ms/1k msgs seawall / baseline"
    };
    for workers in [1usize, 4, 16, 64] {
        let ids = Arc::new(fresh(messages));
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
            Mode::Seawall {
                fast_path: FastPath::default(),
            },
            ids,
            &format!("s{workers}-{run_id}"),
            workers,
        )
        .await?;
        let (sw_rate, base_rate) = (sw.rate, base.rate);
        eprintln!("  {label} {workers} workers: seawall {sw_rate:.0}/s, baseline {base_rate:.0}/s");
        report.row(
            format!("{label}, {workers} workers"),
            vec![
                ("seawall msg/s", format!("{sw_rate:.0}")),
                ("baseline msg/s", format!("{base_rate:.0}")),
                ("seawall/baseline", format!("{:.2}", sw_rate / base_rate)),
                (
                    cpu_column,
                    format!("{} / {}", sw.cpu_cell(label), base.cpu_cell(label)),
                ),
            ],
        );
        if workers == 16 {
            variants(report, label, db, messages, &run_id, base_rate, cpu_column).await?;
        }
    }
    // 30% duplicates: the first 70% are new, then 30% are redeliveries of
    // earlier ids (marked so, as the consumer marks them).
    for (name, fast_path) in [
        ("fast path on redeliveries", FastPath::Redeliveries),
        ("fast path always", FastPath::Always),
        ("index only", FastPath::Never),
    ] {
        let prefix = format!("d{fast_path:?}-{run_id}");
        let first = messages * 7 / 10;
        let mut ids = fresh(first);
        ids.extend((0..messages - first).map(|i| (i % first.max(1), true)));
        let m = measure(db, Mode::Seawall { fast_path }, Arc::new(ids), &prefix, 16).await?;
        let rate = m.rate;
        eprintln!("  {label} 30% duplicates, {name}: {rate:.0}/s");
        report.row(
            format!("{label}, 16 workers, 30% duplicates, {name}"),
            vec![
                ("seawall msg/s", format!("{rate:.0}")),
                ("baseline msg/s", "-".into()),
                ("seawall/baseline", "-".into()),
                (cpu_column, m.cpu_cell(label)),
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
        "fast path".into(),
        "the default (look-up only before redeliveries) unless the row names another".into(),
    ));
    report.setup.push((
        "CPU".into(),
        "user+system time of this process and of all postgres processes, per 1,000 messages".into(),
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
