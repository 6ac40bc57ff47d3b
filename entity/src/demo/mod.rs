//! The example domain's tables: accounts and the credits applied to them.
//! A fork deletes this module with the rest of the demo (see `docs/fork.md`).

pub mod account;
pub mod credit;
