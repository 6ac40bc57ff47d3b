//! Each endpoint: success, auth failure, bad input, empty results, pagination.

use std::collections::HashSet;

use chrono::Duration;
use sea_orm::EntityTrait;

use entity::{dead_letter, inbox_message};

use crate::harness::{TOKEN, TestApi, dead, insert_outbox, marker, outbox_row};
use crate::on_backends;
use crate::support::Backend;

async fn requests_without_the_right_token_get_a_json_401(backend: Backend) {
    let api = TestApi::start(backend).await;
    for path in [
        "/api/v1/stats",
        "/api/v1/outbox",
        "/api/v1/inbox",
        "/api/v1/dead-letters",
        "/api/v1/openapi.json",
    ] {
        let url = format!("{}{path}", api.base);
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Basic czNjcmV0"),
            Some(TOKEN),
        ] {
            let mut req = api.http.get(&url);
            if let Some(a) = auth {
                req = req.header("Authorization", a);
            }
            let res = req.send().await.unwrap();
            assert_eq!(res.status(), 401, "{path} with {auth:?}");
            let body: serde_json::Value = res.json().await.unwrap();
            assert_eq!(body["error"]["code"], "unauthorized");
        }
        let (status, _) = api.get(path).await;
        assert_eq!(status, 200, "{path} with the token");
    }
    let res = api
        .http
        .post(format!("{}/api/v1/prune", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    // Health needs no token.
    assert_eq!(
        api.http
            .get(format!("{}/healthz", api.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        api.http
            .get(format!("{}/readyz", api.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}
on_backends!(requests_without_the_right_token_get_a_json_401: sqlite, postgres);

async fn empty_tables_give_empty_pages_and_zero_stats(backend: Backend) {
    let api = TestApi::start(backend).await;
    for path in [
        "/api/v1/outbox",
        "/api/v1/inbox",
        "/api/v1/dead-letters",
        "/api/v1/outbox?status=dead",
        "/api/v1/inbox?state=quarantined",
    ] {
        let (status, body) = api.get(path).await;
        assert_eq!(status, 200);
        assert_eq!(body["items"], serde_json::json!([]), "{path}");
        assert!(body["next_after"].is_null());
    }
    let (_, stats) = api.get("/api/v1/stats").await;
    assert_eq!(
        stats["outbox"],
        serde_json::json!({"pending": 0, "published": 0, "dead": 0})
    );
    assert_eq!(stats["dead_letters"], 0);
    assert!(stats["oldest_pending_age_seconds"].is_null());
    assert_eq!(stats["throughput"].as_array().unwrap().len(), 15);
}
on_backends!(empty_tables_give_empty_pages_and_zero_stats: sqlite, postgres);

async fn bad_parameters_get_a_400_naming_the_parameter(backend: Backend) {
    let api = TestApi::start(backend).await;
    for (path, needle) in [
        ("/api/v1/outbox?limit=0", "limit"),
        ("/api/v1/outbox?limit=501", "limit"),
        ("/api/v1/outbox?limit=many", "limit"),
        ("/api/v1/outbox?status=lost", "status"),
        ("/api/v1/outbox?from=yesterday", "from"),
        ("/api/v1/outbox?after=x", "after"),
        (
            "/api/v1/outbox?from=2026-02-01T00:00:00Z&to=2026-01-01T00:00:00Z",
            "from",
        ),
        ("/api/v1/inbox?state=stuck", "state"),
        ("/api/v1/dead-letters?replayed=perhaps", "replayed"),
        ("/api/v1/outbox/abc", "path"),
        ("/api/v1/dead-letters/1.5", "path"),
    ] {
        let (status, body) = api.get(path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"]["code"], "bad_request");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{path}: {message}");
    }
    let res = api
        .http
        .post(format!("{}/api/v1/outbox/retry", api.base))
        .bearer_auth(TOKEN)
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let big = format!("{{\"subject\":\"{}\"}}", "x".repeat(200_000));
    // The server answers 413 before reading the whole body and then closes
    // the connection; `Connection: close` keeps the client from reusing it
    // for the next request and reading that close as a broken answer.
    let res = api
        .http
        .post(format!("{}/api/v1/outbox/retry", api.base))
        .bearer_auth(TOKEN)
        .header("Content-Type", "application/json")
        .header("Connection", "close")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 413, "bodies are limited");
    let (status, body) = api.get("/api/v1/nothing-here").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (status, body) = api.delete("/api/v1/stats").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (405, Some("method_not_allowed"))
    );
}
on_backends!(bad_parameters_get_a_400_naming_the_parameter: sqlite, postgres);

async fn outbox_pages_filters_and_retries(backend: Backend) {
    let api = TestApi::start(backend).await;
    let mut rows = Vec::new();
    for i in 0..23 {
        let status = ["pending", "published", "dead"][i % 3];
        let subject = if i % 2 == 0 {
            "ledger.recorded"
        } else {
            "orders.shipped"
        };
        rows.push(outbox_row(
            &format!("m-{i}"),
            subject,
            status,
            Duration::minutes(100 - i as i64),
        ));
    }
    insert_outbox(&api, rows).await;

    // Pagination: every row exactly once, newest first.
    let mut seen = Vec::new();
    let mut after: Option<i64> = None;
    loop {
        let path = match after {
            Some(a) => format!("/api/v1/outbox?limit=5&after={a}"),
            None => "/api/v1/outbox?limit=5".to_owned(),
        };
        let (status, page) = api.get(&path).await;
        assert_eq!(status, 200);
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 5);
        seen.extend(items.iter().map(|r| r["id"].as_i64().unwrap()));
        match page["next_after"].as_i64() {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen.len(), 23);
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 23, "no repeats");
    assert!(
        seen.windows(2).all(|w| w[0] > w[1]),
        "newest first, no gaps in order"
    );

    let count = |body: &serde_json::Value| body["items"].as_array().unwrap().len();
    assert_eq!(
        count(&api.get("/api/v1/outbox?status=pending&limit=100").await.1),
        8
    );
    assert_eq!(
        count(&api.get("/api/v1/outbox?status=published&limit=100").await.1),
        8
    );
    assert_eq!(
        count(&api.get("/api/v1/outbox?status=dead&limit=100").await.1),
        7
    );
    assert_eq!(
        count(
            &api.get("/api/v1/outbox?subject=orders.shipped&limit=100")
                .await
                .1
        ),
        11
    );
    assert_eq!(count(&api.get("/api/v1/outbox?message_id=m-4").await.1), 1);
    // Rows are 100 down to 78 minutes old; the bound sits 30 s away from any
    // row so second-precision formatting cannot move a row across it.
    let from = (chrono::Utc::now() - Duration::minutes(80) + Duration::seconds(30))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert_eq!(
        count(
            &api.get(&format!("/api/v1/outbox?from={from}&limit=100"))
                .await
                .1
        ),
        2
    );

    // Detail.
    let (_, page) = api.get("/api/v1/outbox?message_id=m-2").await;
    let id = page["items"][0]["id"].as_i64().unwrap();
    let (status, detail) = api.get(&format!("/api/v1/outbox/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(detail["payload"], "{\"id\":\"m-2\"}");
    assert_eq!(detail["payload_encoding"], "utf8");
    assert_eq!(detail["headers"]["traceparent"], "00-abc-def-01");
    assert_eq!(detail["status"], "dead");
    assert_eq!(api.get("/api/v1/outbox/999999").await.0, 404);

    // Retry one dead row; a published one is a conflict.
    let (status, row) = api.post(&format!("/api/v1/outbox/{id}/retry"), None).await;
    assert_eq!(status, 200, "{row}");
    assert_eq!(
        (row["status"].as_str(), row["attempts"].as_i64()),
        (Some("pending"), Some(0))
    );
    let (_, published) = api.get("/api/v1/outbox?status=published&limit=1").await;
    let pid = published["items"][0]["id"].as_i64().unwrap();
    assert_eq!(
        api.post(&format!("/api/v1/outbox/{pid}/retry"), None)
            .await
            .0,
        409
    );
    assert_eq!(api.post("/api/v1/outbox/999999/retry", None).await.0, 404);

    // Bulk retry by filter.
    let (status, body) = api
        .post(
            "/api/v1/outbox/retry",
            Some(serde_json::json!({"subject": "orders.shipped"})),
        )
        .await;
    assert_eq!(status, 200);
    let on_orders = body["affected"].as_u64().unwrap();
    let (_, body) = api
        .post("/api/v1/outbox/retry", Some(serde_json::json!({})))
        .await;
    assert_eq!(
        on_orders + body["affected"].as_u64().unwrap(),
        6,
        "the six dead rows left"
    );
    assert_eq!(count(&api.get("/api/v1/outbox?status=dead").await.1), 0);
}
on_backends!(outbox_pages_filters_and_retries: sqlite, postgres);

async fn inbox_states_and_release(backend: Backend) {
    let api = TestApi::start(backend).await;
    let rows = vec![
        marker("p1", "ledger", "processed"),
        marker("p2", "ledger", "processed"),
        marker("c1", "hook", "claimed"),
        marker("e1", "hook", "expired_claim"),
        marker("q1", "hook", "quarantined"),
    ];
    inbox_message::Entity::insert_many(rows)
        .exec_without_returning(&api.t.db)
        .await
        .unwrap();
    let ids = |body: &serde_json::Value| -> Vec<String> {
        body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["message_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        ids(&api.get("/api/v1/inbox?state=processed").await.1),
        ["p2", "p1"]
    );
    assert_eq!(ids(&api.get("/api/v1/inbox?state=claimed").await.1), ["c1"]);
    assert_eq!(
        ids(&api.get("/api/v1/inbox?state=expired_claim").await.1),
        ["e1"]
    );
    assert_eq!(
        ids(&api.get("/api/v1/inbox?state=quarantined").await.1),
        ["q1"]
    );
    assert_eq!(
        ids(&api.get("/api/v1/inbox?consumer=ledger").await.1),
        ["p2", "p1"]
    );
    assert_eq!(ids(&api.get("/api/v1/inbox?message_id=c1").await.1), ["c1"]);
    let (_, page) = api.get("/api/v1/inbox?limit=2").await;
    assert_eq!(ids(&page), ["q1", "e1"]);
    let (_, next) = api
        .get(&format!(
            "/api/v1/inbox?limit=2&after={}",
            page["next_after"]
        ))
        .await;
    assert_eq!(ids(&next), ["c1", "p2"]);

    let (_, stats) = api.get("/api/v1/stats").await;
    assert_eq!(
        stats["inbox"],
        serde_json::json!({"processed": 2, "claimed": 1, "expired_claims": 1, "quarantined": 1})
    );

    let id_of = |body: &serde_json::Value| body["items"][0]["id"].as_i64().unwrap();
    let expired = id_of(&api.get("/api/v1/inbox?message_id=e1").await.1);
    let (status, row) = api
        .post(&format!("/api/v1/inbox/{expired}/release"), None)
        .await;
    assert_eq!(status, 200);
    assert!(row["lease_until"].is_null() && row["claimed_by"].is_null());
    let quarantined = id_of(&api.get("/api/v1/inbox?message_id=q1").await.1);
    let (_, row) = api
        .post(&format!("/api/v1/inbox/{quarantined}/release"), None)
        .await;
    assert_eq!(
        (row["state"].as_str(), row["attempts"].as_i64()),
        (Some("expired_claim"), Some(0))
    );
    let processed = id_of(&api.get("/api/v1/inbox?message_id=p1").await.1);
    assert_eq!(
        api.post(&format!("/api/v1/inbox/{processed}/release"), None)
            .await
            .0,
        409
    );
    assert_eq!(api.post("/api/v1/inbox/999999/release", None).await.0, 404);
    // A claim under a live lease may have its effect running: a release
    // (say from a page a lagging replica showed as expired) would let a
    // redelivery perform it again, so it is refused unless forced.
    let live = id_of(&api.get("/api/v1/inbox?message_id=c1").await.1);
    let (status, body) = api
        .post(&format!("/api/v1/inbox/{live}/release"), None)
        .await;
    assert_eq!(status, 409, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("force=true"), "{message}");
    let (_, row) = api.get("/api/v1/inbox?message_id=c1").await;
    assert!(
        !row["items"][0]["lease_until"].is_null(),
        "the live claim keeps its lease"
    );
    let (status, row) = api
        .post(&format!("/api/v1/inbox/{live}/release?force=true"), None)
        .await;
    assert_eq!(status, 200);
    assert!(row["lease_until"].is_null() && row["claimed_by"].is_null());
}
on_backends!(inbox_states_and_release: sqlite, postgres);

async fn dead_letters_list_show_delete_and_replay_rules(backend: Backend) {
    let api = TestApi::start(backend).await;
    let rows = vec![
        dead("ledger", Some("d1")),
        dead("ledger", Some("d2")),
        dead("hook", None),
    ];
    dead_letter::Entity::insert_many(rows)
        .exec_without_returning(&api.t.db)
        .await
        .unwrap();
    let (_, page) = api.get("/api/v1/dead-letters?consumer=ledger").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let (_, stats) = api.get("/api/v1/stats").await;
    assert_eq!(stats["dead_letters"], 3);
    assert_eq!(
        stats["dead_letters_by_consumer"],
        serde_json::json!([{"consumer": "hook", "count": 1}, {"consumer": "ledger", "count": 2}])
    );

    let (_, all) = api.get("/api/v1/dead-letters").await;
    let no_id = all["items"][0]["id"].as_i64().unwrap();
    let with_id = all["items"][1]["id"].as_i64().unwrap();
    let (status, detail) = api.get(&format!("/api/v1/dead-letters/{with_id}")).await;
    assert_eq!(status, 200);
    assert_eq!(detail["payload"], r#"{"account_id":"a","amount":5}"#);
    // Replay rules that need no broker.
    let (status, body) = api
        .post(&format!("/api/v1/dead-letters/{no_id}/replay"), None)
        .await;
    assert_eq!(
        status, 409,
        "no id: replaying would only dead-letter it again: {body}"
    );
    let (status, body) = api
        .post(&format!("/api/v1/dead-letters/{with_id}/replay"), None)
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("unavailable"))
    );
    assert_eq!(
        api.post("/api/v1/dead-letters/999999/replay", None).await.0,
        404
    );

    assert_eq!(
        api.delete(&format!("/api/v1/dead-letters/{with_id}"))
            .await
            .0,
        204
    );
    assert_eq!(
        api.delete(&format!("/api/v1/dead-letters/{with_id}"))
            .await
            .0,
        404
    );
    assert_eq!(
        api.get(&format!("/api/v1/dead-letters/{with_id}")).await.0,
        404
    );
}
on_backends!(dead_letters_list_show_delete_and_replay_rules: sqlite, postgres);

async fn prune_runs_retention_now(backend: Backend) {
    let api = TestApi::start(backend).await;
    insert_outbox(
        &api,
        vec![
            outbox_row("old-pub", "s", "published", Duration::hours(2)),
            outbox_row("old-dead", "s", "dead", Duration::hours(2)),
            outbox_row("new-pub", "s", "published", Duration::minutes(5)),
        ],
    )
    .await;
    let (status, body) = api.post("/api/v1/prune", None).await;
    assert_eq!(status, 200);
    assert_eq!(body, serde_json::json!({"inbox": 0, "outbox": 1}));
    let (_, stats) = api.get("/api/v1/stats").await;
    assert_eq!(
        stats["outbox"],
        serde_json::json!({"pending": 0, "published": 1, "dead": 1})
    );
}
on_backends!(prune_runs_retention_now: sqlite, postgres);

#[tokio::test]
async fn an_api_without_a_token_refuses_to_listen_beyond_loopback() {
    let loopback: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
    let everywhere: std::net::SocketAddr = "0.0.0.0:8080".parse().unwrap();
    assert!(api::check_exposure(loopback, false).is_ok());
    assert!(api::check_exposure(everywhere, true).is_ok());
    let err = api::check_exposure(everywhere, false).unwrap_err();
    assert!(err.to_string().contains("SEAWALL_ADMIN_TOKEN"));
    let out = std::process::Command::new(crate::support::binary::path("seawall-testbed"))
        .arg("api")
        .env("SEAWALL_API_ADDR", "0.0.0.0:0")
        .env("SEAWALL_DATABASE_URL", "sqlite::memory:")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("SEAWALL_ADMIN_TOKEN"));
}

/// A database that hangs (a lock held on a table the stats read) does not
/// hang `/metrics`: the reading gives up after 5 s, the scrape answers with
/// `seawall_stats_up 0` and without the table gauges, well inside the
/// request timeout (10 s, after which it would be a 408 and no scrape at
/// all).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_answer_with_stats_down_while_a_table_is_locked() {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let api = TestApi::start(Backend::Postgres).await;
    let holder = api.t.db.begin().await.unwrap();
    holder
        .execute_unprepared("LOCK TABLE dead_letter IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let (status, text) = api.metrics().await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\nseawall_stats_up 0\n"), "{text}");
    assert!(!text.contains("\nseawall_outbox_rows{"), "{text}");
    holder.rollback().await.unwrap();
    let (_, text) = api.metrics().await;
    assert!(text.contains("\nseawall_stats_up 1\n"), "{text}");
}
