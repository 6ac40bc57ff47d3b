//! Property tests of the pure logic every message passes through: whatever
//! the input, nothing panics, and the rules hold.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use proptest::prelude::*;

use service::claim::lease_expired;
use service::classify::{Engine, ErrorShape, Failure, INBOX_INDEX, classify_shape};
use service::envelope::{Envelope, MAX_MESSAGE_ID_LEN, MessageId};
use service::executor::RetryPolicy;
use service::retention::{BrokerSettings, check_inbox_retention};

fn engine() -> impl Strategy<Value = Engine> {
    prop_oneof![
        Just(Engine::Postgres),
        Just(Engine::Sqlite),
        Just(Engine::MySql)
    ]
}

fn shape() -> impl Strategy<Value = ErrorShape> {
    let code = prop_oneof![
        Just("23505".to_owned()),
        Just("2067".to_owned()),
        Just("1555".to_owned()),
        Just("23000".to_owned()),
        Just("40001".to_owned()),
        Just("517".to_owned()),
        "[0-9A-Z]{0,6}",
    ];
    let constraint = prop_oneof![
        Just(INBOX_INDEX.to_owned()),
        Just("ix_credit_reference".to_owned()),
        ".{0,40}"
    ];
    let message = prop_oneof![
        Just(
            "UNIQUE constraint failed: inbox_message.message_id, inbox_message.consumer".to_owned()
        ),
        Just("Duplicate entry 'x' for key 'inbox_message.ix_inbox_message_id_consumer'".to_owned()),
        Just("Duplicate entry 'x' for key 'ix_credit_reference'".to_owned()),
        ".{0,120}",
    ];
    prop_oneof![
        (
            engine(),
            proptest::option::of(code),
            proptest::option::of(any::<u16>()),
            proptest::option::of(constraint),
            message
        )
            .prop_map(|(backend, code, number, constraint, message)| {
                ErrorShape::Database {
                    backend,
                    code,
                    number,
                    constraint,
                    message,
                }
            }),
        ".{0,40}".prop_map(ErrorShape::ConnectionLost),
        ".{0,40}".prop_map(ErrorShape::Other),
    ]
}

/// Whether a shape really describes a violation of the inbox index.
fn is_inbox_violation(shape: &ErrorShape) -> bool {
    match shape {
        ErrorShape::Database {
            backend: Engine::Postgres,
            code,
            constraint,
            ..
        } => code.as_deref() == Some("23505") && constraint.as_deref() == Some(INBOX_INDEX),
        ErrorShape::Database {
            backend: Engine::Sqlite,
            code,
            message,
            ..
        } => {
            matches!(code.as_deref(), Some("2067" | "1555"))
                && message
                    .trim_end()
                    .ends_with("inbox_message.message_id, inbox_message.consumer")
        }
        ErrorShape::Database {
            backend: Engine::MySql,
            number,
            message,
            ..
        } => {
            *number == Some(1062)
                && message
                    .trim()
                    .trim_end_matches(['\'', '`'])
                    .ends_with(INBOX_INDEX)
        }
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Only a violation of the inbox index is ever a duplicate (rule 4).
    #[test]
    fn only_the_inbox_index_is_a_duplicate(shape in shape()) {
        let failure = classify_shape(&shape);
        if failure == Failure::InboxDuplicate {
            prop_assert!(is_inbox_violation(&shape), "{shape:?} was taken for a duplicate");
        }
        if let ErrorShape::ConnectionLost(_) = shape {
            prop_assert!(matches!(failure, Failure::Transient { .. }), "connection loss is transient");
        }
    }

    /// Arbitrary headers and bytes never panic; an accepted id is usable.
    #[test]
    fn envelopes_from_arbitrary_deliveries_never_panic(
        headers in proptest::collection::btree_map(
            prop_oneof![Just("Nats-Msg-Id".to_owned()), Just("ce-source".to_owned()), Just("ce-id".to_owned()), ".{0,12}"],
            ".{0,260}",
            0..5,
        ),
        payload in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        if let Ok(env) = Envelope::from_delivery("credits.requested", headers, payload) {
            let id = env.message_id.as_str();
            prop_assert!(!id.trim().is_empty() && id.len() <= MAX_MESSAGE_ID_LEN);
            prop_assert!(!id.chars().any(char::is_control));
        }
    }


    /// Message ids: accepted exactly when non-blank, bounded and free of control characters.
    #[test]
    fn message_ids_are_accepted_exactly_when_valid(raw in ".{0,260}") {
        let valid = !raw.trim().is_empty() && raw.len() <= MAX_MESSAGE_ID_LEN && !raw.chars().any(char::is_control);
        prop_assert_eq!(MessageId::parse(raw).is_ok(), valid);
    }

    /// The retention check refuses exactly the retentions below the horizon.
    #[test]
    fn retention_is_refused_exactly_below_the_redelivery_horizon(
        ack_ms in 1u64..600_000, deliveries in 1u32..100, age_s in 0u64..3_000_000, retention_s in 0u64..4_000_000, allow in any::<bool>(),
    ) {
        let broker = BrokerSettings {
            ack_wait: Duration::from_millis(ack_ms),
            max_deliver: deliveries,
            stream_max_age: Duration::from_secs(age_s),
        };
        // A max age of zero keeps messages forever: no finite horizon.
        let horizon = if age_s == 0 {
            Duration::MAX
        } else {
            Duration::from_millis(ack_ms) * deliveries + Duration::from_secs(age_s)
        };
        prop_assert_eq!(broker.redelivery_horizon(), horizon);
        let retention = Duration::from_secs(retention_s);
        let ok = check_inbox_retention(retention, &broker, allow).is_ok();
        prop_assert_eq!(ok, allow || retention >= horizon);
        prop_assert!(broker.inbox_retention(Duration::from_secs(1)) >= horizon);
    }

    /// A lease is over exactly at and after its end; a released claim is free.
    #[test]
    fn leases_expire_exactly_at_their_end(until in 0i64..4_000_000_000, now in 0i64..4_000_000_000) {
        let at = |s| Utc.timestamp_opt(s, 0).single().unwrap();
        prop_assert_eq!(lease_expired(Some(at(until)), at(now)), until <= now);
        prop_assert!(lease_expired(None, at(now)));
    }

    /// Backoff never exceeds its bound, whatever the attempt number.
    #[test]
    fn backoff_stays_within_its_bound(attempt in 0u32..10_000, base_ms in 0u64..10_000, max_ms in 0u64..100_000) {
        let policy = RetryPolicy { max_attempts: 5, base_delay: Duration::from_millis(base_ms), max_delay: Duration::from_millis(max_ms) };
        prop_assert!(policy.backoff(attempt) <= policy.max_delay);
    }
}

#[test]
fn headers_without_an_id_are_refused() {
    let err = Envelope::from_delivery("s", BTreeMap::new(), Vec::new()).unwrap_err();
    assert!(err.to_string().contains("no id"));
}
