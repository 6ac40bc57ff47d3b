//! Fuzzes the API against its own OpenAPI document with schemathesis: no
//! 5xx, and every response matches the documented schema, status and
//! content type.

use chrono::Duration;
use sea_orm::EntityTrait;

use entity::{dead_letter, inbox_message};

use crate::harness::{TOKEN, TestApi, dead, insert_outbox, marker, outbox_row};
use crate::support::Backend;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_conforms_to_its_openapi_document_under_fuzzing() {
    let schemathesis = std::env::var("SEAWALL_TEST_SCHEMATHESIS")
        .expect("SEAWALL_TEST_SCHEMATHESIS: run the suite with scripts/test");
    let api = TestApi::start(Backend::Sqlite).await;
    insert_outbox(
        &api,
        (0..20)
            .map(|i| {
                outbox_row(
                    &format!("m-{i}"),
                    "ledger.recorded",
                    ["pending", "published", "dead"][i % 3],
                    Duration::minutes(i as i64),
                )
            })
            .collect(),
    )
    .await;
    inbox_message::Entity::insert_many(
        ["processed", "claimed", "expired_claim", "quarantined"]
            .iter()
            .enumerate()
            .map(|(i, s)| marker(&format!("i-{i}"), "hook", s)),
    )
    .exec_without_returning(&api.t.db)
    .await
    .unwrap();
    dead_letter::Entity::insert_many(vec![dead("ledger", Some("d-1")), dead("ledger", None)])
        .exec_without_returning(&api.t.db)
        .await
        .unwrap();

    let out = tokio::process::Command::new(schemathesis)
        .arg("run")
        .arg(format!("{}/api/v1/openapi.json", api.base))
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .args(["-c", "not_a_server_error,response_schema_conformance,content_type_conformance,status_code_conformance"])
        .args(["-n", "25", "--no-color"])
        .env("SCHEMATHESIS_HOOKS", "")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = stdout
        .lines()
        .filter(|l| l.contains("passed") || l.contains("generated"))
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!("schemathesis: {summary}");
}
