//! seawall's test kit: the test-only domain the platform proves itself on.
//!
//! The platform's tests, the testbed binary and the benchmarks run on the
//! [`ledger`], never on the domain a fork replaces, so a fork keeps every
//! one of them (see `docs/fork.md`).
//!
//! # Layout
//! - [`ledger`]: entries added to accounts, a `ledger.recorded` event per
//!   entry, and the tables they live in.

pub mod ledger;
