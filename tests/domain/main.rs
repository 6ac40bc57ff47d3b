//! Tests of the example domain (its commands, its settings): a fork replaces
//! this folder with its own (see `docs/fork.md`). Platform tests never
//! depend on the example.

use testkit as support;

mod settings;
mod sqlite_processes;
