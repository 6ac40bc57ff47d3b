//! What a consumer counts for `/metrics`: outcomes per consumer and the
//! delay from an event's write to its handling.

use std::collections::BTreeMap;

use async_nats::jetstream;

use super::Consumer;

impl Consumer {
    /// Records `seawall_end_to_end_latency_seconds` for a message whose
    /// handling just committed: from when it was written (the relays'
    /// `Seawall-Written-At`; the broker's store time for a message published
    /// by something else). A replayed dead letter is left out: it was
    /// written before it died, and its delay says nothing of the pipeline.
    pub(super) fn record_latency(
        &self,
        msg: &jetstream::Message,
        headers: &BTreeMap<String, String>,
    ) {
        if msg.subject.as_str() == self.replay_subject() {
            return;
        }
        let written = headers
            .get(service::envelope::HEADER_WRITTEN_AT)
            .and_then(|at| written_at_nanos(at))
            .or_else(|| {
                let stored = msg.info().ok()?.published.unix_timestamp_nanos();
                i64::try_from(stored).ok()
            });
        let (Some(written), Some(now)) = (written, chrono::Utc::now().timestamp_nanos_opt()) else {
            return;
        };
        // A clock behind the writer's reads as no delay, not a negative one.
        let latency = now.saturating_sub(written).max(0) as f64 / 1e9;
        metrics::histogram!("seawall_end_to_end_latency_seconds", "consumer" => self.registration.consumer.to_string())
            .record(latency);
    }

    /// Counts a message outcome in `seawall_consumer_messages_total`.
    pub(super) fn count(&self, outcome: &'static str) {
        metrics::counter!("seawall_consumer_messages_total", "consumer" => self.registration.consumer.to_string(), "outcome" => outcome)
            .increment(1);
    }
}

/// A `Seawall-Written-At` value in nanoseconds since the epoch: microseconds
/// as relays write it, or RFC 3339 as earlier relays did.
fn written_at_nanos(value: &str) -> Option<i64> {
    match value.parse::<i64>() {
        Ok(micros) => micros.checked_mul(1000),
        Err(_) => chrono::DateTime::parse_from_rfc3339(value)
            .ok()?
            .timestamp_nanos_opt(),
    }
}

#[cfg(test)]
mod tests {
    use super::written_at_nanos;

    #[test]
    fn written_at_reads_microseconds_and_the_earlier_rfc3339() {
        assert_eq!(
            written_at_nanos("1796239800123456"),
            Some(1_796_239_800_123_456_000)
        );
        assert_eq!(
            written_at_nanos("2026-12-02T19:30:00.123456Z"),
            Some(1_796_239_800_123_456_000)
        );
        assert_eq!(written_at_nanos("9223372036854775807"), None);
        assert_eq!(written_at_nanos("yesterday"), None);
    }
}
