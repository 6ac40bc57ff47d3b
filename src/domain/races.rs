//! `seawall demo`: the races of docs/architecture.md (rules 1-4), run against a real database and
//! narrated. It is the project's teaching tool and a way to prove the
//! guarantees on one's own PostgreSQL.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use futures::future::BoxFuture;
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter};
use tokio::sync::Barrier;

use entity::domain::{account, credit};
use entity::{inbox_message, outbox_message};
use service::domain::credits::{
    CREDIT_CONSUMER, CreditRequest, REQUESTED_SUBJECT, credit_handler, naive_apply_credit,
};
use service::executor::unit;
use service::handler;
use service::inbox::record_marker;
use service::{
    ConsumerName, Envelope, Executor, HandlerError, Inbox, InboxError, InboxErrorKind, MessageId,
    Outcome,
};

/// Runs every scenario and prints what happened. Fails if a guarantee did not hold.
pub async fn run(db: DatabaseConnection) -> Result<()> {
    let run_id = uuid::Uuid::now_v7().simple().to_string();
    let run_id = &run_id[run_id.len() - 8..];
    println!(
        "seawall demo on {:?} (run {run_id})\n",
        db.get_database_backend()
    );
    let inbox = Inbox::new(Executor::new(db.clone()));
    let consumer = ConsumerName::parse(CREDIT_CONSUMER)?;
    let mut failures = 0;
    failures += naive_race(&db, run_id).await?;
    failures += inbox_race(&db, &inbox, &consumer, run_id).await?;
    failures += rollback(&db, &inbox, &consumer, run_id).await?;
    failures += bulk_update(&db, &inbox, &consumer, run_id).await?;
    failures += other_constraint(&db, &inbox, &consumer, run_id).await?;
    if failures > 0 {
        bail!("{failures} scenario(s) did not behave as described");
    }
    println!("all guarantees held.");
    println!(
        "\nOn PostgreSQL with wal_level = logical, events can skip the outbox table: \
         SEAWALL_OUTBOX_MODE=wal SEAWALL_DATABASE_URL=postgres://... seawall run \
         (README, \"WAL mode\")."
    );
    Ok(())
}

fn envelope(id: &str, account: &str, amount: i64, reference: Option<&str>) -> Result<Envelope> {
    let req = CreditRequest {
        account_id: account.to_owned(),
        amount,
        reference: reference.map(str::to_owned),
    };
    Ok(Envelope::new(
        MessageId::parse(id)?,
        REQUESTED_SUBJECT,
        serde_json::to_vec(&req)?,
    ))
}

async fn credits_for(db: &DatabaseConnection, message_id: &str) -> Result<u64> {
    Ok(credit::Entity::find()
        .filter(credit::Column::MessageId.eq(message_id))
        .count(db)
        .await?)
}

async fn markers_for(db: &DatabaseConnection, message_id: &str) -> Result<u64> {
    Ok(inbox_message::Entity::find()
        .filter(inbox_message::Column::MessageId.eq(message_id))
        .count(db)
        .await?)
}

async fn balance(db: &DatabaseConnection, account_id: &str) -> Result<i64> {
    Ok(account::Entity::find_by_id(account_id.to_owned())
        .one(db)
        .await?
        .map_or(0, |a| a.balance))
}

fn verdict(ok: bool) -> usize {
    println!("    => {}\n", if ok { "as expected" } else { "UNEXPECTED" });
    usize::from(!ok)
}

async fn naive_race(db: &DatabaseConnection, run: &str) -> Result<usize> {
    println!("[1] The hazard: check-then-insert without a unique index");
    println!(
        "    Two instances receive the same message, both ask \"credited already?\", both hear no."
    );
    let id = format!("demo-{run}-naive");
    let env = envelope(&id, &format!("demo-{run}-naive"), 100, None)?;
    let req = CreditRequest::parse(&env.payload).map_err(anyhow::Error::msg)?;
    let gate = Arc::new(Barrier::new(2));
    let race = |gate: Arc<Barrier>| {
        let (db, env, req) = (db.clone(), env.clone(), req.clone());
        async move {
            naive_apply_credit(&db, &env.message_id, &req, async move {
                gate.wait().await;
            })
            .await
        }
    };
    let (a, b) = tokio::join!(race(gate.clone()), race(gate));
    let applied = u64::from(a?) + u64::from(b?);
    let credits = credits_for(db, &id).await?;
    println!(
        "    instances that applied the credit: {applied}; credit rows for the message: {credits}"
    );
    println!("    The balance went up twice for one message. This is the bug the inbox prevents.");
    Ok(verdict(credits == 2))
}

async fn inbox_race(
    db: &DatabaseConnection,
    inbox: &Inbox,
    consumer: &ConsumerName,
    run: &str,
) -> Result<usize> {
    println!("[2] The inbox: the unique index decides the race");
    println!("    Two instances process the same message at once, fast-path check disabled.");
    let id = format!("demo-{run}-race");
    let env = envelope(&id, &format!("demo-{run}-race"), 100, None)?;
    let inbox = inbox.clone().with_fast_path(service::FastPath::Never);
    let handler = credit_handler(Default::default());
    let (a, b) = tokio::join!(
        inbox.process(&env, consumer, &handler),
        inbox.process(&env, consumer, &handler)
    );
    let outcomes = [a?, b?].map(|o| match o {
        Outcome::Processed(_) => "Processed",
        Outcome::Duplicate => "Duplicate",
    });
    let (credits, markers) = (credits_for(db, &id).await?, markers_for(db, &id).await?);
    println!("    outcomes: {outcomes:?}; credits: {credits}; inbox markers: {markers}");
    let mut sorted = outcomes;
    sorted.sort_unstable();
    Ok(verdict(
        credits == 1 && markers == 1 && sorted == ["Duplicate", "Processed"],
    ))
}

async fn rollback(
    db: &DatabaseConnection,
    inbox: &Inbox,
    consumer: &ConsumerName,
    run: &str,
) -> Result<usize> {
    println!("[3] All or nothing: a failing handler leaves no marker, no credit, no event");
    let id = format!("demo-{run}-rollback");
    let env = envelope(&id, &format!("demo-{run}-rollback"), 100, None)?;
    let outbox_before = outbox_message::Entity::find().count(db).await?;
    let failing = handler(|ctx| -> BoxFuture<'_, Result<(), HandlerError>> {
        Box::pin(async move {
            let req =
                CreditRequest::parse(&ctx.envelope().payload).map_err(HandlerError::Rejected)?;
            service::domain::credits::apply_credit(ctx, &req).await?;
            Err(HandlerError::Failed(
                "the payment provider said no after the writes".into(),
            ))
        })
    });
    let err = match inbox.process(&env, consumer, &failing).await {
        Err(e) => e.to_string(),
        Ok(_) => "no error".into(),
    };
    let outbox_after = outbox_message::Entity::find().count(db).await?;
    let (credits, markers) = (credits_for(db, &id).await?, markers_for(db, &id).await?);
    println!("    error: {err}");
    println!(
        "    markers: {markers}; credits: {credits}; new outbox rows: {}",
        outbox_after - outbox_before
    );
    Ok(verdict(
        credits == 0 && markers == 0 && outbox_after == outbox_before,
    ))
}

async fn bulk_update(
    db: &DatabaseConnection,
    inbox: &Inbox,
    consumer: &ConsumerName,
    run: &str,
) -> Result<usize> {
    println!("[4] A bulk update_many rides on the same transaction as the marker");
    let id = format!("demo-{run}-bulk");
    let acct = format!("demo-{run}-bulk");
    let env = envelope(&id, &acct, 100, None)?;
    inbox
        .process(&env, consumer, &credit_handler(Default::default()))
        .await?;
    let before = balance(db, &acct).await?;
    println!("    message applied once; balance {before}. It is redelivered to a unit that");
    println!("    bumps every demo balance with update_many, then records the marker:");
    let (acct2, env2, consumer2) = (acct.clone(), env.clone(), consumer.clone());
    let unit = unit(move |txn| -> BoxFuture<'_, Result<(), HandlerError>> {
        let (acct, env, consumer) = (acct2.clone(), env2.clone(), consumer2.clone());
        Box::pin(async move {
            account::Entity::update_many()
                .col_expr(
                    account::Column::Balance,
                    Expr::col(account::Column::Balance).add(1_000),
                )
                .filter(account::Column::AccountId.eq(acct))
                .exec(txn)
                .await?;
            record_marker(txn, &env, &consumer).await?;
            Ok(())
        })
    });
    let result = inbox.executor().run(&unit).await;
    let rejected = matches!(&result, Err(HandlerError::Database(e)) if service::classify::classify(e) == service::classify::Failure::InboxDuplicate);
    let after = balance(db, &acct).await?;
    println!(
        "    marker rejected by {}: {rejected}; balance after: {after}",
        service::classify::INBOX_INDEX
    );
    Ok(verdict(rejected && after == before))
}

async fn other_constraint(
    db: &DatabaseConnection,
    inbox: &Inbox,
    consumer: &ConsumerName,
    run: &str,
) -> Result<usize> {
    println!("[5] Another constraint's violation is an error, not a duplicate");
    let reference = format!("demo-{run}-invoice-7");
    let first = envelope(
        &format!("demo-{run}-ref-a"),
        &format!("demo-{run}-ref"),
        100,
        Some(&reference),
    )?;
    let second = envelope(
        &format!("demo-{run}-ref-b"),
        &format!("demo-{run}-ref"),
        100,
        Some(&reference),
    )?;
    let handler = credit_handler(Default::default());
    inbox.process(&first, consumer, &handler).await?;
    let result = inbox.process(&second, consumer, &handler).await;
    let markers = markers_for(db, second.message_id.as_str()).await?;
    let ok = match result.as_ref().map_err(InboxError::kind) {
        Err(InboxErrorKind::Constraint { constraint, .. }) => {
            println!("    second message with the same reference: error, constraint {constraint}");
            true
        }
        Ok(Outcome::Duplicate) => {
            println!("    second message reported as Duplicate: it would have been acked and lost");
            false
        }
        _ => {
            println!("    unexpected: {result:?}");
            false
        }
    };
    println!("    markers for the second message: {markers} (it can be fixed and retried)");
    Ok(verdict(ok && markers == 0))
}

/// Opens the demo database: the configured one, or a fresh temporary SQLite file.
pub async fn open(url: Option<&str>) -> Result<(DatabaseConnection, Option<tempfile::TempDir>)> {
    let (url, dir) = match url {
        Some(url) => (url.to_owned(), None),
        None => {
            let dir = tempfile::tempdir().context("creating a temporary directory")?;
            let url = format!("sqlite://{}?mode=rwc", dir.path().join("demo.db").display());
            (url, Some(dir))
        }
    };
    let db = service::db::connect(&url, 8)
        .await
        .with_context(|| format!("connecting to {}", crate::config::redact(&url)))?;
    Ok((db, dir))
}
