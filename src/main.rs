//! The `seawall` command: the platform's command line ([`seawall::cli`])
//! on the domain in `src/domain/`. Errors end here, printed with their
//! cause chain.

// The command line's future is deep; a domain's commands can take it past
// the default query depth of 128.
#![recursion_limit = "256"]

use std::process::ExitCode;

use anyhow::Result;

use seawall::cli::Service;
use seawall::config::Loaded;
use seawall::{Domain, domain};

/// The service this binary runs: the domain folders' settings, commands,
/// stream and consumers.
struct ThisService;

impl Service for ThisService {
    type Settings = domain::Settings;
    type Commands = domain::Commands;

    fn domain(loaded: &Loaded<domain::Settings>) -> Result<Domain> {
        domain::domain(loaded)
    }

    async fn run_command(
        command: domain::Commands,
        loaded: &Loaded<domain::Settings>,
    ) -> Result<()> {
        domain::run(command, loaded).await
    }
}

fn main() -> ExitCode {
    seawall::cli::main::<ThisService>()
}
