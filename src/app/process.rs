//! How a seawall binary lives and ends: logs first, the signal handlers
//! installed before anything can wait, and a runtime that cannot hold the
//! exit after the work is done.
//!
//! In a container seawall is PID 1, and the kernel applies no default
//! action to a signal PID 1 has no handler for: a SIGTERM that arrives
//! before the handler exists is ignored, and the pod waits out its grace
//! period for a SIGKILL. So [`main`] installs the handlers before it runs
//! anything, and every command takes the token they cancel.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use tokio_util::sync::CancellationToken;

/// How long the runtime waits, once the command has returned, for blocking
/// work still running (a DNS lookup, a file sync) before the process exits
/// all the same.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(3);

/// Runs a binary's `command` on a tokio runtime: telemetry (see [`init`]),
/// then the SIGINT/SIGTERM handlers and the token they cancel, then the
/// command; the exit status says how it ended (see [`exit_code`]).
pub fn main<F, Fut>(command: F) -> ExitCode
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return exit_code(Err(anyhow::Error::new(err).context("starting tokio"))),
    };
    let result = runtime.block_on(async {
        let stop = stop_on_signal()?;
        let _telemetry = init()?;
        command(stop).await
    });
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    exit_code(result)
}

/// What every seawall binary does first: logs and traces (see
/// [`crate::telemetry`]), and rustls's ring provider installed (reqwest,
/// used by webhooks, brings none of its own; ring is the one sqlx and
/// async-nats already build). Hold the result until the process ends: it
/// flushes the traces not yet exported.
///
/// # Errors
/// A logging variable that cannot be used, named.
pub fn init() -> Result<crate::telemetry::Telemetry, crate::telemetry::TelemetryError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    crate::telemetry::init()
}

/// How a seawall binary ends: success, or one line with the cause chain on
/// stderr (no backtrace for an operator's error) and a failure status.
pub fn exit_code(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// A token cancelled on SIGINT or SIGTERM. The handlers are installed
/// before this returns (not by a task that may run later), so a signal
/// from the next instant on is caught.
///
/// # Errors
/// The handlers cannot be installed.
pub fn stop_on_signal() -> Result<CancellationToken> {
    let token = CancellationToken::new();
    let signals = Signals::install()?;
    let stop = token.clone();
    tokio::spawn(async move {
        signals.recv().await;
        stop.cancel();
    });
    Ok(token)
}

/// SIGINT and SIGTERM, their handlers installed.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    #[cfg(unix)]
    fn install() -> Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    #[cfg(not(unix))]
    fn install() -> Result<Self> {
        Ok(Self {})
    }

    /// Waits for the first of them.
    #[cfg(unix)]
    async fn recv(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }

    #[cfg(not(unix))]
    async fn recv(self) {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Runs a one-shot command's `work` (`migrate`, `prune`, `stats`, ...)
/// until it ends or `stop` is cancelled, which ends it with an error naming
/// `what`: a command a signal stopped has not done its work, and a job
/// running it must not count it as done.
///
/// # Errors
/// `work`'s own error, or the signal.
pub async fn or_stopped<T>(
    stop: &CancellationToken,
    what: &str,
    work: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::select! {
        biased;
        () = stop.cancelled() => {
            tracing::warn!(interrupted = what, "stopped by a signal");
            anyhow::bail!("stopped by a signal while {what}; nothing after that point was done")
        }
        done = work => done,
    }
}
