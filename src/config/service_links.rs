//! Kubernetes service links: the variables the kubelet gives every
//! container for every Service in its namespace (unless the pod sets
//! `enableServiceLinks: false`). A Service named `seawall-api` gives
//! `SEAWALL_API_SERVICE_HOST=10.0.0.7`, `SEAWALL_API_PORT=tcp://10.0.0.7:8080`
//! and so on; one named `seawall` gives `SEAWALL_PORT`. They share the
//! settings' prefix by accident, so the check of unknown `SEAWALL_*`
//! variables must know them by name *and* value: a misspelt setting is
//! still refused, since its value does not look like the kubelet's.

use std::net::{IpAddr, SocketAddr};

/// Whether `name=value` is a variable the kubelet injects for a Service
/// (any Service name), in one of its shapes:
///
/// | name | value |
/// |---|---|
/// | `<N>_SERVICE_HOST` | an IP address |
/// | `<N>_SERVICE_PORT`, `<N>_SERVICE_PORT_<PORTNAME>` | a port |
/// | `<N>_PORT`, `<N>_PORT_<P>_<PROTO>` | `<proto>://<ip>:<port>` |
/// | `<N>_PORT_<P>_<PROTO>_PROTO` | `tcp`, `udp` or `sctp` |
/// | `<N>_PORT_<P>_<PROTO>_PORT` | the port `P` |
/// | `<N>_PORT_<P>_<PROTO>_ADDR` | an IP address |
///
/// The name is compared upper-cased, as the environment provider matches.
pub(super) fn is_service_link(name: &str, value: &str) -> bool {
    let name = name.to_uppercase();
    let parts: Vec<&str> = name.split('_').collect();
    let Some(last) = parts.len().checked_sub(1) else {
        return false;
    };
    // The Service's own part of the name comes first and is never empty.
    let named = |at: usize| at >= 1 && parts[..at].iter().all(|p| !p.is_empty());
    let tail: Vec<&str> = parts[1..].to_vec();
    match tail.as_slice() {
        [.., "SERVICE", "HOST"] => named(last - 1) && is_ip(value),
        [.., "SERVICE", "PORT"] => named(last - 1) && is_port(value),
        [.., "PORT"] if is_url(value) => named(last),
        _ => {
            port_link(&parts, value, named)
                || service_port_name(&parts).is_some_and(|at| named(at) && is_port(value))
        }
    }
}

/// `<N>_PORT_<P>_<PROTO>` and its `_PROTO`, `_PORT`, `_ADDR` children.
fn port_link(parts: &[&str], value: &str, named: impl Fn(usize) -> bool) -> bool {
    (1..parts.len()).any(|at| {
        let rest = &parts[at..];
        let (port, proto, child) = match rest {
            ["PORT", port, proto] => (*port, *proto, None),
            ["PORT", port, proto, child] => (*port, *proto, Some(*child)),
            _ => return false,
        };
        if !named(at) || port.parse::<u16>().is_err() || !is_proto(proto) {
            return false;
        }
        match child {
            None => {
                is_url(value)
                    && value.starts_with(&format!("{}://", proto.to_lowercase()))
                    && value.ends_with(&format!(":{port}"))
            }
            Some("PROTO") => value == proto.to_lowercase(),
            Some("PORT") => value == port,
            Some("ADDR") => is_ip(value),
            Some(_) => false,
        }
    })
}

/// Where `<N>_SERVICE_PORT_<PORTNAME>` puts its `SERVICE`, if the name has
/// that shape (a port's name is a DNS label: letters, digits and dashes).
fn service_port_name(parts: &[&str]) -> Option<usize> {
    (1..parts.len().saturating_sub(2)).find(|&at| {
        parts[at] == "SERVICE"
            && parts[at + 1] == "PORT"
            && parts[at + 2..]
                .iter()
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric()))
    })
}

fn is_proto(proto: &str) -> bool {
    matches!(proto, "TCP" | "UDP" | "SCTP")
}

fn is_ip(value: &str) -> bool {
    value.parse::<IpAddr>().is_ok()
}

fn is_port(value: &str) -> bool {
    value.parse::<u16>().is_ok()
}

/// `tcp://10.0.0.7:8080` (or `udp://`, `sctp://`; `[fd00::7]:8080` for IPv6).
fn is_url(value: &str) -> bool {
    ["tcp://", "udp://", "sctp://"].iter().any(|scheme| {
        value
            .strip_prefix(scheme)
            .is_some_and(|addr| addr.parse::<SocketAddr>().is_ok())
    })
}

#[cfg(test)]
mod tests {
    use super::is_service_link;

    /// What the kubelet gives a pod for a Service `name` on `ip` with one
    /// TCP port `port` named `port_name`.
    fn links(name: &str, ip: &str, port: u16, port_name: &str) -> Vec<(String, String)> {
        let n = name.to_uppercase().replace('-', "_");
        let p = port_name.to_uppercase().replace('-', "_");
        vec![
            (format!("{n}_SERVICE_HOST"), ip.to_owned()),
            (format!("{n}_SERVICE_PORT"), port.to_string()),
            (format!("{n}_SERVICE_PORT_{p}"), port.to_string()),
            (format!("{n}_PORT"), format!("tcp://{ip}:{port}")),
            (format!("{n}_PORT_{port}_TCP"), format!("tcp://{ip}:{port}")),
            (format!("{n}_PORT_{port}_TCP_PROTO"), "tcp".to_owned()),
            (format!("{n}_PORT_{port}_TCP_PORT"), port.to_string()),
            (format!("{n}_PORT_{port}_TCP_ADDR"), ip.to_owned()),
        ]
    }

    #[test]
    fn every_variable_the_kubelet_gives_is_a_service_link() {
        for (name, ip, port, port_name) in [
            ("seawall-api", "10.96.12.7", 8080, "http"),
            ("seawall", "10.96.0.1", 80, "web-ui"),
            ("seawall-metrics", "fd00::12", 9464, "metrics"),
            ("seawall-2", "10.0.0.2", 4222, "nats2"),
        ] {
            for (var, value) in links(name, ip, port, port_name) {
                let value = if ip.contains(':') && value.starts_with("tcp://") {
                    format!("tcp://[{ip}]:{port}")
                } else {
                    value
                };
                assert!(is_service_link(&var, &value), "{var}={value}");
            }
        }
    }

    #[test]
    fn a_misspelt_setting_is_not_a_service_link() {
        for (var, value) in [
            ("SEAWALL_DATABSE_URL", "postgres://db/seawall"),
            ("SEAWALL_API_PORT", "8080"),
            ("SEAWALL_PORT", "8080"),
            ("SEAWALL_METRICS_PORT", "0.0.0.0:9464"),
            ("SEAWALL_SERVICE_HOST", "db.example.com"),
            ("SEAWALL_API_SERVICE_PORT", "http"),
            ("SEAWALL_PORT_8080_TCP", "tcp://10.0.0.1:9090"),
            ("SEAWALL_PORT_8080_TCP_PROTO", "udp"),
            ("SEAWALL_PORT_8080_TCP_PORT", "80"),
            ("SEAWALL_PORT_8080_HTTP", "tcp://10.0.0.1:8080"),
            ("SEAWALL_PORT_8080_TCP_HOST", "10.0.0.1"),
            ("SEAWALL_INBOX_BATCH", "16"),
            ("SERVICE_HOST", "10.0.0.1"),
            ("_PORT", "tcp://10.0.0.1:80"),
        ] {
            assert!(!is_service_link(var, value), "{var}={value}");
        }
    }
}
