//! Fuzzes the WAL outbox's decoder: a logical message with seawall's prefix
//! can be written by hand or by another version, and the relay decodes it
//! before anything else. Nothing may panic or allocate from a made-up
//! length, and whatever decodes encodes to content that decodes to the
//! same events (headers may come back in another order).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let content = bytes::Bytes::copy_from_slice(data);
    if let Ok(events) = wire::wal::decode(&content) {
        let again = wire::wal::encode(&events).expect("decoded events encode");
        assert_eq!(wire::wal::decode(&again.into()), Ok(events));
    }
});
