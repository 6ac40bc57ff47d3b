//! `seawall load`: push synthetic credit requests through the inbox, each
//! several times, from several concurrent workers. Running it from several
//! processes against one database shows (and tests) that the inbox holds
//! across processes, on SQLite files as well as servers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};
use sea_orm::DatabaseConnection;
use serde::Serialize;
use tokio::sync::Semaphore;

use service::domain::credits::{CREDIT_CONSUMER, CreditRequest, REQUESTED_SUBJECT, credit_handler};
use service::{ConsumerName, Envelope, Executor, Inbox, MessageId, Outcome};

/// What one `load` run did.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub processed: u64,
    pub duplicates: u64,
    pub errors: u64,
}

/// Parameters of a run.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Distinct messages.
    #[arg(long, default_value_t = 1000)]
    pub messages: u64,
    /// How many times each message is delivered.
    #[arg(long, default_value_t = 3)]
    pub copies: u64,
    /// Concurrent workers in this process.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Accounts the credits spread over.
    #[arg(long, default_value_t = 10)]
    pub accounts: u64,
    /// Prefix of message ids and account ids, so runs do not collide.
    #[arg(long, default_value = "load")]
    pub prefix: String,
}

/// The amount the load credits for message `i`: deterministic, so a checker
/// can compute expected balances.
pub fn amount_for(i: u64) -> i64 {
    i64::try_from(i % 97 + 1).unwrap_or(1)
}

/// Runs the load and returns its summary.
pub async fn run(db: DatabaseConnection, args: &LoadArgs) -> Result<Summary> {
    if args.accounts == 0 || args.workers == 0 {
        bail!("--accounts and --workers must be at least 1");
    }
    let inbox = Arc::new(Inbox::new(Executor::new(db)));
    let consumer = ConsumerName::parse(CREDIT_CONSUMER)?;
    let permits = Arc::new(Semaphore::new(args.workers));
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let mut tasks = tokio::task::JoinSet::new();
    for _copy in 0..args.copies {
        for i in 0..args.messages {
            let req = CreditRequest {
                account_id: format!("{}-acct-{}", args.prefix, i % args.accounts),
                amount: amount_for(i),
                reference: None,
            };
            let env = Envelope::new(
                MessageId::parse(format!("{}-{i}", args.prefix))?,
                REQUESTED_SUBJECT,
                serde_json::to_vec(&req)?,
            );
            let permit = permits.clone().acquire_owned().await?;
            let (inbox, consumer, counts) = (inbox.clone(), consumer.clone(), counts.clone());
            tasks.spawn(async move {
                let slot = match inbox
                    .process(&env, &consumer, &credit_handler(Default::default()))
                    .await
                {
                    Ok(Outcome::Processed(_)) => 0,
                    Ok(Outcome::Duplicate) => 1,
                    Err(err) => {
                        tracing::error!(error = %err, "load message failed");
                        2
                    }
                };
                counts[slot].fetch_add(1, Ordering::Relaxed);
                drop(permit);
            });
        }
    }
    while tasks.join_next().await.is_some() {}
    Ok(Summary {
        processed: counts[0].load(Ordering::Relaxed),
        duplicates: counts[1].load(Ordering::Relaxed),
        errors: counts[2].load(Ordering::Relaxed),
    })
}
