//! What a seawall process tells its operators: logs on stderr (text, or one
//! JSON object per line with `trace_id` and `span_id` when
//! `SEAWALL_LOG_FORMAT=json`, filtered by `SEAWALL_LOG`), and OpenTelemetry
//! traces, exported over OTLP when the standard `OTEL_EXPORTER_OTLP_*`
//! variables name an endpoint (and only then). The W3C trace-context and
//! baggage propagators are always installed, so a trace started upstream
//! continues through the inbox, the outbox and the relay even when this
//! process traces nothing itself (its context passes through unchanged).

use std::fmt;

use opentelemetry::global;
use opentelemetry::propagation::TextMapCompositePropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::{Layered, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// Keeps the tracer provider alive; dropping it flushes the spans not yet
/// exported (hold it until the process ends).
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Err(err) = self.provider.shutdown() {
            eprintln!("warning: flushing traces at exit: {err}");
        }
    }
}

/// Whether traces are exported: the standard variables name an OTLP
/// endpoint, and neither `OTEL_SDK_DISABLED=true` nor
/// `OTEL_TRACES_EXPORTER=none` turns exporting off.
///
/// # Errors
/// [`TelemetryError::Unsupported`] for an exporter or protocol this build
/// cannot honour: exporting nothing, or something else, silently would
/// lose the traces an operator configured.
fn exporting() -> Result<bool, TelemetryError> {
    let var = |key: &str| std::env::var(key).ok().filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
        None | Some("otlp") => {}
        Some("none") => return Ok(false),
        Some(other) => {
            return Err(TelemetryError::Unsupported {
                key: "OTEL_TRACES_EXPORTER",
                value: other.to_owned(),
                supported: "`otlp` or `none`",
            });
        }
    }
    if ![
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|key| var(key).is_some())
    {
        return Ok(false);
    }
    // The traces' own variable overrides the general one.
    let protocol = [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ]
    .into_iter()
    .find_map(|key| var(key).map(|value| (key, value)));
    if let Some((key, value)) = protocol.filter(|(_, p)| p.trim() != "http/protobuf") {
        return Err(TelemetryError::Unsupported {
            key,
            value,
            supported: "`http/protobuf` (OTLP over HTTP, usually port 4318)",
        });
    }
    Ok(true)
}

/// The attributes that tell one process from another in a trace viewer:
/// several `relay` and `consume` processes of one service otherwise show
/// identical resources. `seawall.role` is the command the process runs
/// (`run`, `relay`, `consume`, `api`, or a tool such as `migrate`).
fn process_attributes() -> Vec<opentelemetry::KeyValue> {
    use opentelemetry::KeyValue;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty());
    // The first word that is neither an option nor the value of one
    // (`--config FILE` is the only option taking a value before the command).
    let mut args = std::env::args().skip(1);
    let mut role = "none".to_owned();
    while let Some(arg) = args.next() {
        if arg == "--config" {
            args.next();
        } else if !arg.starts_with('-') {
            role = arg;
            break;
        }
    }
    // What OTEL_RESOURCE_ATTRIBUTES sets (a pod name from the downward API
    // as the instance id, say) wins over the defaults here.
    let given = std::env::var("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
    let set = |key: &str| {
        given
            .split(',')
            .any(|pair| pair.split('=').next().map(str::trim) == Some(key))
    };
    let mut attributes = vec![
        KeyValue::new("process.pid", i64::from(std::process::id())),
        KeyValue::new("seawall.role", role),
    ];
    if !set("service.instance.id") {
        attributes.push(KeyValue::new(
            "service.instance.id",
            uuid::Uuid::new_v4().to_string(),
        ));
    }
    if let Some(host) = host.filter(|_| !set("host.name")) {
        attributes.push(KeyValue::new("host.name", host));
    }
    attributes
}

/// Whether `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names the
/// service; seawall names it `seawall` only when neither does.
fn service_named() -> bool {
    std::env::var_os("OTEL_SERVICE_NAME").is_some_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|attrs| {
            attrs
                .split(',')
                .any(|pair| pair.split('=').next().map(str::trim) == Some("service.name"))
        })
}

/// A logging variable that cannot be used: start-up stops naming it rather
/// than logging in a shape or at a level nobody asked for.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `SEAWALL_LOG_FORMAT` is neither `text` nor `json`.
    #[error("SEAWALL_LOG_FORMAT must be `text` or `json`, got {0:?}")]
    LogFormat(String),
    /// `SEAWALL_LOG` is not a `tracing` filter.
    #[error("SEAWALL_LOG is not a log filter (e.g. `info,worker=debug`)")]
    LogFilter(#[source] tracing_subscriber::filter::ParseError),
    /// A standard OpenTelemetry variable asks for what this build cannot do.
    #[error("{key}={value:?} is not supported: use {supported}")]
    Unsupported {
        /// The variable.
        key: &'static str,
        /// Its value.
        value: String,
        /// What works.
        supported: &'static str,
    },
}

/// Whether `SEAWALL_LOG_FORMAT` asks for JSON lines (`json`) rather than
/// text (`text`, or unset).
fn json_format() -> Result<bool, TelemetryError> {
    match std::env::var("SEAWALL_LOG_FORMAT") {
        Err(_) => Ok(false),
        Ok(f) if f.is_empty() || f.eq_ignore_ascii_case("text") => Ok(false),
        Ok(f) if f.eq_ignore_ascii_case("json") => Ok(true),
        Ok(other) => Err(TelemetryError::LogFormat(other)),
    }
}

/// Whether stderr carries JSON lines only (`SEAWALL_LOG_FORMAT=json`), so
/// nothing else may be printed there.
pub fn json_logs() -> bool {
    json_format().unwrap_or(false)
}

/// Warnings, and the admin API's audit trail (`api::audit`): by default a
/// process logs who retried, replayed or released what.
const DEFAULT_LOG_FILTER: &str = "warn,seawall_audit=info";

/// The log filter `SEAWALL_LOG` names, [`DEFAULT_LOG_FILTER`] when unset.
fn log_filter() -> Result<EnvFilter, TelemetryError> {
    match std::env::var("SEAWALL_LOG") {
        Ok(directives) if !directives.trim().is_empty() => {
            EnvFilter::try_new(directives).map_err(TelemetryError::LogFilter)
        }
        _ => Ok(EnvFilter::new(DEFAULT_LOG_FILTER)),
    }
}

/// Installs logging, propagation and tracing for this process. A second
/// call (tests) changes nothing.
///
/// # Errors
/// [`TelemetryError`] naming a logging variable that cannot be used.
pub fn init() -> Result<Telemetry, TelemetryError> {
    let json = json_format()?;
    let log_filter = log_filter()?;
    global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ]));
    let exporting = exporting()?;
    let mut resource = Resource::builder().with_attributes(process_attributes());
    if !service_named() {
        resource = resource.with_service_name(crate::SERVICE);
    }
    let mut builder = SdkTracerProvider::builder().with_resource(resource.build());
    if exporting {
        match opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
        {
            Ok(exporter) => builder = builder.with_batch_exporter(exporter),
            Err(err) => eprintln!("warning: traces are not exported: {err}"),
        }
    }
    let provider = builder.build();
    global::set_tracer_provider(provider.clone());
    let tracer = provider.tracer("seawall");
    let logs = if json {
        json_lines(std::io::stderr).with_filter(log_filter).boxed()
    } else {
        // Colour codes only for a person at a terminal: a file or a pipe
        // (a supervisor's journal, a log shipper) gets plain text.
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(log_filter)
            .boxed()
    };
    let traces = (exporting || json).then(|| traces(tracer));
    let _ = subscriber(logs, traces).try_init();
    Ok(Telemetry { provider })
}

/// Which spans make the trace, whatever the log level: those of seawall's
/// own crates at info and above.
const TRACE_FILTER: &str = "warn,seawall=info,service=info,worker=info,api=info";

/// The layer that turns spans into OpenTelemetry spans, wanted when traces
/// are exported or JSON logs want their ids. Otherwise no span is traced (a
/// span per message and per row costs the relay a third of its throughput)
/// and the trace context of each message passes through unchanged (see
/// `service::trace`).
fn traces<S>(tracer: opentelemetry_sdk::trace::Tracer) -> impl Layer<S> + Send + Sync
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(EnvFilter::new(TRACE_FILTER))
}

/// The process's subscriber: `logs`, and `traces` when anything is traced.
///
/// Without traces the layer is left out rather than added as `None`: an
/// absent `Option` layer tells `tracing` it wants every callsite, so every
/// info span (one per message in the inbox, one per event in the relay)
/// would be created, entered and closed while nothing reads it.
fn subscriber<L, T>(logs: L, traces: Option<T>) -> tracing::Dispatch
where
    L: Layer<Registry> + Send + Sync + 'static,
    T: Layer<Layered<L, Registry>> + Send + Sync + 'static,
{
    let logged = tracing_subscriber::registry().with(logs);
    match traces {
        Some(traces) => tracing::Dispatch::new(logged.with(traces)),
        None => tracing::Dispatch::new(logged),
    }
}

/// The JSON log layer, writing to `writer`: span fields are recorded as
/// JSON ([`JsonFields`]) so that [`JsonLines`] can merge them into each line.
fn json_lines<S, W>(writer: W) -> impl Layer<S> + Send + Sync
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .fmt_fields(JsonFields::new())
        .event_format(JsonLines)
        .with_writer(writer)
}

/// One JSON object per event: time, level, target, the event's fields, the
/// fields of the spans it happened in (a message's id and consumer, say;
/// the innermost span's value wins, the event's own over any span's), the
/// current span's name, and its `trace_id` and `span_id` when it is traced.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            Value::String(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
        );
        line.insert(
            "level".into(),
            Value::String(event.metadata().level().to_string()),
        );
        line.insert(
            "target".into(),
            Value::String(event.metadata().target().to_owned()),
        );
        event.record(&mut Fields(&mut line));
        for span in ctx.event_scope().into_iter().flatten() {
            let extensions = span.extensions();
            let Some(fields) = extensions.get::<FormattedFields<N>>() else {
                continue;
            };
            if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields) {
                for (key, value) in fields {
                    line.entry(key).or_insert(value);
                }
            }
        }
        if let Some(span) = ctx.lookup_current() {
            line.insert("span".into(), Value::String(span.name().to_owned()));
        }
        let cx = tracing::Span::current().context();
        let span_context = cx.span().span_context().clone();
        if span_context.is_valid() {
            line.insert(
                "trace_id".into(),
                Value::String(span_context.trace_id().to_string()),
            );
            line.insert(
                "span_id".into(),
                Value::String(span_context.span_id().to_string()),
            );
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// An event's fields as JSON values.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_owned()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logs<S>() -> impl Layer<S> + Send + Sync
    where
        S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_filter(EnvFilter::new(DEFAULT_LOG_FILTER))
    }

    /// Captured log output.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_json_line_carries_the_fields_of_its_spans() {
        let out = Captured::default();
        let writer = out.clone();
        let layer = json_lines(move || writer.clone()).with_filter(EnvFilter::new("warn"));
        let dispatch = subscriber(layer, None::<tracing_subscriber::layer::Identity>);
        tracing::dispatcher::with_default(&dispatch, || {
            let span = tracing::warn_span!(
                "consume",
                consumer = "ledger",
                message_id = tracing::field::Empty
            );
            span.record("message_id", "m-1");
            let _entered = span.enter();
            tracing::warn!(consumer = "event's own", "dead-lettered");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["message_id"], "m-1", "{text}");
        assert_eq!(line["consumer"], "event's own", "{text}");
        assert_eq!(line["span"], "consume", "{text}");
    }

    #[test]
    fn spans_are_made_only_when_something_traces_them() {
        let untraced = subscriber(logs(), None::<tracing_subscriber::layer::Identity>);
        tracing::dispatcher::with_default(&untraced, || {
            let span = tracing::info_span!(target: "worker::relay", "outbox.publish");
            assert!(span.is_disabled(), "nothing traces, yet the span was made");
        });
        drop(untraced);
        let tracer = SdkTracerProvider::builder().build().tracer("test");
        let traced = subscriber(logs(), Some(traces(tracer)));
        tracing::dispatcher::with_default(&traced, || {
            let span = tracing::info_span!(target: "worker::relay", "outbox.publish");
            assert!(
                !span.is_disabled(),
                "traces are wanted, yet the span was not made"
            );
        });
    }
}
