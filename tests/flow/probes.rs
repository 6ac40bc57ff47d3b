//! `relay` and `consume` processes, which have no admin API, serve
//! `/healthz`, `/readyz` and `/metrics` on `SEAWALL_METRICS_ADDR`: what they
//! record can be scraped, and a consumer paused for a database outage is up
//! but not ready.

use std::time::Duration;

use sea_orm::EntityTrait;

use crate::helpers::{env, publish_entries, req, with_ledger_stream};
use crate::support::process::Seawall;
use crate::support::proxy::{Proxy, upstream_of};
use crate::support::{Backend, free_port, http_client, wait_until};

/// GET `url`: the status and body, or `None` while nothing answers.
pub(crate) async fn get(url: &str) -> Option<(u16, String)> {
    let res = http_client().get(url).send().await.ok()?;
    let status = res.status().as_u16();
    Some((status, res.text().await.ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consume_process_serves_probes_and_is_not_ready_while_paused_for_an_outage() {
    probes_of_a_consuming_process("consume", "SEAWALL_METRICS_ADDR").await;
}

/// `seawall run` answers its probes on the API listener, and its consumers'
/// readiness is part of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_process_is_not_ready_while_its_consumer_is_paused() {
    probes_of_a_consuming_process("run", "SEAWALL_API_ADDR").await;
}

async fn probes_of_a_consuming_process(role: &str, listen_key: &str) {
    let (t, nats, js) = with_ledger_stream(Backend::Postgres).await;
    let upstream = upstream_of(&t.url);
    let proxy = Proxy::start(upstream).await;
    let base = format!("http://127.0.0.1:{}", free_port());
    let consume = Seawall::spawn(
        &[role],
        &env(
            &proxy.url_for(&t.url, upstream),
            &nats.url(),
            &[(listen_key, base.trim_start_matches("http://"))],
        ),
    );
    wait_until("ready", Duration::from_secs(60), || async {
        get(&format!("{base}/readyz")).await.map(|r| r.0) == Some(200)
    })
    .await;
    assert_eq!(get(&format!("{base}/healthz")).await.unwrap().0, 200);
    publish_entries(&js, &[("probe-1".to_owned(), req("acct", 1))]).await;
    wait_until(
        "the delivery counted in /metrics",
        Duration::from_secs(30),
        || async {
            get(&format!("{base}/metrics"))
                .await
                .is_some_and(|(_, text)| {
                    text.contains("seawall_consumer_messages_total") && text.contains("processed")
                })
        },
    )
    .await;
    if role == "consume" {
        let (status, _) = get(&format!("{base}/api/v1/stats")).await.unwrap();
        assert_eq!(status, 404, "the probes listener serves no admin routes");
    }

    proxy.cut();
    publish_entries(&js, &[("probe-2".to_owned(), req("acct", 1))]).await;
    wait_until(
        "not ready while paused",
        Duration::from_secs(30),
        || async {
            get(&format!("{base}/readyz"))
                .await
                .is_some_and(|(status, body)| status == 503 && body.contains("paused"))
        },
    )
    .await;
    assert_eq!(
        get(&format!("{base}/healthz")).await.unwrap().0,
        200,
        "alive all the same"
    );
    proxy.restore();
    wait_until("ready again", Duration::from_secs(60), || async {
        get(&format!("{base}/readyz")).await.map(|r| r.0) == Some(200)
    })
    .await;
    consume.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_process_serves_its_metrics_and_its_lag_counts_from_a_retry() {
    let (t, nats, _js) = with_ledger_stream(Backend::Sqlite).await;
    let base = format!("http://127.0.0.1:{}", free_port());
    let relay = Seawall::spawn(
        &["relay"],
        &env(
            &t.url,
            &nats.url(),
            &[("SEAWALL_METRICS_ADDR", base.trim_start_matches("http://"))],
        ),
    );
    wait_until(
        "the relay's heartbeat in /metrics",
        Duration::from_secs(60),
        || async {
            get(&format!("{base}/metrics"))
                .await
                .is_some_and(|(_, text)| text.contains("seawall_relay_heartbeat_timestamp_seconds"))
        },
    )
    .await;
    assert_eq!(get(&format!("{base}/readyz")).await.unwrap().0, 200);

    // An event that died three days ago, retried by an operator now: the
    // relay's lag counts from the retry, so neither the histogram nor the
    // stats read days.
    let mut old = crate::support::rows::event(
        "lag-old-dead".into(),
        chrono::Utc::now() - chrono::Duration::days(3),
    );
    old.dead_at = sea_orm::Set(Some(chrono::Utc::now() - chrono::Duration::days(3)));
    old.attempts = sea_orm::Set(10);
    entity::outbox_message::Entity::insert(old)
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    let retried = service::outbox::Outbox::retry(
        &t.db,
        &service::admin::OutboxFilter {
            message_id: Some("lag-old-dead".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(retried, 1);
    wait_until(
        "the retried row published",
        Duration::from_secs(30),
        || async { worker::relay::pending_count(&t.db).await.unwrap() == 0 },
    )
    .await;
    let sample = |text: &str, name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    };
    wait_until("the lag recorded", Duration::from_secs(30), || async {
        let text = get(&format!("{base}/metrics")).await.unwrap_or_default().1;
        sample(&text, "seawall_relay_lag_seconds_count") == Some(1.0)
    })
    .await;
    let text = get(&format!("{base}/metrics")).await.unwrap().1;
    let lag = sample(&text, "seawall_relay_lag_seconds_sum").unwrap();
    assert!(lag < 60.0, "relay lag of a retried row: {lag} s");
    let stats = service::stats::stats(&t.db, chrono::Utc::now(), None)
        .await
        .unwrap();
    let mean_ms = stats.relay_lag_ms.unwrap();
    assert!(mean_ms < 60_000.0, "stats relay lag: {mean_ms} ms");
    relay.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_taken_metrics_port_stops_startup_naming_the_key() {
    let (t, nats, _js) = with_ledger_stream(Backend::Sqlite).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut relay = Seawall::spawn(
        &["relay"],
        &env(&t.url, &nats.url(), &[("SEAWALL_METRICS_ADDR", &addr)]),
    );
    let status = tokio::time::timeout(Duration::from_secs(60), relay.wait())
        .await
        .expect("the process exits");
    assert!(!status.success());
    assert!(
        relay.log_text().contains("metrics_addr"),
        "{}",
        relay.log_text()
    );
}

/// A `consume` process started while JetStream cannot answer (here a NATS
/// server without JetStream; in production a node stopped or a stream
/// leader being elected) waits for it instead of exiting, and is ready once
/// JetStream answers on the same address.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_started_while_jetstream_cannot_answer_waits_for_it() {
    let t = crate::support::TestDb::new(Backend::Sqlite).await;
    let port = free_port();
    let store = tempfile::tempdir().unwrap();
    let nats = |jetstream: bool| {
        let mut cmd =
            std::process::Command::new(crate::support::server_url("SEAWALL_TEST_NATS_SERVER"));
        cmd.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
        if jetstream {
            cmd.arg("-js").arg("-sd").arg(store.path());
        }
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut plain = nats(false);
    wait_until("nats-server listening", Duration::from_secs(20), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    let base = format!("http://127.0.0.1:{}", free_port());
    let consume = Seawall::spawn(
        &["consume"],
        &env(
            &t.url,
            &format!("nats://127.0.0.1:{port}"),
            &[("SEAWALL_METRICS_ADDR", base.trim_start_matches("http://"))],
        ),
    );
    wait_until(
        "the wait for JetStream logged",
        Duration::from_secs(30),
        || async { consume.log_text().contains("JetStream cannot answer yet") },
    )
    .await;
    let _ = plain.kill();
    let _ = plain.wait();
    let mut with_jetstream = nats(true);
    wait_until(
        "ready once JetStream answers",
        Duration::from_secs(60),
        || async { get(&format!("{base}/readyz")).await.map(|r| r.0) == Some(200) },
    )
    .await;
    consume.assert_no_panic();
    drop(consume);
    let _ = with_jetstream.kill();
    let _ = with_jetstream.wait();
}
