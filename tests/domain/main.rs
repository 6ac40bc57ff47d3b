//! Tests of the example domain's commands (`seawall load`): they go with the
//! demo when a fork deletes it (see `docs/fork.md`). Platform tests never
//! depend on the demo.

#[path = "../support/mod.rs"]
mod support;

mod sqlite_processes;
