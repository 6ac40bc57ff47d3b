//! W3C trace context (`traceparent`, `tracestate`) and baggage through the
//! outbox: captured from the handler's span when an event is enqueued and
//! stored in the row's headers, continued by the relay's publish span, and
//! picked up by the consumer on the other side, so one trace runs from a
//! request to every downstream effect. The propagator is whatever the
//! process installed (`opentelemetry::global`); without one, nothing is
//! written and nothing is read.

use std::collections::BTreeMap;

use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct Inject<'a>(&'a mut BTreeMap<String, String>);

impl Injector for Inject<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

struct Extract<'a>(&'a BTreeMap<String, String>);

impl Extractor for Extract<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(key))
            .map(|(_, value)| value.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// The trace headers of `span`'s context (empty when it is not traced).
pub fn headers_of(span: &tracing::Span) -> BTreeMap<String, String> {
    let mut headers = BTreeMap::new();
    let cx = span.context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut Inject(&mut headers))
    });
    headers
}

/// The trace headers a message carries (`traceparent`, `tracestate`,
/// `baggage`), passed on unchanged when this process traces nothing.
pub fn carried(headers: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    headers
        .iter()
        .filter(|(name, _)| {
            ["traceparent", "tracestate", "baggage"]
                .iter()
                .any(|h| name.eq_ignore_ascii_case(h))
        })
        .map(|(name, value)| (name.to_ascii_lowercase(), value.clone()))
        .collect()
}

/// Writes the current span's trace headers into `headers`, or, when this
/// process traces nothing, those of the message being handled (`carried`),
/// leaving any a handler set itself alone.
pub fn inject_current(headers: &mut BTreeMap<String, String>, carried: &BTreeMap<String, String>) {
    // An untraced span has no context to write: skip the propagator on the
    // handler's hot path.
    let span = tracing::Span::current();
    let current = if span.is_disabled() {
        BTreeMap::new()
    } else {
        headers_of(&span)
    };
    let trace = if current.is_empty() {
        carried
    } else {
        &current
    };
    for (name, value) in trace {
        headers.entry(name.clone()).or_insert_with(|| value.clone());
    }
}

/// Makes `span` a child of the trace `headers` carry, if they carry one
/// and `span` is traced.
pub fn continue_from(span: &tracing::Span, headers: &BTreeMap<String, String>) {
    if span.is_disabled() {
        return;
    }
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Extract(headers)));
    if opentelemetry::trace::TraceContextExt::span(&cx)
        .span_context()
        .is_valid()
    {
        // Fails only for a span that is already closed or not traced.
        let _ = span.set_parent(cx);
    }
}
