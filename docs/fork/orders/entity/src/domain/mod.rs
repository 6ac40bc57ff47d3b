//! The orders service's tables.

pub mod orders;
