//! The domain's tables: here, the example domain's accounts and the credits
//! applied to them. A fork replaces this folder with its own tables (see
//! `docs/fork.md`); platform code never names them.

pub mod account;
pub mod credit;
