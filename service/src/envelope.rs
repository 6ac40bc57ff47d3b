//! Validated identifiers and the message envelope handed to handlers; they
//! live in [`wire::envelope`], which the fuzz targets build with few
//! dependencies, and are re-exported here.

pub use wire::envelope::*;
