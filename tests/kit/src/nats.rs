//! A real nats-server with JetStream per test, killed on drop.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct NatsServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    /// A configuration file the server runs with instead of the defaults.
    config: Option<std::path::PathBuf>,
}

fn binary() -> String {
    std::env::var("SEAWALL_TEST_NATS_SERVER").unwrap_or_else(|_| {
        panic!("SEAWALL_TEST_NATS_SERVER is not set: run the suite with `scripts/test`, which installs nats-server")
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl NatsServer {
    pub async fn start() -> Self {
        let mut server = Self {
            child: None,
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            config: None,
        };
        server.spawn().await;
        server
    }

    /// Starts a server with the configuration `make(port, dir)` returns (TLS,
    /// users, permissions); `dir` is the server's own folder, for its store
    /// and files. Ready once it accepts TCP connections (a handshake would
    /// need the credentials the configuration asks for).
    pub async fn start_with_config(make: impl FnOnce(u16, &std::path::Path) -> String) -> Self {
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nats.conf");
        std::fs::write(&path, make(port, dir.path())).unwrap();
        let child = Command::new(binary())
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "nats-server did not start with {}",
                path.display()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Self {
            child: Some(child),
            port,
            dir,
            config: Some(path),
        }
    }

    /// The server's own folder (store, configuration, certificates).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let child = Command::new(binary())
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(client) = async_nats::connect(self.url()).await {
                let js = async_nats::jetstream::new(client);
                if js.query_account().await.is_ok() {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "nats-server did not start"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Stops the server (its JetStream store stays for a restart).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port with the same store.
    pub async fn restart(&mut self) {
        assert!(
            self.config.is_none(),
            "restart runs the default configuration"
        );
        self.stop();
        self.spawn().await;
    }

    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        async_nats::jetstream::new(async_nats::connect(self.url()).await.unwrap())
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
