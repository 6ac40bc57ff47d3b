//! Clients and ports for tests that talk to seawall over the network.

/// An HTTP client. seawall's reqwest uses rustls without a built-in crypto
/// provider (the binary installs ring, which the tree already has); tests
/// install the same before their first client.
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// A TCP port nothing listens on right now (for a process's admin API).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
