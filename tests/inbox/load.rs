//! Many concurrent tasks, every message delivered three times.

use std::collections::HashMap;
use std::sync::Arc;

use rand::seq::SliceRandom;
use sea_orm::EntityTrait;

use crate::support::domain::{Balance, Entry};
use crate::support::domain::{LEDGER_CONSUMER, LedgerHandler};
use entity::prelude::*;
use service::{ConsumerName, Executor, Inbox, Outcome};

use crate::on_backends;
use crate::support::{Backend, TestDb, entry_envelope};

const MESSAGES: u64 = 2_000;
const COPIES: u64 = 3;
const TASKS: usize = 16;
const ACCOUNTS: u64 = 10;

fn amount(i: u64) -> i64 {
    (i % 97 + 1) as i64
}

async fn every_message_delivered_three_times_is_credited_once(backend: Backend) {
    let t = TestDb::new(backend).await;
    let inbox = Arc::new(Inbox::new(Executor::new(t.db.clone())));
    let consumer = ConsumerName::parse(LEDGER_CONSUMER).unwrap();
    let mut deliveries: Vec<u64> = (0..MESSAGES)
        .flat_map(|i| std::iter::repeat_n(i, COPIES as usize))
        .collect();
    deliveries.shuffle(&mut rand::rng());
    let queue = Arc::new(tokio::sync::Mutex::new(deliveries));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (inbox, consumer, queue) = (inbox.clone(), consumer.clone(), queue.clone());
        tasks.spawn(async move {
            let (mut processed, mut duplicates) = (0u64, 0u64);
            loop {
                let Some(i) = queue.lock().await.pop() else {
                    break;
                };
                let env = entry_envelope(
                    &format!("load-{i}"),
                    &format!("acct-{}", i % ACCOUNTS),
                    amount(i),
                    None,
                );
                match inbox
                    .process(&env, &consumer, &LedgerHandler::default())
                    .await
                    .unwrap()
                {
                    Outcome::Processed(_) => processed += 1,
                    Outcome::Duplicate => duplicates += 1,
                }
            }
            (processed, duplicates)
        });
    }
    let (mut processed, mut duplicates) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        let (p, d) = r.unwrap();
        processed += p;
        duplicates += d;
    }
    assert_eq!(processed, MESSAGES);
    assert_eq!(duplicates, MESSAGES * (COPIES - 1));
    assert_eq!(t.count(Entry).await, MESSAGES);
    assert_eq!(t.count(InboxMessage).await, MESSAGES);
    assert_eq!(t.count(OutboxMessage).await, MESSAGES);
    let mut expected: HashMap<String, i64> = HashMap::new();
    for i in 0..MESSAGES {
        *expected
            .entry(format!("acct-{}", i % ACCOUNTS))
            .or_default() += amount(i);
    }
    let actual: HashMap<String, i64> = Balance::find()
        .all(&t.db)
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.account_id, a.balance))
        .collect();
    assert_eq!(actual, expected);
}
on_backends!(every_message_delivered_three_times_is_credited_once: sqlite, postgres);
