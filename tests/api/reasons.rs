//! "Why is this row stuck?": every unpublished outbox row and every open or
//! quarantined claim carries a reason, computed per page.

use chrono::{Duration, Utc};
use sea_orm::{ActiveValue::Set, EntityTrait};

use entity::{dead_letter, inbox_message, outbox_message};

use crate::harness::TestApi;
use crate::on_backends;
use crate::support::{Backend, rows};

/// `(code, text)` of the row with `message_id` in a list page.
fn reason_of(page: &serde_json::Value, message_id: &str) -> (String, String) {
    let row = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["message_id"] == message_id)
        .unwrap_or_else(|| panic!("{message_id} is listed: {page}"));
    (
        row["reason"]["code"].as_str().unwrap_or("none").to_owned(),
        row["reason"]["text"].as_str().unwrap_or("").to_owned(),
    )
}

async fn every_outbox_row_says_why_it_is_not_published(backend: Backend) {
    let api = TestApi::start(backend).await;
    let now = Utc::now();
    let later = now + Duration::minutes(5);
    let event = |id: &str| rows::event(id.into(), now - Duration::seconds(1));
    let ready = event("ready");
    let mut backing_off = event("backing-off");
    backing_off.attempts = Set(3);
    backing_off.next_attempt_at = Set(later);
    backing_off.last_error = Set(Some("PubAck for x: timed out".into()));
    let mut held = event("held");
    held.locked_by = Set(Some("relay-7#12".into()));
    held.locked_until = Set(Some(later));
    let mut no_stream = event("no-stream");
    no_stream.subject = Set("nowhere.at.all".into());
    no_stream.attempts = Set(1);
    no_stream.next_attempt_at = Set(later);
    no_stream.last_error = Set(Some(
        "publish to nowhere.at.all: no stream found for given subject".into(),
    ));
    let mut head = event("head");
    head.ordering_key = Set(Some("acct-1".into()));
    head.attempts = Set(2);
    head.next_attempt_at = Set(later);
    head.last_error = Set(Some("broker down".into()));
    let mut behind = event("behind");
    behind.ordering_key = Set(Some("acct-1".into()));
    let mut dead = event("dead");
    dead.attempts = Set(10);
    dead.dead_at = Set(Some(now));
    dead.last_error = Set(Some("payload too large".into()));
    let mut published = event("published");
    published.published_at = Set(Some(now));
    outbox_message::Entity::insert_many([
        ready,
        backing_off,
        held,
        no_stream,
        head,
        behind,
        dead,
        published,
    ])
    .exec_without_returning(&api.t.db)
    .await
    .unwrap();

    let (status, page) = api.get("/api/v1/outbox?limit=50").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(reason_of(&page, "ready").0, "ready");
    let (code, text) = reason_of(&page, "backing-off");
    assert_eq!(code, "backing_off");
    assert!(
        text.contains("3 failed attempt(s)") && text.contains("timed out"),
        "{text}"
    );
    let (code, text) = reason_of(&page, "held");
    assert_eq!(code, "held");
    assert!(text.contains("relay-7#12"), "{text}");
    let (code, text) = reason_of(&page, "no-stream");
    assert_eq!(code, "no_stream");
    assert!(text.contains("nowhere.at.all"), "{text}");
    let (code, text) = reason_of(&page, "behind");
    assert_eq!(code, "behind");
    assert!(
        text.contains("key acct-1") && text.contains("backing off") && text.contains("broker down"),
        "the blocking row and its own reason: {text}"
    );
    assert_eq!(reason_of(&page, "head").0, "backing_off");
    let (code, text) = reason_of(&page, "dead");
    assert_eq!(code, "dead");
    assert!(text.contains("payload too large"), "{text}");
    assert_eq!(reason_of(&page, "published").0, "none");

    // The detail view says the same.
    let id = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["message_id"] == "behind")
        .unwrap()["id"]
        .as_i64()
        .unwrap();
    let (_, detail) = api.get(&format!("/api/v1/outbox/{id}")).await;
    assert_eq!(detail["reason"]["code"], "behind");
}
on_backends!(every_outbox_row_says_why_it_is_not_published: sqlite, postgres);

async fn every_open_claim_says_why_it_is_not_done(backend: Backend) {
    let api = TestApi::start(backend).await;
    let now = Utc::now();
    let marker = |id: &str| {
        let mut m = rows::marker(id.into(), "hook", now);
        m.processed_at = Set(None);
        m
    };
    let mut held = marker("held");
    held.claimed_by = Set(Some("instance-3".into()));
    held.lease_until = Set(Some(now + Duration::minutes(5)));
    let mut expired = marker("expired");
    expired.attempts = Set(2);
    expired.lease_until = Set(Some(now - Duration::minutes(5)));
    let mut quarantined = marker("quarantined");
    quarantined.quarantined_at = Set(Some(now));
    let processed = rows::marker("processed".into(), "hook", now);
    inbox_message::Entity::insert_many([held, expired, quarantined, processed])
        .exec_without_returning(&api.t.db)
        .await
        .unwrap();
    let letter = dead_letter::ActiveModel {
        consumer: Set("hook".into()),
        message_id: Set(Some("quarantined".into())),
        subject: Set("ledger.recorded".into()),
        payload: Set(Vec::new()),
        headers: Set(serde_json::json!({})),
        error: Set("claim abandoned".into()),
        deliveries: Set(5),
        created_at: Set(now),
        replayed_at: Set(None),
        ..Default::default()
    };
    let letter_id = dead_letter::Entity::insert(letter)
        .exec(&api.t.db)
        .await
        .unwrap()
        .last_insert_id;

    let (status, page) = api.get("/api/v1/inbox?limit=50").await;
    assert_eq!(status, 200, "{page}");
    let (code, text) = reason_of(&page, "held");
    assert_eq!(code, "held");
    assert!(text.contains("instance-3"), "{text}");
    let (code, text) = reason_of(&page, "expired");
    assert_eq!(code, "expired");
    assert!(text.contains("2 attempt(s)"), "{text}");
    let (code, text) = reason_of(&page, "quarantined");
    assert_eq!(code, "quarantined");
    assert!(
        text.contains(&format!("dead letter #{letter_id}")),
        "{text}"
    );
    assert_eq!(reason_of(&page, "processed").0, "none");
}
on_backends!(every_open_claim_says_why_it_is_not_done: sqlite, postgres);
