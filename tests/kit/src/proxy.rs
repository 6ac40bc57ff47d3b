//! A TCP proxy between seawall and its database, to cut the connection on
//! purpose: all of it (an outage), once the server has answered a
//! forwarded `COMMIT`, swallowing the answer (a commit whose outcome the
//! client never learns), or instead of forwarding a `COMMIT` (a commit
//! that never happened, and the client never learns that either). It also
//! counts what clients send (any TCP protocol: NATS too).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug)]
struct State {
    /// `false` while the proxy plays an outage: connections are refused and
    /// the open ones cut.
    up: watch::Sender<bool>,
    /// Cut the connection after forwarding the next `COMMIT`.
    drop_next_commit: AtomicBool,
    /// Cut the connection instead of forwarding the next `COMMIT`.
    refuse_next_commit: AtomicBool,
    /// How many `COMMIT`s were cut.
    commits_dropped: AtomicUsize,
    /// Bytes whose next sending is held back until [`Proxy::release`].
    hold: std::sync::Mutex<Option<&'static [u8]>>,
    /// Whether a held statement waits; `false` again lets it through.
    held: watch::Sender<bool>,
    /// While set, what is not forwarded on replication connections, which
    /// stay open: a peer gone silent, not one that hung up.
    frozen: watch::Sender<Frozen>,
    /// Bytes whose occurrences in what clients send are counted, and the
    /// count.
    counted: std::sync::Mutex<Option<(&'static [u8], usize)>>,
}

/// What a replication connection does not forward, while set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frozen {
    Nothing,
    FromServer,
    BothWays,
}

/// Forwards `127.0.0.1:<port>` to `upstream`; stops on drop.
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            up: watch::channel(true).0,
            drop_next_commit: AtomicBool::new(false),
            refuse_next_commit: AtomicBool::new(false),
            commits_dropped: AtomicUsize::new(0),
            hold: std::sync::Mutex::new(None),
            held: watch::channel(false).0,
            frozen: watch::channel(Frozen::Nothing).0,
            counted: std::sync::Mutex::new(None),
        });
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if !*shared.up.borrow() {
                    drop(client);
                    continue;
                }
                tokio::spawn(pump(client, upstream, shared.clone()));
            }
        });
        Self { addr, state, task }
    }

    /// `url` (a PostgreSQL URL) pointed at the proxy instead of its server.
    pub fn url_for(&self, url: &str, upstream: SocketAddr) -> String {
        url.replace(&upstream.to_string(), &self.addr.to_string())
    }

    /// Cuts every connection and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.state.up.send_replace(false);
    }

    pub fn restore(&self) {
        self.state.up.send_replace(true);
    }

    /// Cuts the connection that sends the next `COMMIT` once the server has
    /// answered it: the server commits, the client never hears.
    pub fn drop_next_commit(&self) {
        self.state.drop_next_commit.store(true, Ordering::SeqCst);
    }

    /// Cuts the connection that sends the next `COMMIT` instead of
    /// forwarding it: the server rolls the transaction back, the client
    /// never hears.
    pub fn refuse_next_commit(&self) {
        self.state.refuse_next_commit.store(true, Ordering::SeqCst);
    }

    /// Holds back the next client message holding `statement` (for
    /// example `START_REPLICATION`) until [`Proxy::release`]: the test
    /// changes the server between a client's steps, with no race to win.
    pub fn hold_next(&self, statement: &'static [u8]) {
        *self.state.hold.lock().unwrap() = Some(statement);
    }

    /// Waits until a statement armed by [`Proxy::hold_next`] is held.
    pub async fn until_held(&self) {
        let mut held = self.state.held.subscribe();
        let _ = held.wait_for(|held| *held).await;
    }

    /// Lets the held statement through.
    pub fn release(&self) {
        self.state.held.send_replace(false);
    }

    /// Forwards nothing on replication connections (those whose startup
    /// asks for `replication`), either way, until [`Proxy::thaw`], and keeps
    /// them open: to the client, the server has gone silent. Other
    /// connections go on.
    pub fn freeze_replication(&self) {
        self.state.frozen.send_replace(Frozen::BothWays);
    }

    /// Forwards nothing from the server on replication connections until
    /// [`Proxy::thaw`], while the client's messages still reach it: a
    /// server that is there and hears the client but has nothing to send.
    pub fn quiet_replication(&self) {
        self.state.frozen.send_replace(Frozen::FromServer);
    }

    pub fn thaw(&self) {
        self.state.frozen.send_replace(Frozen::Nothing);
    }

    /// Counts from now on the occurrences of `pattern` in what clients
    /// send to the server (see [`Proxy::sent`]).
    pub fn count_sent(&self, pattern: &'static [u8]) {
        *self.state.counted.lock().unwrap() = Some((pattern, 0));
    }

    /// How often the pattern [`Proxy::count_sent`] names was forwarded to
    /// the server since (within one read of a connection, or across two).
    pub fn sent(&self) -> usize {
        self.state.counted.lock().unwrap().map_or(0, |(_, n)| n)
    }

    /// How many `COMMIT`s were cut, before or after the server had them.
    pub fn commits_dropped(&self) -> usize {
        self.state.commits_dropped.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The host:port of a `postgres://user@host:port/db` URL.
pub fn upstream_of(url: &str) -> SocketAddr {
    let rest = url.split_once("://").unwrap().1;
    let host_port = rest.split_once('@').map_or(rest, |(_, r)| r);
    let host_port = host_port.split(['/', '?']).next().unwrap();
    host_port.parse().unwrap()
}

async fn pump(client: TcpStream, upstream: SocketAddr, state: Arc<State>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let mut up = state.up.subscribe();
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Set when a COMMIT is forwarded to be cut: the server's answer to it is
    // swallowed and the connection closed, so the server has committed and
    // the client never hears.
    let cut = AtomicBool::new(false);
    // Set once the client's startup asks for a replication connection.
    let replication = AtomicBool::new(false);
    // Waits while the direction is frozen (`from_server` or not).
    let (shared, replication) = (&state, &replication);
    let thawed = move |from_server: bool| async move {
        let mut frozen = shared.frozen.subscribe();
        let _ = frozen
            .wait_for(|frozen| {
                let stopped = match frozen {
                    Frozen::Nothing => false,
                    Frozen::FromServer => from_server,
                    Frozen::BothWays => true,
                };
                !stopped || !replication.load(Ordering::SeqCst)
            })
            .await;
    };
    let to_server = async {
        let mut buf = vec![0u8; 64 * 1024];
        // The end of the last read, for a pattern split between two.
        let mut tail = Vec::new();
        loop {
            thawed(false).await;
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if contains(&buf[..n], b"replication\0database\0") {
                replication.store(true, Ordering::SeqCst);
            }
            if is_commit(&buf[..n]) && state.refuse_next_commit.swap(false, Ordering::SeqCst) {
                state.commits_dropped.fetch_add(1, Ordering::SeqCst);
                return;
            }
            count_sent(&state, &mut tail, &buf[..n]);
            hold_if_armed(&state, &buf[..n]).await;
            if is_commit(&buf[..n]) && state.drop_next_commit.swap(false, Ordering::SeqCst) {
                state.commits_dropped.fetch_add(1, Ordering::SeqCst);
                cut.store(true, Ordering::SeqCst);
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let to_client = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            thawed(true).await;
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if cut.load(Ordering::SeqCst) {
                return;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = to_server => {}
        () = to_client => {}
        _ = up.wait_for(|up| !*up) => {}
    }
}

/// Counts the occurrences of the counted pattern in `tail` (the end of
/// the connection's last read, shorter than the pattern) and `bytes`, and
/// keeps the new tail.
fn count_sent(state: &State, tail: &mut Vec<u8>, bytes: &[u8]) {
    let mut counted = state.counted.lock().unwrap();
    let Some((pattern, n)) = counted.as_mut() else {
        return;
    };
    tail.extend_from_slice(bytes);
    *n += tail.windows(pattern.len()).filter(|w| w == pattern).count();
    let keep = tail.len().min(pattern.len() - 1);
    tail.drain(..tail.len() - keep);
}

/// Waits for [`Proxy::release`] when `bytes` hold the statement armed by
/// [`Proxy::hold_next`] (once: the arming is taken).
async fn hold_if_armed(state: &State, bytes: &[u8]) {
    let armed = {
        let mut hold = state.hold.lock().unwrap();
        match *hold {
            Some(statement) if contains(bytes, statement) => hold.take().is_some(),
            _ => false,
        }
    };
    if armed {
        let mut held = state.held.subscribe();
        state.held.send_replace(true);
        let _ = held.wait_for(|held| !*held).await;
    }
}

/// Whether the client's bytes hold a `COMMIT` statement: a simple query
/// whose whole text is `COMMIT` (NUL-terminated on the wire), not a
/// statement that merely names it (`SET TRANSACTION ISOLATION LEVEL READ
/// COMMITTED`).
fn is_commit(bytes: &[u8]) -> bool {
    contains(bytes, b"COMMIT\0")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
