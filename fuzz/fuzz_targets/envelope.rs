//! Fuzzes everything a delivery's bytes go through before a handler runs:
//! id extraction from headers and envelope validation. Nothing may panic.
//! (Domain payload parsers are property-tested in their own modules.)

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The input is split into header values and a payload, so the fuzzer
    // explores ids, CloudEvents pairs and payloads together.
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(4, '\u{1}');
    let mut headers = BTreeMap::new();
    for name in ["Nats-Msg-Id", "ce-source", "ce-id"] {
        if let Some(value) = parts.next().filter(|v| !v.starts_with('-')) {
            headers.insert(name.to_owned(), value.to_owned());
        }
    }
    let payload = parts.next().unwrap_or_default().as_bytes().to_vec();
    if let Ok(envelope) = wire::envelope::Envelope::from_delivery("events.in", headers, payload) {
        assert!(!envelope.message_id.as_str().trim().is_empty());
    }
});
