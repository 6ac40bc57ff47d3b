//! List pages leave the messages out: a page of big events or dead letters
//! reads their ids and states, not megabytes of payload; the detail reads
//! the payload.

use chrono::Utc;
use sea_orm::{ActiveValue::Set, EntityTrait};

use entity::{dead_letter, inbox_message, outbox_message};
use service::admin::{self, Cursor, DeadLetterFilter, MarkerFilter, OutboxFilter};

use crate::on_backends;
use crate::support::{Backend, TestDb, rows};

/// A megabyte of payload.
fn big() -> Vec<u8> {
    vec![b'x'; 1 << 20]
}

async fn list_pages_read_no_payload(backend: Backend) {
    let t = TestDb::new(backend).await;
    let now = Utc::now();
    let mut event = rows::event("big-event".into(), now);
    event.payload = Set(big());
    event.headers = Set(serde_json::json!({ "traceparent": "00-1-2-01" }));
    let event_id = outbox_message::Entity::insert(event)
        .exec(&t.db)
        .await
        .unwrap()
        .last_insert_id;
    let mut claim = rows::marker("big-claim".into(), "hook", now);
    claim.processed_at = Set(None);
    claim.payload = Set(Some(big()));
    inbox_message::Entity::insert(claim)
        .exec_without_returning(&t.db)
        .await
        .unwrap();
    let letter_id = dead_letter::Entity::insert(dead_letter::ActiveModel {
        consumer: Set("hook".into()),
        message_id: Set(Some("big-letter".into())),
        subject: Set("ledger.recorded".into()),
        payload: Set(big()),
        headers: Set(serde_json::json!({ "a": "b" })),
        error: Set("malformed".into()),
        deliveries: Set(1),
        created_at: Set(now),
        replayed_at: Set(None),
        ..Default::default()
    })
    .exec(&t.db)
    .await
    .unwrap()
    .last_insert_id;
    let page = Cursor {
        after: None,
        limit: 10,
    };

    let events = admin::outbox_rows(&t.db, &OutboxFilter::default(), page)
        .await
        .unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].message_id, "big-event");
    // A page's rows are `Summary` models: the type has no payload or
    // headers, so none can be read (or mistaken for an empty one).
    let detail = admin::outbox_row(&t.db, event_id).await.unwrap().unwrap();
    assert_eq!(detail.payload.len(), 1 << 20, "the detail reads it");

    let markers = admin::markers(&t.db, &MarkerFilter::default(), page, now)
        .await
        .unwrap();
    assert_eq!(markers.len(), 1);
    assert_eq!(markers[0].message_id, "big-claim");

    let letters = admin::dead_letters(&t.db, &DeadLetterFilter::default(), page)
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].error, "malformed");
    let detail = admin::dead_letter(&t.db, letter_id).await.unwrap().unwrap();
    assert_eq!(detail.payload.len(), 1 << 20, "the detail reads it");
}
on_backends!(list_pages_read_no_payload: sqlite, postgres, mysql);
