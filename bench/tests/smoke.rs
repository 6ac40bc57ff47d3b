//! Every `seawall-bench` scenario in its seconds-long smoke mode, so the
//! benchmark code cannot rot. The figures are not judged here, only their
//! shape: every one a JSON number.

use testkit::binary;
use testkit::nats::NatsServer;

async fn smoke(scenario: &str, nats: &NatsServer) {
    let pg = std::env::var("SEAWALL_TEST_PG_URL")
        .expect("SEAWALL_TEST_PG_URL: run the suite with scripts/test");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_seawall-bench"))
        .args([scenario, "--smoke", "--json"])
        .env("SEAWALL_BENCH_PG_URL", pg)
        .env("SEAWALL_BENCH_NATS_URL", nats.url())
        // The platform's relay on the kit's domain: a fork's `seawall` may
        // require settings of its own.
        .env("SEAWALL_BIN", binary::path("seawall-testbed"))
        .output()
        .await
        .expect("seawall-bench starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "seawall-bench {scenario} --smoke failed:\n{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["scenario"], scenario);
    assert!(report["cores"].as_u64().is_some_and(|c| c >= 1), "{report}");
    let rows = report["rows"].as_array().expect("rows");
    assert!(!rows.is_empty(), "{report}");
    for row in rows {
        let figures = row["figures"].as_object().expect("figures are an object");
        assert!(!figures.is_empty(), "a row without figures: {row}");
        for (key, value) in figures {
            assert!(value.is_number(), "{key} is not a number: {row}");
        }
    }
}

macro_rules! smoke_tests {
    ($($name:ident => $scenario:literal),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let nats = NatsServer::start().await;
                smoke($scenario, &nats).await;
            }
        )+
    };
}

smoke_tests! {
    the_inbox_benchmark_runs => "inbox",
    the_relay_benchmark_runs => "relay",
    the_relay_memory_benchmark_runs => "relay-memory",
    the_latency_benchmark_runs => "latency",
    the_e2e_benchmark_runs => "e2e",
    the_api_benchmark_runs => "api",
}
