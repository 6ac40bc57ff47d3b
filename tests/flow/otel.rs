//! One trace from a request to its downstream effect, across processes: a
//! `ledger.record` published with a `traceparent` yields, in that trace, the
//! `consume` span of the ledger consumer (a child of the request), the
//! relay's `outbox.publish` span of `ledger.recorded` in another process (a
//! child of the handler), and the `hook` consumer's span (a child of the
//! publish). The spans are received by an OTLP/HTTP endpoint of the test's
//! own, decoded with `opentelemetry-proto`. The consumer's JSON log lines
//! carry the trace's ids.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};
use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

use crate::helpers::with_ledger_stream;
use crate::support::Backend;
use crate::support::process::Seawall;
use crate::support::wait_until;
use crate::support::webhook::WebhookServer;

/// A span as the receiver saw it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    /// The exporting process's resource attributes.
    resource: Vec<(String, String)>,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: Vec<(String, String)>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// An OTLP/HTTP (protobuf) trace receiver on a free port.
async fn receiver() -> (String, Arc<Mutex<Vec<Received>>>) {
    let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
    let store = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let store = store.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut spans = store.lock().unwrap();
                for resource in request.resource_spans {
                    let attributes: Vec<(String, String)> = resource
                        .resource
                        .iter()
                        .flat_map(|r| r.attributes.iter())
                        .map(|a| {
                            (
                                a.key.clone(),
                                text(a.value.as_ref().and_then(|v| v.value.as_ref())),
                            )
                        })
                        .collect();
                    let service = attributes
                        .iter()
                        .find(|(k, _)| k == "service.name")
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default();
                    for scope in resource.scope_spans {
                        for span in scope.spans {
                            spans.push(Received {
                                service: service.clone(),
                                resource: attributes.clone(),
                                name: span.name,
                                trace_id: hex(&span.trace_id),
                                span_id: hex(&span.span_id),
                                parent_span_id: hex(&span.parent_span_id),
                                attributes: span
                                    .attributes
                                    .iter()
                                    .map(|a| {
                                        (
                                            a.key.clone(),
                                            text(a.value.as_ref().and_then(|v| v.value.as_ref())),
                                        )
                                    })
                                    .collect(),
                            });
                        }
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, spans)
}

fn attribute<'a>(span: &'a Received, key: &str) -> Option<&'a str> {
    span.attributes
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_trace_runs_from_a_request_through_the_outbox_to_the_next_consumer() {
    let (t, nats, js) = with_ledger_stream(Backend::Sqlite).await;
    let hook = WebhookServer::start(Duration::ZERO, 200).await;
    let (endpoint, spans) = receiver().await;
    let process = |role: &str, log_format: &str| {
        Seawall::spawn(
            &[role],
            &[
                ("SEAWALL_LOG_FORMAT", log_format.to_owned()),
                ("SEAWALL_LOG", "info,worker=debug".to_owned()),
                ("SEAWALL_DATABASE_URL", t.url.clone()),
                ("SEAWALL_NATS_URL", nats.url()),
                ("SEAWALL_RELAY_POLL_MS", "100".to_owned()),
                ("TESTBED_WEBHOOK_URL", hook.url.clone()),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_owned()),
                ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
                ("OTEL_SERVICE_NAME", role.to_owned()),
            ],
        )
    };
    let mut consume = process("consume", "json");
    let mut relay = process("relay", "text");
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let js = jetstream::Context::clone(&js);
    let msg = PublishMessage::build()
        .payload(br#"{"account_id":"a","amount":5}"#.to_vec().into())
        .message_id("traced-otel-1")
        .header("traceparent", format!("00-{trace}-{parent}-01").as_str());
    js.send_publish("ledger.record", msg)
        .await
        .unwrap()
        .await
        .unwrap();

    let in_trace = || -> Vec<Received> {
        spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id == trace)
            .cloned()
            .collect()
    };
    // Each process exports on its own schedule: wait for both ends.
    let complete = |spans: &[Received]| {
        let hook = spans
            .iter()
            .any(|s| s.name == "consume" && attribute(s, "consumer") == Some("hook"));
        let published = spans
            .iter()
            .any(|s| s.service == "relay" && s.name == "outbox.publish");
        hook && published
    };
    wait_until(
        "the relay's and the hook's spans",
        Duration::from_secs(60),
        || {
            let spans = in_trace();
            async move { complete(&spans) }
        },
    )
    .await;
    let spans = in_trace();
    let find = |service: &str, name: &str, consumer: Option<&str>| {
        spans
            .iter()
            .find(|s| {
                s.service == service
                    && s.name == name
                    && consumer.is_none_or(|c| attribute(s, "consumer") == Some(c))
            })
            .unwrap_or_else(|| panic!("no {name} span of {service} in {spans:#?}"))
    };
    let first = find("consume", "consume", Some("ledger"));
    assert_eq!(first.parent_span_id, parent, "the request is its parent");
    let publish = find("relay", "outbox.publish", None);
    assert_eq!(attribute(publish, "subject"), Some("ledger.recorded"));
    let handler = spans
        .iter()
        .find(|s| s.span_id == publish.parent_span_id)
        .unwrap_or_else(|| panic!("the publish span's parent is in the trace: {spans:#?}"));
    assert_eq!(
        handler.service, "consume",
        "written by the consumer's handler"
    );
    let second = find("consume", "consume", Some("hook"));
    assert_eq!(
        second.parent_span_id, publish.span_id,
        "the next consumer continues from the publish"
    );
    // Each process's resource names it: its own instance id, its pid, its
    // host and its role.
    let resource = |span: &Received, key: &str| {
        span.resource
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {key} in {:?}", span.resource))
    };
    assert_eq!(resource(first, "seawall.role"), "consume");
    assert_eq!(resource(publish, "seawall.role"), "relay");
    // Integers come through `text` as the protobuf value's debug form.
    assert_eq!(
        resource(first, "process.pid"),
        format!("IntValue({})", consume.pid())
    );
    assert_eq!(
        resource(publish, "process.pid"),
        format!("IntValue({})", relay.pid())
    );
    assert_ne!(
        resource(first, "service.instance.id"),
        resource(publish, "service.instance.id")
    );
    assert!(!resource(first, "host.name").is_empty());
    // SEAWALL_LOG_FORMAT=json: one JSON object per line, those inside the
    // trace carrying its ids.
    let log = consume.log_text();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["trace_id"] == trace && l["span_id"].as_str().is_some_and(|s| s.len() == 16)),
        "a log line inside the trace carries trace_id and span_id:\n{log}"
    );
    consume.assert_no_panic();
    relay.assert_no_panic();
    consume.terminate().await;
    relay.terminate().await;
}

/// A relay exports a span per published event and nothing while idle
/// (no span per polling round); `OTEL_RESOURCE_ATTRIBUTES` names the
/// service when `OTEL_SERVICE_NAME` does not; `OTEL_SDK_DISABLED` and
/// `OTEL_TRACES_EXPORTER=none` turn exporting off though an endpoint is
/// set.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_rounds_export_nothing_and_the_standard_variables_are_honoured() {
    let (t, nats, js) = with_ledger_stream(Backend::Sqlite).await;
    let (endpoint, spans) = receiver().await;
    let process = |role: &str, extra: (&'static str, &str)| {
        Seawall::spawn(
            &[role],
            &[
                ("SEAWALL_DATABASE_URL", t.url.clone()),
                ("SEAWALL_NATS_URL", nats.url()),
                // Many idle rounds while the test runs.
                ("SEAWALL_RELAY_POLL_MS", "50".to_owned()),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
                ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
                (extra.0, extra.1.to_owned()),
            ],
        )
    };
    let mut relay = process(
        "relay",
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "service.name=orders-relay,deployment.environment=test",
        ),
    );
    let mut disabled = process("consume", ("OTEL_SDK_DISABLED", "true"));
    let mut none = process("consume", ("OTEL_TRACES_EXPORTER", "none"));
    let ids: Vec<(String, _)> = (0..4)
        .map(|i| (format!("otel-quiet-{i}"), crate::helpers::req("acct", 1)))
        .collect();
    crate::helpers::publish_entries(&js, &ids).await;
    wait_until("handled and relayed", Duration::from_secs(60), || async {
        testkit::ledger::balance_of(&t.db, "acct").await.unwrap() == Some(4)
            && worker::relay::pending_count(&t.db).await.unwrap() == 0
    })
    .await;
    // Stopping flushes what each process had not exported yet.
    for p in [&mut relay, &mut disabled, &mut none] {
        p.terminate().await;
    }
    let received = spans.lock().unwrap().clone();
    let names: std::collections::BTreeSet<(&str, &str)> = received
        .iter()
        .map(|s| (s.service.as_str(), s.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [("orders-relay", "outbox.publish")].into_iter().collect(),
        "only the relay's publishes, under the service OTEL_RESOURCE_ATTRIBUTES names: {received:#?}"
    );
    assert_eq!(received.len(), 4, "one span per published event");
}

/// A protocol this build cannot speak stops start-up naming the variable,
/// rather than exporting nothing.
#[test]
fn an_unsupported_otlp_protocol_stops_startup_naming_the_variable() {
    for (key, value) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
        ("OTEL_TRACES_EXPORTER", "zipkin"),
    ] {
        let out = crate::support::testbed_output(
            &["migrate"],
            &[
                ("SEAWALL_DATABASE_URL", "sqlite::memory:"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                (key, value),
            ],
        );
        crate::support::fails_naming(&out, key);
    }
}
