//! The dashboard in a real headless Chromium: it loads, shows the numbers the
//! API reports, its replay button moves a dead letter back into flow, and a
//! dead letter replayed meanwhile by someone else is shown refused (409).

use std::time::Duration;

use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

use crate::support::domain::entry;
use entity::dead_letter;

use crate::harness::{TOKEN, dead};
use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, free_port, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_shows_the_api_numbers_and_replays_a_dead_letter() {
    let python = std::env::var("SEAWALL_TEST_PYTHON")
        .expect("SEAWALL_TEST_PYTHON: run the suite with scripts/test");
    let t = TestDb::new(Backend::Sqlite).await;
    let nats = NatsServer::start().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let base = format!("http://{addr}");
    let env = vec![
        ("SEAWALL_DATABASE_URL", t.url.clone()),
        ("SEAWALL_NATS_URL", nats.url()),
        ("SEAWALL_API_ADDR", addr.clone()),
        ("SEAWALL_ADMIN_TOKEN", TOKEN.to_owned()),
    ];
    let mut run = Seawall::spawn(&["run"], &env);
    let http = crate::support::http_client();
    wait_until("the API to answer", Duration::from_secs(30), || async {
        http.get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    // A credit request that failed earlier and was dead-lettered; it is valid
    // now, so a replay applies it.
    dead_letter::Entity::insert(dead("ledger", Some("replay-me")))
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    dead_letter::Entity::insert(dead("ledger", Some("replayed-elsewhere")))
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    dead_letter::Entity::insert(dead("ledger", None))
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    let id = dead_letter::Entity::find()
        .filter(dead_letter::Column::MessageId.eq("replay-me"))
        .one(&t.db)
        .await
        .unwrap()
        .unwrap()
        .id;
    let stale = dead_letter::Entity::find()
        .filter(dead_letter::Column::MessageId.eq("replayed-elsewhere"))
        .one(&t.db)
        .await
        .unwrap()
        .unwrap()
        .id;

    let screenshot = std::env::temp_dir().join("seawall-dashboard.png");
    let journey = std::env::temp_dir().join("seawall-journey.png");
    let out = tokio::process::Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/api/dashboard_check.py"
        ))
        .args([
            &base,
            TOKEN,
            &id.to_string(),
            screenshot.to_str().unwrap(),
            journey.to_str().unwrap(),
            &stale.to_string(),
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "browser check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "dashboard screenshots: {} {}",
        screenshot.display(),
        journey.display()
    );

    wait_until(
        "the replayed credit to be applied",
        Duration::from_secs(30),
        || async {
            entry::Entity::find()
                .filter(entry::Column::MessageId.eq("replay-me"))
                .one(&t.db)
                .await
                .unwrap()
                .is_some()
        },
    )
    .await;
    let row = dead_letter::Entity::find_by_id(id)
        .one(&t.db)
        .await
        .unwrap()
        .unwrap();
    assert!(row.replayed_at.is_some());
    assert!(run.terminate().await.success());
    run.assert_no_panic();
}
