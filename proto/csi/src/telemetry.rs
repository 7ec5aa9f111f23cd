//! OpenTelemetry tracing, the Go driver's `--enable-otel-tracing`: a span
//! for each CSI RPC served and each call made on its behalf (EC2 and EBS
//! by the controller, the helper by the agent), exported by OTLP over gRPC
//! to the collector the standard variables name (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//! default `http://localhost:4317`, and the rest of the OTLP exporter
//! specification's `OTEL_EXPORTER_OTLP_*`), with the resource of
//! `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` and the sampler of
//! `OTEL_TRACES_SAMPLER` (default: the parent's decision, else sampled) —
//! as the Go driver's `pkg/driver/tracing.go` (`otlptracegrpc`,
//! `resource.WithFromEnv`), whose chart sets the first two (`otelTracing`).
//!
//! Spans are `tracing` spans of one target, [`SPANS`]: the log lines never
//! show them, and without the flag no layer enables them, so they cost an
//! atomic load.

use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider;
use opentelemetry_otlp::WithTonicConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::Registry;
use tracing_subscriber::filter::Targets;

/// The target of every exported span.
pub const SPANS: &str = "ebs_csi_spans";

/// How long spans not yet sent may take to reach the collector at exit
/// (the Go driver's `exporter.Shutdown` deadline, `cmd/main.go`).
const FLUSH_AT_EXIT: Duration = Duration::from_secs(10);

/// The flag of both services that turns tracing on (the Go driver's name).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TracingFlags {
    /// Export OpenTelemetry spans of every CSI RPC and of the calls it
    /// makes, by OTLP/gRPC to OTEL_EXPORTER_OTLP_ENDPOINT
    /// (`--enable-otel-tracing` or `=true`).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set)]
    pub enable_otel_tracing: bool,
}

/// Spans on their way to the collector: the SDK's provider, whose batch
/// processor sends them from a thread of its own.
pub struct SpanExport {
    provider: SdkTracerProvider,
}

impl SpanExport {
    /// The exporter `flags` ask for, or none. Call it in the tokio runtime
    /// (the gRPC channel's tasks run on it). The collector is reached
    /// lazily: one that is down loses spans, never a start.
    ///
    /// # Errors
    /// The OTLP variables' error (an endpoint that is not a URI, a header
    /// that does not parse).
    pub fn start(flags: &TracingFlags) -> Result<Option<Self>, opentelemetry_otlp::ExporterBuildError> {
        if !flags.enable_otel_tracing {
            return Ok(None);
        }
        // An https:// collector is verified against the system's roots,
        // as EC2 is; an http:// one is reached in clear text.
        let tls = opentelemetry_otlp::tonic_types::transport::ClientTlsConfig::new().with_native_roots();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_tls_config(tls)
            .build()?;
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).build();
        Ok(Some(Self { provider }))
    }

    /// The subscriber's first layer, that turns the spans of [`SPANS`]
    /// into OpenTelemetry spans for this export.
    pub fn layer(&self) -> impl Layer<Registry> + use<> {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("ebs-csi"))
            .with_filter(Targets::new().with_target(SPANS, tracing::Level::INFO))
    }

    /// Sends the spans not yet sent, waiting up to 10 s (on the blocking
    /// pool: the runtime's workers carry the gRPC channel meanwhile); an
    /// error is logged, as nothing else can be done at exit.
    pub async fn flush_at_exit(self) {
        let provider = self.provider;
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_AT_EXIT))
            .await
            .map_err(|e| e.to_string())
            .and_then(|shutdown| shutdown.map_err(|e| e.to_string()));
        if let Err(error) = flushed {
            tracing::warn!(error, "OpenTelemetry spans were not all exported");
        }
    }
}

/// The server span of one gRPC request, for tonic's `Server::trace_fn`:
/// named `package.Service/Method` with the `rpc.*` attributes of
/// OpenTelemetry's gRPC conventions, the child of the caller's span when
/// the request carries W3C Trace Context (`traceparent`, as kubelet's CSI
/// client sends with its tracing on). [`record_outcome`] completes it.
pub fn rpc_span(request: &http::Request<()>) -> tracing::Span {
    let path = request.uri().path().trim_start_matches('/');
    let (service, method) = path.split_once('/').unwrap_or((path, ""));
    let span = tracing::info_span!(
        target: SPANS,
        "rpc",
        otel.name = path,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&Headers(request.headers()));
    // Fails only for a span no layer records (tracing off).
    let _ = span.set_parent(parent);
    span
}

/// Records an RPC's gRPC status code on the current [`rpc_span`], and a
/// failure's message as the span's error ([`record_error`]).
pub fn record_outcome(outcome: Result<(), &tonic::Status>) {
    let span = tracing::Span::current();
    let code = outcome.err().map_or(tonic::Code::Ok, tonic::Status::code);
    span.record("rpc.grpc.status_code", code as i32);
    if let Err(status) = outcome {
        record_error(&span, status.message());
    }
}

/// Marks `span` (an [`rpc_span`] or a [`call_span`]) failed, `why`.
pub fn record_error(span: &tracing::Span, why: &str) {
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", why);
}

/// The client span of one call of `service`'s `method` by `system`'s
/// protocol (`aws-api` for EC2's and EBS's, as OpenTelemetry's AWS SDK
/// conventions name them, and the span `Service.Method`), a child of the
/// current span.
pub fn call_span(system: &'static str, service: &'static str, method: &'static str) -> tracing::Span {
    let name = format!("{service}.{method}");
    tracing::info_span!(
        target: SPANS,
        "call",
        otel.name = name.as_str(),
        otel.kind = "client",
        rpc.system = system,
        rpc.service = service,
        rpc.method = method,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
}

/// A request's HTTP/2 headers, as Trace Context's extractor reads them.
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}
