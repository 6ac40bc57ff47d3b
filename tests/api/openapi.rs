//! The OpenAPI document matches the router: every documented operation is
//! served, and every route is registered through the documented router.

use crate::harness::TestApi;
use crate::support::Backend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_lists_every_route_the_router_serves() {
    let api = TestApi::start(Backend::Sqlite).await;
    let (status, doc) = api.get("/api/v1/openapi.json").await;
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut operations = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "post", "delete", "put", "patch"] {
            if item.get(method).is_some() {
                operations.push((method.to_uppercase(), path.clone()));
            }
        }
    }
    operations.sort();
    let expected: Vec<(String, String)> = [
        ("DELETE", "/api/v1/dead-letters/{id}"),
        ("GET", "/"),
        ("GET", "/api/v1/correlations/{correlation_id}"),
        ("GET", "/api/v1/dead-letters"),
        ("GET", "/api/v1/dead-letters/{id}"),
        ("GET", "/api/v1/inbox"),
        ("GET", "/api/v1/messages/{message_id}"),
        ("GET", "/api/v1/openapi.json"),
        ("GET", "/api/v1/outbox"),
        ("GET", "/api/v1/outbox/{id}"),
        ("GET", "/api/v1/stats"),
        ("GET", "/healthz"),
        ("GET", "/metrics"),
        ("GET", "/readyz"),
        ("POST", "/api/v1/dead-letters/{id}/replay"),
        ("POST", "/api/v1/inbox/{id}/release"),
        ("POST", "/api/v1/outbox/retry"),
        ("POST", "/api/v1/outbox/{id}/retry"),
        ("POST", "/api/v1/prune"),
    ]
    .iter()
    .map(|(m, p)| (m.to_string(), p.to_string()))
    .collect();
    assert_eq!(operations, expected);
    // Each documented operation reaches a handler: never the router's own
    // "no such route" 404 or a 405.
    for (method, path) in &operations {
        let url = format!("{}{}", api.base, path.replace("{id}", "1"));
        let req = api
            .http
            .request(method.parse().unwrap(), url)
            .bearer_auth(crate::harness::TOKEN);
        let req = if method == "POST" {
            req.json(&serde_json::json!({}))
        } else {
            req
        };
        let res = req.send().await.unwrap();
        let status = res.status().as_u16();
        let body = res.text().await.unwrap();
        assert_ne!(status, 405, "{method} {path}");
        assert!(
            !body.contains("no such route"),
            "{method} {path} is documented but not served"
        );
    }
}

/// Routes are only ever added through `routes!`, which registers the handler
/// and its OpenAPI entry together; a raw `.route(` would serve an
/// undocumented path.
#[test]
fn no_route_bypasses_the_documented_router() {
    let source = include_str!("../../api/src/lib.rs");
    assert!(
        !source.contains(".route("),
        "api/src/lib.rs registers a route outside routes!()"
    );
    assert!(
        !source.contains(".nest("),
        "api/src/lib.rs nests a router outside the documented one"
    );
}
