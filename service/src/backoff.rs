//! The one backoff every retry loop uses: the executor between attempts of a
//! unit, the relay between publish attempts of a row, the consumer between
//! deliveries of a failing message.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff from `base`, doubling per attempt up to `max`, with
/// equal jitter: contenders that failed together (a deadlock's two sides, a
/// batch whose PubAcks were lost together) do not retry together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The pause after the first failure.
    pub base: Duration,
    /// The longest pause.
    pub max: Duration,
    /// Whether pauses are jittered (half fixed, half random).
    pub jitter: bool,
}

impl Backoff {
    /// A jittered backoff from `base` to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            jitter: true,
        }
    }

    /// The pause after the `failures`th failure (1 for the first): `base`
    /// doubled `failures - 1` times, at most `max`; with jitter, between
    /// half of that and all of it.
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32 << failures.saturating_sub(1).min(20))
            .min(self.max);
        if !self.jitter {
            return exp;
        }
        let half = exp / 2;
        let jitter_ms = u64::try_from((exp - half).as_millis()).unwrap_or(u64::MAX);
        half + Duration::from_millis(rand::rng().random_range(0..=jitter_ms)).min(exp - half)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_stay_bounded_and_jitter_within_half() {
        let fixed = Backoff {
            jitter: false,
            ..Backoff::new(Duration::from_millis(10), Duration::from_millis(100))
        };
        assert_eq!(fixed.delay(1), Duration::from_millis(10));
        assert_eq!(fixed.delay(3), Duration::from_millis(40));
        assert_eq!(fixed.delay(40), Duration::from_millis(100));
        let jittered = Backoff::new(Duration::from_millis(10), Duration::from_millis(100));
        for failures in 1..40 {
            let d = jittered.delay(failures);
            let full = fixed.delay(failures);
            assert!(d <= full && d >= full / 2, "{failures}: {d:?}");
        }
    }
}
