//! What crosses seawall's edges as bytes, parsed before anything else
//! touches it: a delivery's headers into an [`envelope::Envelope`], and the
//! WAL outbox's logical messages into [`wal::WalEvent`]s. Untrusted input
//! meets these parsers first, so they are fuzzed (`fuzz/`), and they depend
//! on nothing heavier than `bytes` and `chrono` so the fuzz build is small.
//!
//! # Layout
//! - [`envelope`]: validated ids and the envelope handed to handlers.
//! - [`wal`]: the WAL outbox's event encoding, version 1.

pub mod envelope;
pub mod wal;
