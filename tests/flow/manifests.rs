//! The shipped Kubernetes manifests (`deploy/k8s/`) as a cluster runs them.
//!
//! Each workload's container gets what the kubelet would give it: the
//! image's `ENV`, its Secrets (`envFrom`), its `env`, and the service-link
//! variables of every Service in the namespace (those of the manifests,
//! plus one named `seawall`, as a fork's own Service may be), which the
//! manifests turn off but a fork may not. The migration Job must finish,
//! then every Deployment must start and answer its startup probe. The
//! addresses and URLs are the test's (a loopback port, the test's database
//! and NATS), the admin token one of the test's (the example's placeholder
//! is refused by design); everything else is the manifests'.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use yaml_serde::Value;

use crate::support::nats::NatsServer;
use crate::support::process::Seawall;
use crate::support::{Backend, TestDb, free_port, http_client, wait_until};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// Every object of every file in `deploy/k8s/`, with its file's name.
fn objects() -> Vec<(String, Value)> {
    let mut files: Vec<_> = std::fs::read_dir(deploy_dir().join("k8s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut objects = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for doc in yaml_serde::Deserializer::from_str(&text) {
            let value = Value::deserialize(doc).unwrap();
            if !value.is_null() {
                objects.push((name.clone(), value));
            }
        }
    }
    objects
}

fn kind(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

/// The pod spec of a Deployment or a Job.
fn pod(object: &Value) -> &Value {
    &object["spec"]["template"]["spec"]
}

/// `KEY=value` pairs of a mapping.
fn pairs(map: &Value) -> Vec<(String, String)> {
    map.as_mapping()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::String(s) => s.clone(),
                        other => yaml_serde::to_string(other).unwrap().trim().to_owned(),
                    };
                    (k.as_str().unwrap().to_owned(), v)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The `ENV` lines of the image (`deploy/container/Containerfile`).
fn image_env() -> Vec<(String, String)> {
    let file = std::fs::read_to_string(deploy_dir().join("container/Containerfile")).unwrap();
    file.lines()
        .filter_map(|l| l.strip_prefix("ENV "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// What the kubelet gives every container for a Service `name` on `ip`
/// with `ports` (name, port).
fn service_links(name: &str, ip: &str, ports: &[(String, u16)]) -> Vec<(String, String)> {
    let n = name.to_uppercase().replace('-', "_");
    let Some((_, first)) = ports.first() else {
        return Vec::new();
    };
    let mut vars = vec![
        (format!("{n}_SERVICE_HOST"), ip.to_owned()),
        (format!("{n}_SERVICE_PORT"), first.to_string()),
        (format!("{n}_PORT"), format!("tcp://{ip}:{first}")),
    ];
    for (port_name, port) in ports {
        let p = port_name.to_uppercase().replace('-', "_");
        vars.extend([
            (format!("{n}_SERVICE_PORT_{p}"), port.to_string()),
            (format!("{n}_PORT_{port}_TCP"), format!("tcp://{ip}:{port}")),
            (format!("{n}_PORT_{port}_TCP_PROTO"), "tcp".to_owned()),
            (format!("{n}_PORT_{port}_TCP_PORT"), port.to_string()),
            (format!("{n}_PORT_{port}_TCP_ADDR"), ip.to_owned()),
        ]);
    }
    vars
}

/// The service links of every Service in the manifests, and of a fork's
/// own Service named `seawall`.
fn every_service_link(objects: &[(String, Value)]) -> Vec<(String, String)> {
    let mut services: Vec<(String, Vec<(String, u16)>)> = objects
        .iter()
        .filter(|(_, o)| kind(o) == "Service")
        .map(|(_, o)| {
            let ports = o["spec"]["ports"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|p| {
                    let port = u16::try_from(p["port"].as_u64().unwrap()).unwrap();
                    (p["name"].as_str().unwrap_or("http").to_owned(), port)
                })
                .collect();
            (name(o).to_owned(), ports)
        })
        .collect();
    assert!(!services.is_empty(), "the manifests define Services");
    services.push(("seawall".to_owned(), vec![("http".to_owned(), 80)]));
    services
        .iter()
        .enumerate()
        .flat_map(|(i, (name, ports))| service_links(name, &format!("10.96.0.{}", i + 10), ports))
        .collect()
}

/// The environment of `workload`'s first container, in the kubelet's
/// order (a later value wins): image, service links, `envFrom`, `env`.
fn environment(
    workload: &Value,
    secrets: &BTreeMap<String, Vec<(String, String)>>,
    links: &[(String, String)],
) -> Vec<(String, String)> {
    let container = &pod(workload)["containers"][0];
    let mut env = image_env();
    env.extend_from_slice(links);
    for source in container["envFrom"].as_sequence().into_iter().flatten() {
        let secret = source["secretRef"]["name"].as_str().unwrap();
        env.extend(secrets.get(secret).cloned().unwrap_or_else(|| {
            panic!(
                "{} reads Secret {secret}, which no manifest defines",
                name(workload)
            )
        }));
    }
    for var in container["env"].as_sequence().into_iter().flatten() {
        env.push((
            var["name"].as_str().unwrap().to_owned(),
            var["value"].as_str().unwrap().to_owned(),
        ));
    }
    env
}

/// `env` with the test's database, NATS, token and a loopback port for
/// every listening address; the port each address now has, by its
/// manifest port.
fn on_this_host(
    env: Vec<(String, String)>,
    t: &TestDb,
    nats: &NatsServer,
) -> (Vec<(&'static str, String)>, BTreeMap<u16, u16>) {
    let mut ports = BTreeMap::new();
    let env = env
        .into_iter()
        .map(|(k, v)| {
            let v = match k.as_str() {
                "SEAWALL_DATABASE_URL" => t.url.clone(),
                "SEAWALL_NATS_URL" => nats.url(),
                "SEAWALL_ADMIN_TOKEN" => "manifest-test-token-0123456789".to_owned(),
                "SEAWALL_API_ADDR" | "SEAWALL_METRICS_ADDR" => {
                    let shipped: std::net::SocketAddr = v.parse().unwrap();
                    let port = *ports.entry(shipped.port()).or_insert_with(free_port);
                    format!("127.0.0.1:{port}")
                }
                _ => v,
            };
            let key: &'static str = Box::leak(k.into_boxed_str());
            (key, v)
        })
        .collect();
    (env, ports)
}

/// The container port a probe of `workload` asks, by the port's name.
fn probe_port(workload: &Value, probe: &str) -> u16 {
    let container = &pod(workload)["containers"][0];
    let port_name = container[probe]["httpGet"]["port"].as_str().unwrap();
    let port = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str() == Some(port_name))
        .unwrap_or_else(|| panic!("{} names no port {port_name}", name(workload)));
    u16::try_from(port["containerPort"].as_u64().unwrap()).unwrap()
}

fn args(workload: &Value) -> Vec<String> {
    pod(workload)["containers"][0]["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_shipped_workloads_start_with_the_environment_kubernetes_gives_them() {
    let objects = objects();
    let secrets: BTreeMap<String, Vec<(String, String)>> = objects
        .iter()
        .filter(|(_, o)| kind(o) == "Secret")
        .map(|(_, o)| (name(o).to_owned(), pairs(&o["stringData"])))
        .collect();
    let links = every_service_link(&objects);
    let t = TestDb::empty(Backend::Postgres).await;
    let nats = NatsServer::start().await;

    let jobs: Vec<&Value> = objects
        .iter()
        .map(|(_, o)| o)
        .filter(|o| kind(o) == "Job")
        .collect();
    assert_eq!(jobs.len(), 1, "one migration Job");
    let (env, _) = on_this_host(environment(jobs[0], &secrets, &links), &t, &nats);
    let job_args = args(jobs[0]);
    let args: Vec<&str> = job_args.iter().map(String::as_str).collect();
    let mut job = Seawall::spawn(&args, &env);
    let status = job.wait().await;
    assert!(
        status.success(),
        "the Job {}: {}",
        name(jobs[0]),
        job.log_text()
    );

    let mut running = Vec::new();
    for workload in objects
        .iter()
        .map(|(_, o)| o)
        .filter(|o| kind(o) == "Deployment")
    {
        let (env, ports) = on_this_host(environment(workload, &secrets, &links), &t, &nats);
        let workload_args = self::args(workload);
        let args: Vec<&str> = workload_args.iter().map(String::as_str).collect();
        let process = Seawall::spawn(&args, &env);
        let port = ports[&probe_port(workload, "startupProbe")];
        let path = pod(workload)["containers"][0]["startupProbe"]["httpGet"]["path"]
            .as_str()
            .unwrap()
            .to_owned();
        running.push((
            name(workload).to_owned(),
            process,
            format!("http://127.0.0.1:{port}{path}"),
        ));
    }
    assert_eq!(running.len(), 3, "api, relay and consume");
    for (workload, process, probe) in &running {
        wait_until(
            &format!("{workload}'s startup probe"),
            Duration::from_secs(60),
            || async {
                assert!(
                    !process.log_text().contains("error:"),
                    "{workload} stopped: {}",
                    process.log_text()
                );
                http_client()
                    .get(probe)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            },
        )
        .await;
    }
    for (_, mut process, _) in running {
        assert!(
            process.terminate().await.success(),
            "{}",
            process.log_text()
        );
        process.assert_no_panic();
    }
}

/// What a first deployment meets: the manifests that roll the service
/// carry no Secret (re-applying them for a new image would reset the real
/// ones), every pod is kept from the Kubernetes API and from service links,
/// every container waits out start-up on a `startupProbe`, and a
/// disruption budget lets a drain evict pods that are unready anyway.
#[test]
fn the_manifests_keep_secrets_apart_and_pods_to_themselves() {
    let objects = objects();
    for (file, object) in &objects {
        match kind(object) {
            "Secret" => assert!(
                file.ends_with(".example.yaml"),
                "Secret {} sits in {file}, beside what each release re-applies",
                name(object)
            ),
            "Deployment" | "Job" => {
                let pod = pod(object);
                for setting in ["enableServiceLinks", "automountServiceAccountToken"] {
                    assert_eq!(
                        pod[setting].as_bool(),
                        Some(false),
                        "{} sets {setting}",
                        name(object)
                    );
                }
                if kind(object) == "Deployment" {
                    assert!(
                        !pod["containers"][0]["startupProbe"].is_null(),
                        "{} has a startupProbe",
                        name(object)
                    );
                    let env = pairs(&Value::Mapping(
                        pod["containers"][0]["env"]
                            .as_sequence()
                            .unwrap()
                            .iter()
                            .map(|v| (v["name"].clone(), v["value"].clone()))
                            .collect(),
                    ));
                    assert!(
                        env.contains(&("SEAWALL_MIGRATIONS".to_owned(), "wait".to_owned())),
                        "{} leaves migrating to the Job",
                        name(object)
                    );
                }
            }
            "PodDisruptionBudget" => assert_eq!(
                object["spec"]["unhealthyPodEvictionPolicy"].as_str(),
                Some("AlwaysAllow"),
                "{}",
                name(object)
            ),
            _ => {}
        }
    }
    assert!(
        objects.iter().any(|(_, o)| kind(o) == "NetworkPolicy"),
        "a NetworkPolicy example ships"
    );
}
