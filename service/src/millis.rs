//! `*_ms` settings, the platform's and a domain's: a number of
//! milliseconds, as always, or a duration with units (`"30s"`, `"15m"`,
//! `"7days"`, `"1h 30m"`), which reads better for the long ones (retention,
//! stream age) and cannot be off by a factor of 1,000. Use it with
//! `#[serde(deserialize_with = "service::millis::deserialize")]`.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, Visitor};

/// Deserializes a `*_ms` setting.
///
/// # Errors
/// A value that is neither a non-negative integer nor a duration with units.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    deserializer.deserialize_any(Millis)
}

/// Deserializes an optional `*_ms` setting.
///
/// # Errors
/// As [`deserialize`].
pub fn option<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    deserializer.deserialize_option(OptionalMillis)
}

/// Parses the text form: digits are milliseconds, anything else a
/// duration with units.
fn parse(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(ms);
    }
    let duration = humantime::parse_duration(text).map_err(|e| {
        format!("{text:?} is neither milliseconds nor a duration such as \"30s\" or \"15m\": {e}")
    })?;
    // A part of a millisecond would be dropped in silence, and "500us"
    // would become 0, which some keys read as "forever".
    if duration.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!("{text:?} is not a whole number of milliseconds"));
    }
    u64::try_from(duration.as_millis()).map_err(|_| format!("{text:?} is too long"))
}

struct Millis;

impl Visitor<'_> for Millis {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("milliseconds, or a duration with units such as \"30s\" or \"15m\"")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom(format!("{v} is negative")))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        parse(v).map_err(E::custom)
    }
}

struct OptionalMillis;

impl<'de> Visitor<'de> for OptionalMillis {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Millis.expecting(f)
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
        deserialize(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn milliseconds_and_durations_with_units_are_read_alike() {
        assert_eq!(parse("30000"), Ok(30_000));
        assert_eq!(parse("30s"), Ok(30_000));
        assert_eq!(parse("15m"), Ok(900_000));
        assert_eq!(parse("1h 30m"), Ok(5_400_000));
        assert_eq!(parse("7days"), Ok(7 * 24 * 3_600_000));
        assert_eq!(parse("250ms"), Ok(250));
        assert!(parse("soon").is_err());
        assert!(parse("500us").is_err());
        assert!(parse("1.5ms").is_err());
        assert!(parse("-5s").is_err());
    }
}
