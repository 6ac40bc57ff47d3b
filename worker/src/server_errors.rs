//! What the NATS server told a connection on its own (`-ERR` lines such as a
//! permissions violation). A JetStream publish the server refuses for lack of
//! permission gets no PubAck, only a timeout; the server's reason arrives
//! separately, on the connection's event callback. Recording it here lets the
//! relay put that reason in the row's `last_error` instead of "timed out".

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// How many recent server errors are kept.
const KEPT: usize = 64;

/// Recent asynchronous errors from the server, shared by the connection's
/// event callback (which records) and the relay (which reads).
#[derive(Debug, Clone, Default)]
pub struct ServerErrors(Arc<Mutex<VecDeque<String>>>);

impl ServerErrors {
    /// Records one error the server sent.
    pub fn record(&self, message: impl Into<String>) {
        let mut errors = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if errors.len() == KEPT {
            errors.pop_front();
        }
        errors.push_back(message.into());
    }

    /// The most recent permissions violation the server reported for a
    /// publish to `subject`, if any.
    pub fn publish_violation(&self, subject: &str) -> Option<String> {
        let quoted = format!("\"{subject}\"");
        let errors = self.0.lock().unwrap_or_else(|e| e.into_inner());
        errors
            .iter()
            .rev()
            .find(|e| {
                let lower = e.to_ascii_lowercase();
                lower.contains("permissions violation for publish") && e.contains(&quoted)
            })
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_violation_is_found_by_its_subject_only() {
        let errors = ServerErrors::default();
        errors.record("Permissions Violation for Publish to \"ledger.forbidden\"");
        errors.record("Slow Consumer");
        assert!(errors.publish_violation("ledger.forbidden").is_some());
        assert!(errors.publish_violation("ledger.forbid").is_none());
        assert!(errors.publish_violation("ledger.recorded").is_none());
    }

    #[test]
    fn only_the_most_recent_errors_are_kept() {
        let errors = ServerErrors::default();
        errors.record("Permissions Violation for Publish to \"old\"");
        for i in 0..KEPT {
            errors.record(format!("other {i}"));
        }
        assert!(errors.publish_violation("old").is_none());
    }
}
