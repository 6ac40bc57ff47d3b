//! Inbox cost per message: `Inbox::process` with the test ledger's handler
//! (marker + entry + balance + one outbox row) against the same business
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

use service::executor::unit;
use service::group::{Group, Joined};
use service::{
    ConsumerName, Envelope, Executor, FastPath, HandlerError, Inbox, MessageId, Outbox, OutboxMode,
};
use testkit::ledger::{EntryRequest, LEDGER_CONSUMER, LedgerHandler, RECORD_SUBJECT, add, entry};

use crate::cpu::{CpuSample, PerThousand};
use crate::pg::{self, PgServer};
use crate::report::{Column, Figures, Report};

mod servers;

const ACCOUNTS: u64 = 1_000;
/// Messages per mode processed before measuring.
const WARM_UP: u64 = 1_000;

/// The envelope of message `i`; `redelivered` as the consumer would mark a
/// second delivery.
fn envelope(run: &str, i: u64, redelivered: bool) -> Result<Envelope> {
    let req = EntryRequest {
        account_id: format!("{run}-acct-{}", i % ACCOUNTS),
        amount: 1,
        reference: None,
    };
    Ok(Envelope::new(
        MessageId::parse(format!("{run}-{i}"))?,
        RECORD_SUBJECT,
        serde_json::to_vec(&req)?,
    )
    .redelivered(redelivered))
}

#[derive(Clone, Copy)]
enum Mode {
    Seawall {
        fast_path: FastPath,
        outbox: OutboxMode,
    },
    Baseline,
}

/// What one measurement found.
struct Measured {
    /// Messages per second.
    rate: f64,
    /// CPU ms per 1,000 messages.
    cpu: PerThousand,
}

impl Measured {
    /// Adds this measurement's CPU per 1,000 messages as `{prefix}cpu_ms_per_1k_*`:
    /// on PostgreSQL the total with this process (`process_key`) and
    /// PostgreSQL as its parts; on SQLite, which runs inside this process,
    /// this process alone as the total.
    fn cpu_figures(
        &self,
        figures: Figures,
        postgres: bool,
        prefix: &str,
        process_key: &str,
    ) -> Figures {
        if postgres {
            figures
                .with(&format!("{prefix}cpu_ms_per_1k_total"), self.cpu.total())
                .with(
                    &format!("{prefix}cpu_ms_per_1k_{process_key}"),
                    self.cpu.this,
                )
                .with(
                    &format!("{prefix}cpu_ms_per_1k_postgres"),
                    self.cpu.postgres,
                )
        } else {
            figures.with(&format!("{prefix}cpu_ms_per_1k_total"), self.cpu.this)
        }
    }

    /// Figures of a seawall measurement against the baseline's rate (and
    /// its CPU, when `base_cpu` is given).
    fn against(&self, base: &Measured, base_cpu: bool, postgres: bool) -> Figures {
        let figures = Figures::new()
            .with("seawall_messages_per_s", self.rate)
            .with("baseline_messages_per_s", base.rate)
            .with("ratio_to_baseline", self.rate / base.rate);
        let figures = self.cpu_figures(figures, postgres, "", "seawall");
        if base_cpu {
            base.cpu_figures(figures, postgres, "baseline_", "process")
        } else {
            figures
        }
    }
}

/// The table: seawall's rate against the baseline's, and CPU per message of
/// each.
fn columns() -> Vec<Column> {
    vec![
        Column::figure("seawall msg/s", "seawall_messages_per_s", 0),
        Column::figure("baseline msg/s", "baseline_messages_per_s", 0),
        Column::figure("seawall/baseline", "ratio_to_baseline", 2),
        Column::breakdown(
            "CPU ms/1k msgs seawall (process+PG) / baseline",
            &[
                "cpu_ms_per_1k_total",
                "cpu_ms_per_1k_seawall",
                "cpu_ms_per_1k_postgres",
            ],
            0,
        )
        .then(&[
            "baseline_cpu_ms_per_1k_total",
            "baseline_cpu_ms_per_1k_process",
            "baseline_cpu_ms_per_1k_postgres",
        ]),
    ]
}

/// One message the baseline way: the entry insert and the balance update
/// in a bare transaction, with no marker and no outbox row; with `group`,
/// in its batch (under a savepoint, as the inbox's units), or alone when
/// the batch did not commit.
async fn baseline(executor: &Executor, group: Option<&Group>, env: Envelope) -> Result<()> {
    let work = unit(move |txn| -> BoxFuture<'_, Result<(), HandlerError>> {
        let env = env.clone();
        Box::pin(async move {
            let req = EntryRequest::parse(&env.payload).map_err(HandlerError::Rejected)?;
            entry::Entity::insert(entry::ActiveModel {
                id: NotSet,
                message_id: Set(env.message_id.to_string()),
                account_id: Set(req.account_id.clone()),
                amount: Set(req.amount),
                reference: Set(None),
                created_at: Set(chrono::Utc::now()),
            })
            .exec_without_returning(txn)
            .await?;
            add(txn, &req.account_id, req.amount).await?;
            Ok(())
        })
    });
    if let Some(group) = group {
        match group.run(executor, &work).await {
            Joined::Settled(result) => return Ok(result?),
            Joined::Alone => {}
        }
    }
    executor.run(&work).await?;
    Ok(())
}

/// One worker: takes the next message of `ids` until none is left.
async fn work(
    mode: Mode,
    inbox: Inbox,
    group: Option<Arc<Group>>,
    ids: Arc<Vec<(u64, bool)>>,
    next: Arc<AtomicU64>,
    run: String,
) -> Result<()> {
    let consumer = ConsumerName::parse(LEDGER_CONSUMER)?;
    let handler = LedgerHandler::default();
    loop {
        let n = next.fetch_add(1, Ordering::Relaxed) as usize;
        let Some(&(i, redelivered)) = ids.get(n) else {
            return Ok(());
        };
        let env = envelope(&run, i, redelivered)?;
        match mode {
            Mode::Seawall { .. } => {
                inbox.process(&env, &consumer, &handler).await?;
            }
            Mode::Baseline => baseline(inbox.executor(), group.as_deref(), env).await?,
        }
    }
}

/// Runs `ids` (message number, delivered before?) through `workers` tasks,
/// each message in its own transaction.
async fn measure(
    db: &DatabaseConnection,
    mode: Mode,
    ids: Arc<Vec<(u64, bool)>>,
    run: &str,
    workers: usize,
) -> Result<Measured> {
    measure_batched(db, mode, ids, run, workers, 1).await
}

/// [`measure`] with up to `batch` messages per transaction (group commit,
/// on as many lanes as workers, as `seawall` opens one per handler slot).
async fn measure_batched(
    db: &DatabaseConnection,
    mode: Mode,
    ids: Arc<Vec<(u64, bool)>>,
    run: &str,
    workers: usize,
    batch: usize,
) -> Result<Measured> {
    let lanes = workers;
    let group = (batch > 1).then(|| Arc::new(Group::new(batch, lanes)));
    let next = Arc::new(AtomicU64::new(0));
    let (fast_path, outbox) = match mode {
        Mode::Seawall { fast_path, outbox } => (fast_path, outbox),
        Mode::Baseline => (FastPath::Never, OutboxMode::Table),
    };
    let inbox = Inbox::new(Executor::new(db.clone()))
        .with_fast_path(fast_path)
        .with_outbox(Outbox::new(outbox))
        .with_batching(batch, lanes);
    let cpu_before = CpuSample::now();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        tasks.spawn(work(
            mode,
            inbox.clone(),
            group.clone(),
            ids.clone(),
            next.clone(),
            run.to_owned(),
        ));
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

/// Whether `db` is PostgreSQL (the only backend with a CPU split and a
/// `LISTEN/NOTIFY` trigger).
fn is_postgres(db: &DatabaseConnection) -> bool {
    db.get_database_backend() == sea_orm::DbBackend::Postgres
}

/// Turns the `LISTEN/NOTIFY` trigger of the outbox off or on again.
async fn notify_trigger(db: &DatabaseConnection, enable: bool) -> Result<()> {
    let verb = if enable { "ENABLE" } else { "DISABLE" };
    db.execute_unprepared(&format!(
        "ALTER TABLE outbox_message {verb} TRIGGER tr_outbox_message_notify"
    ))
    .await?;
    Ok(())
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
    base: &Measured,
) -> Result<()> {
    let postgres = is_postgres(db);
    let mut cases = vec![(
        "fast-path look-up before every message",
        FastPath::Always,
        false,
    )];
    if postgres {
        cases.push(("without the NOTIFY trigger", FastPath::default(), true));
        wal_outbox(report, label, db, messages, run_id, base).await?;
    }
    for (name, fast_path, no_trigger) in cases {
        if no_trigger {
            notify_trigger(db, false).await?;
        }
        let ids = Arc::new(fresh(messages));
        let prefix = format!("v{fast_path:?}{no_trigger}-{run_id}");
        let m = measure(
            db,
            Mode::Seawall {
                fast_path,
                outbox: OutboxMode::Table,
            },
            ids,
            &prefix,
            16,
        )
        .await;
        if no_trigger {
            notify_trigger(db, true).await?;
        }
        let m = m?;
        eprintln!("  {label} 16 workers, {name}: {:.0}/s", m.rate);
        report.row(
            format!("{label}, 16 workers, {name}"),
            m.against(base, false, postgres),
        );
    }
    Ok(())
}

/// At 16 workers, the handler's event written into the WAL
/// (`outbox_mode = "wal"`) instead of an outbox row, with the slot in place
/// as a WAL-mode service has it (nothing reads it during the measurement).
async fn wal_outbox(
    report: &mut Report,
    label: &str,
    db: &DatabaseConnection,
    messages: u64,
    run_id: &str,
    base: &Measured,
) -> Result<()> {
    let slot = format!("seawall_bench_{}", &run_id[run_id.len() - 12..]);
    worker::relay::wal::prepare(db, &slot).await?;
    let ids = Arc::new(fresh(messages));
    let seawall = Mode::Seawall {
        fast_path: FastPath::default(),
        outbox: OutboxMode::Wal,
    };
    let m = measure(db, seawall, ids, &format!("wal-{run_id}"), 16).await;
    worker::relay::wal::drop_slot(db, &slot).await?;
    let m = m?;
    eprintln!("  {label} 16 workers, WAL outbox: {:.0}/s", m.rate);
    report.row(
        format!("{label}, 16 workers, WAL outbox (outbox_mode = wal)"),
        m.against(base, false, true),
    );
    Ok(())
}

/// Warm-up, then fresh planner statistics: without them PostgreSQL plans
/// the first statements against near-empty tables (sequential scans) and
/// keeps those plans while the tables grow, which would measure the
/// planner, not the inbox.
async fn warm_up(db: &DatabaseConnection, run_id: &str) -> Result<()> {
    let warm = Arc::new(fresh(WARM_UP));
    let seawall = Mode::Seawall {
        fast_path: FastPath::default(),
        outbox: OutboxMode::Table,
    };
    measure(db, seawall, warm.clone(), &format!("ws-{run_id}"), 4).await?;
    measure(db, Mode::Baseline, warm, &format!("wb-{run_id}"), 4).await?;
    if is_postgres(db) {
        db.execute_unprepared("ANALYZE").await?;
    }
    Ok(())
}

/// seawall against the baseline at 1 to 64 workers, with the variants at 16.
async fn scaling(
    report: &mut Report,
    label: &str,
    db: &DatabaseConnection,
    messages: u64,
    run_id: &str,
) -> Result<()> {
    let postgres = is_postgres(db);
    let seawall = Mode::Seawall {
        fast_path: FastPath::default(),
        outbox: OutboxMode::Table,
    };
    for workers in [1usize, 4, 16, 64] {
        let ids = Arc::new(fresh(messages));
        let base_run = format!("b{workers}-{run_id}");
        let base = measure(db, Mode::Baseline, ids.clone(), &base_run, workers).await?;
        let sw_run = format!("s{workers}-{run_id}");
        let sw = measure(db, seawall, ids, &sw_run, workers).await?;
        eprintln!(
            "  {label} {workers} workers: seawall {:.0}/s, baseline {:.0}/s",
            sw.rate, base.rate
        );
        report.row(
            format!("{label}, {workers} workers"),
            sw.against(&base, true, postgres),
        );
        if workers == 16 {
            variants(report, label, db, messages, run_id, &base).await?;
        }
        // The batch size sets how many commits are shared and how many
        // lanes run at once (one per `batch` workers): measured at 16
        // workers for each candidate default.
        let sizes: &[usize] = match workers {
            16 => &[4, 8, 16],
            64 => &[16],
            _ => &[],
        };
        for &batch in sizes {
            batched(report, label, db, messages, run_id, workers, batch).await?;
        }
    }
    Ok(())
}

/// Group commit at `workers`: seawall with `INBOX_BATCH` = `batch`
/// against the baseline batched the same way, so the ratio is the inbox's
/// own cost (marker and outbox row), not the commits'.
async fn batched(
    report: &mut Report,
    label: &str,
    db: &DatabaseConnection,
    messages: u64,
    run_id: &str,
    workers: usize,
    batch: usize,
) -> Result<()> {
    let ids = Arc::new(fresh(messages));
    let base = measure_batched(
        db,
        Mode::Baseline,
        ids.clone(),
        &format!("gb{workers}x{batch}-{run_id}"),
        workers,
        batch,
    )
    .await?;
    let seawall = Mode::Seawall {
        fast_path: FastPath::default(),
        outbox: OutboxMode::Table,
    };
    let sw = measure_batched(
        db,
        seawall,
        ids,
        &format!("gs{workers}x{batch}-{run_id}"),
        workers,
        batch,
    )
    .await?;
    eprintln!(
        "  {label} {workers} workers, batches of {batch}: seawall {:.0}/s, baseline {:.0}/s",
        sw.rate, base.rate
    );
    report.row(
        format!(
            "{label}, {workers} workers, batched ({batch} per transaction, baseline batched too)"
        ),
        sw.against(&base, true, is_postgres(db)),
    );
    Ok(())
}

/// 30% duplicates: the first 70% are new, then 30% are redeliveries of
/// earlier ids (marked so, as the consumer marks them), with each fast path.
async fn duplicates(
    report: &mut Report,
    label: &str,
    db: &DatabaseConnection,
    messages: u64,
    run_id: &str,
) -> Result<()> {
    for (name, fast_path) in [
        ("fast path on redeliveries", FastPath::Redeliveries),
        ("fast path always", FastPath::Always),
        ("index only", FastPath::Never),
    ] {
        let prefix = format!("d{fast_path:?}-{run_id}");
        let first = messages * 7 / 10;
        let mut ids = fresh(first);
        ids.extend((0..messages - first).map(|i| (i % first.max(1), true)));
        let m = measure(
            db,
            Mode::Seawall {
                fast_path,
                outbox: OutboxMode::Table,
            },
            Arc::new(ids),
            &prefix,
            16,
        )
        .await?;
        eprintln!("  {label} 30% duplicates, {name}: {:.0}/s", m.rate);
        let figures = Figures::new().with("seawall_messages_per_s", m.rate);
        report.row(
            format!("{label}, 16 workers, 30% duplicates, {name}"),
            m.cpu_figures(figures, is_postgres(db), "", "seawall"),
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
    warm_up(db, &run_id).await?;
    scaling(report, label, db, messages, &run_id).await?;
    duplicates(report, label, db, messages, &run_id).await
}

/// A report with this scenario's columns and setup.
fn report(messages: u64) -> Report {
    let mut report = Report::new("inbox", columns());
    report.setup(
        "messages",
        format!("{messages} per measurement, {ACCOUNTS} accounts, one entry of 1 each"),
    );
    report.setup(
        "baseline",
        "the same entry insert and balance update in a bare transaction: no marker, no outbox row",
    );
    report.setup(
        "fast path",
        "the default (look-up only before redeliveries) unless the row names another",
    );
    report.setup(
        "CPU",
        "user+system time of this process and of all postgres processes, per 1,000 messages (on SQLite, which runs inside this process, and on MariaDB, this process alone)",
    );
    report.setup(
        "warm-up",
        format!("{WARM_UP} messages per mode at 4 workers, then ANALYZE (PostgreSQL)"),
    );
    report
}

/// Runs the scenario on PostgreSQL, on MariaDB or MySQL at `mysql` if
/// given, and on SQLite twice: with the default `synchronous = FULL` (a
/// commit survives a power cut) and with `NORMAL`
/// (`SEAWALL_SQLITE_SYNCHRONOUS=normal`), so the price of durability is a
/// row apart.
pub async fn run(pg: &mut PgServer, messages: u64, mysql: Option<&str>) -> Result<Report> {
    let mut report = report(messages);
    let dir = tempfile::tempdir()?;
    let (pg_db, _) = pg.fresh("inbox").await?;
    report.version("PostgreSQL", pg::version(&pg_db).await?);
    on_backend(&mut report, "PostgreSQL", &pg_db, messages).await?;
    if let Some(base) = mysql {
        let mariadb = servers::Scratch::create(base).await?;
        report.version("MariaDB", servers::mysql_version(&mariadb.db).await?);
        let measured = on_backend(&mut report, "MariaDB", &mariadb.db, messages).await;
        mariadb.drop_database().await?;
        measured?;
    }
    for (label, synchronous) in [
        ("SQLite", service::db::SqliteSync::Full),
        ("SQLite synchronous=NORMAL", service::db::SqliteSync::Normal),
    ] {
        let sqlite = servers::sqlite(dir.path(), synchronous).await?;
        if !report.has_version("SQLite") {
            report.version("SQLite", servers::sqlite_version(&sqlite).await?);
        }
        on_backend(&mut report, label, &sqlite, messages).await?;
    }
    Ok(report)
}
