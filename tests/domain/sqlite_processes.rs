//! SQLite shared by several processes at once (WAL and busy timeout).

use std::process::Stdio;

use sea_orm::EntityTrait;

use entity::domain::{account::Entity as Account, credit::Entity as Credit};
use entity::prelude::InboxMessage;

use crate::support::{Backend, TestDb};

const MESSAGES: u64 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_share_one_sqlite_file_and_apply_each_message_once() {
    let t = TestDb::new(Backend::Sqlite).await;
    let mut children = Vec::new();
    for _ in 0..3 {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_seawall"))
            .args([
                "load",
                "--messages",
                &MESSAGES.to_string(),
                "--copies",
                "2",
                "--workers",
                "4",
            ])
            .args(["--accounts", "5", "--prefix", "mp"])
            .env("SEAWALL_DATABASE_URL", &t.url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn seawall load");
        children.push(child);
    }
    let (mut processed, mut duplicates) = (0, 0);
    for child in children {
        let out = child.wait_with_output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "seawall load failed: {stderr}");
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["errors"], 0, "{summary}");
        processed += summary["processed"].as_u64().unwrap();
        duplicates += summary["duplicates"].as_u64().unwrap();
    }
    assert_eq!(
        processed, MESSAGES,
        "each message processed by exactly one process"
    );
    assert_eq!(duplicates, MESSAGES * 6 - MESSAGES);
    assert_eq!(t.count(Credit).await, MESSAGES);
    assert_eq!(t.count(InboxMessage).await, MESSAGES);
    let total: i64 = Account::find()
        .all(&t.db)
        .await
        .unwrap()
        .iter()
        .map(|a| a.balance)
        .sum();
    let expected: i64 = (0..MESSAGES).map(|i| (i % 97 + 1) as i64).sum();
    assert_eq!(total, expected);
}
