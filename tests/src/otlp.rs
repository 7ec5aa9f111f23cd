//! An OTLP/gRPC collector of the tests: the OpenTelemetry project's own
//! trace service (`opentelemetry.proto.collector.trace.v1.TraceService`,
//! from the `opentelemetry-proto` crate) on an ephemeral port of
//! 127.0.0.1, keeping every span it is sent, as a collector receives them
//! from `--enable-otel-tracing`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tokio::sync::oneshot;

/// A caller's W3C Trace Context (the Trace Context specification's
/// example): trace `0af7651916cd43dd8448eb211c80319c`, parent span
/// `b7ad6b7169203331`, sampled.
pub const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// `SPAN_KIND_SERVER` (opentelemetry-proto's `trace.proto`).
pub const SPAN_KIND_SERVER: i32 = 2;

/// `SPAN_KIND_CLIENT`.
pub const SPAN_KIND_CLIENT: i32 = 3;

/// `STATUS_CODE_ERROR`.
pub const STATUS_CODE_ERROR: i32 = 2;

/// One span received, with its resource's `service.name`.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    /// The span's name.
    pub name: String,
    /// The trace id, 32 hex digits.
    pub trace_id: String,
    /// The span id, 16 hex digits.
    pub span_id: String,
    /// The parent's span id, 16 hex digits, or empty for a root span.
    pub parent_span_id: String,
    /// [`SPAN_KIND_SERVER`], [`SPAN_KIND_CLIENT`], …
    pub kind: i32,
    /// The attributes, each value as text.
    pub attributes: BTreeMap<String, String>,
    /// `STATUS_CODE_UNSET` 0, `STATUS_CODE_OK` 1, [`STATUS_CODE_ERROR`].
    pub status_code: i32,
    /// The status's message.
    pub status_message: String,
    /// The `service.name` of the resource that sent it.
    pub service_name: String,
}

/// The collector, serving until dropped.
pub struct OtlpCollector {
    /// `http://127.0.0.1:<port>`, as `OTEL_EXPORTER_OTLP_ENDPOINT` names it.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    _stop: oneshot::Sender<()>,
}

impl OtlpCollector {
    /// Starts the collector on the current tokio runtime.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the collector");
        let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
        let spans = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = oneshot::channel();
        let service = TraceServiceServer::new(Receiver(Arc::clone(&spans)));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        Self {
            endpoint,
            spans,
            _stop: stop,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().expect("spans").clone()
    }

    /// The one span named `name`.
    ///
    /// # Panics
    /// If there is none or more than one, naming every span received.
    pub fn span(&self, name: &str) -> ReceivedSpan {
        let spans = self.spans();
        let named: Vec<&ReceivedSpan> = spans.iter().filter(|span| span.name == name).collect();
        match named[..] {
            [span] => span.clone(),
            _ => panic!("{} spans named {name} in {spans:#?}", named.len()),
        }
    }
}

struct Receiver(Arc<Mutex<Vec<ReceivedSpan>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = self.0.lock().expect("spans");
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans
                .resource
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            let service_name = resource.get("service.name").cloned().unwrap_or_default();
            for span in resource_spans.scope_spans.into_iter().flat_map(|scope| scope.spans) {
                let status = span.status.unwrap_or_default();
                received.push(ReceivedSpan {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind,
                    attributes: attributes(&span.attributes),
                    status_code: status.code,
                    status_message: status.message,
                    service_name: service_name.clone(),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attributes(pairs: &[KeyValue]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|pair| {
            let value = match pair.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(text)) => text.clone(),
                Some(Value::IntValue(number)) => number.to_string(),
                Some(Value::BoolValue(flag)) => flag.to_string(),
                Some(Value::DoubleValue(number)) => number.to_string(),
                other => format!("{other:?}"),
            };
            (pair.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
