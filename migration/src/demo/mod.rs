//! The example domain's migration. A fork deletes this module, its line in
//! [`crate::Migrator`], and adds its own migrations (see `docs/fork.md`).

pub mod m20261130_000004_create_demo_domain;
