//! Short names for every entity, for `use entity::prelude::*`.

pub use super::dead_letter::Entity as DeadLetter;
pub use super::inbox_message::Entity as InboxMessage;
pub use super::outbox_message::Entity as OutboxMessage;
pub use super::throughput_minute::Entity as ThroughputMinute;
