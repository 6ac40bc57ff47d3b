//! The example domain: crediting accounts. It shows what domain logic looks
//! like on top of the platform (a handler making several business writes and
//! recording an outbox event on the inbox's transaction). A fork deletes this
//! module and adds its own (see `docs/fork.md`); no platform code or test
//! depends on it.

pub mod credits;
