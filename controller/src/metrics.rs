//! Prometheus metrics of EC2 calls, with the Go driver's names and labels
//! (`pkg/metrics` and `pkg/cloud/handlers.go` there) so existing dashboards
//! and alerts keep working, served on `--http-endpoint`.

mod detach;

use std::future::Future;
use std::time::Instant;

use aws_sdk_ec2::config::interceptors::FinalizerInterceptorContextRef;
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime::client::retries::classifiers::run_classifiers_on_ctx;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::retries::classifiers::{RetryAction, RetryReason};
use aws_smithy_types::retry::ErrorKind;
use ebs_csi_proto::telemetry;
use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder};
use tracing::Instrument;

pub use self::detach::DetachPending;
use crate::ec2::Ec2Error;

/// An EC2 call that failed: EC2's error code, for the `code` label, and the
/// error the service acts on.
#[derive(Debug)]
pub struct Failure {
    /// EC2's error code (EC2 API Reference, "Error codes"), or, where EC2
    /// sent none, `Transport` or the kind of the error.
    pub code: String,
    /// The classified error.
    pub error: Ec2Error,
}

/// A failure the client found itself (EC2 sent no error): its code is the
/// service code it carries, else `Transport`.
impl From<Ec2Error> for Failure {
    fn from(error: Ec2Error) -> Self {
        let code = match &error {
            Ec2Error::Service { code, .. } => code.clone(),
            _ => "Transport".to_owned(),
        };
        Self { code, error }
    }
}

/// The names and help texts of one set of the per-API series: the Go
/// driver's (`pkg/metrics/constants.go`), current or deprecated.
struct Names {
    duration: &'static str,
    errors: &'static str,
    throttles: &'static str,
    /// Appended to each help text.
    help: &'static str,
}

const CURRENT: Names = Names {
    duration: "aws_ebs_csi_api_request_duration_seconds",
    errors: "aws_ebs_csi_api_request_errors_total",
    throttles: "aws_ebs_csi_api_request_throttles_total",
    help: "",
};

/// The Kubernetes in-tree cloud provider's names, which the Go driver
/// serves beside its own with `--deprecated-metrics`.
const DEPRECATED: Names = Names {
    duration: "cloudprovider_aws_api_request_duration_seconds",
    errors: "cloudprovider_aws_api_request_errors",
    throttles: "cloudprovider_aws_api_throttled_requests_total",
    help: " (deprecated)",
};

/// One set of the per-API series.
#[derive(Clone, Debug)]
struct Series {
    duration: HistogramVec,
    errors: IntCounterVec,
    throttles: IntCounterVec,
}

impl Series {
    /// The series `names` gives, registered in `registry`.
    fn register(registry: &Registry, names: &Names) -> prometheus::Result<Self> {
        let help = |text: &str| format!("{text}{}", names.help);
        let series = Self {
            duration: HistogramVec::new(
                HistogramOpts::new(names.duration, help("Duration by request type in seconds")),
                &["request"],
            )?,
            errors: IntCounterVec::new(
                Opts::new(
                    names.errors,
                    help("Total number of errors by error code and request type"),
                ),
                &["request", "code"],
            )?,
            throttles: IntCounterVec::new(
                Opts::new(
                    names.throttles,
                    help("Total number of throttled requests per request type"),
                ),
                &["operation_name"],
            )?,
        };
        registry.register(Box::new(series.duration.clone()))?;
        registry.register(Box::new(series.errors.clone()))?;
        registry.register(Box::new(series.throttles.clone()))?;
        Ok(series)
    }
}

/// Per-API duration, errors and throttles, and the detachments that take
/// long.
#[derive(Clone, Debug)]
pub struct ApiMetrics {
    /// The service called, its spans' `rpc.service` (`EC2`, `EBS`).
    service: &'static str,
    registry: Registry,
    /// The current series, then the deprecated ones if asked for.
    series: Vec<Series>,
    detach_pending: DetachPending,
}

impl ApiMetrics {
    /// Registers the metric families in a new registry:
    /// `aws_ebs_csi_api_request_duration_seconds{request}` (successful calls
    /// only, as the Go driver), `aws_ebs_csi_api_request_errors_total{request,
    /// code}` (calls that failed after the SDK's retries),
    /// `aws_ebs_csi_api_request_throttles_total{operation_name}` (every
    /// throttled attempt, retried or not) and
    /// `aws_ebs_csi_ec2_detach_pending_seconds_total` ([`DetachPending`]);
    /// with `deprecated` (the Go driver's `--deprecated-metrics`), the same
    /// points also as `cloudprovider_aws_api_request_duration_seconds`,
    /// `cloudprovider_aws_api_request_errors` and
    /// `cloudprovider_aws_api_throttled_requests_total` (`pkg/cloud/handlers.go`
    /// there).
    ///
    /// # Errors
    /// A registration error (never for these fixed names).
    pub fn new(deprecated: bool) -> prometheus::Result<Self> {
        let registry = Registry::new();
        let names: &[&Names] = if deprecated {
            &[&CURRENT, &DEPRECATED]
        } else {
            &[&CURRENT]
        };
        let series = names
            .iter()
            .map(|names| Series::register(&registry, names))
            .collect::<prometheus::Result<_>>()?;
        let detach_pending = DetachPending::default();
        registry.register(Box::new(detach_pending.clone()))?;
        Ok(Self {
            service: "EC2",
            registry,
            series,
            detach_pending,
        })
    }

    /// The same metrics, for the calls of another service (`EBS`, the
    /// EBS direct APIs): its name goes in their spans.
    pub fn of_service(&self, service: &'static str) -> Self {
        Self {
            service,
            ..self.clone()
        }
    }

    /// Runs one EC2 call (all its attempts), recording its duration if it
    /// succeeds and its error code if it fails, in its span
    /// ([`telemetry::call_span`], `EC2.CreateVolume`) too.
    pub async fn observe<T>(
        &self,
        request: &'static str,
        call: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Ec2Error> {
        let start = Instant::now();
        let span = telemetry::call_span("aws-api", self.service, request);
        match call.instrument(span.clone()).await {
            Ok(out) => {
                let seconds = start.elapsed().as_secs_f64();
                for series in &self.series {
                    series.duration.with_label_values(&[request]).observe(seconds);
                }
                Ok(out)
            }
            Err(Failure { code, error }) => {
                telemetry::record_error(&span, code.as_str());
                for series in &self.series {
                    series.errors.with_label_values(&[request, code.as_str()]).inc();
                }
                Err(error)
            }
        }
    }

    /// An SDK interceptor that counts each throttled attempt by operation,
    /// as the SDK's own retry classifiers judge it.
    pub fn throttle_counter(&self) -> ThrottleCounter {
        ThrottleCounter(self.series.iter().map(|series| series.throttles.clone()).collect())
    }

    /// The tracker of detachments that take long, rendered with these
    /// metrics.
    pub fn detach_pending(&self) -> DetachPending {
        self.detach_pending.clone()
    }

    /// The metrics in Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// Counts `aws_ebs_csi_api_request_throttles_total{operation_name}` (and
/// its deprecated name, if served) after every attempt, where the Go
/// driver's middleware does.
#[derive(Debug)]
pub struct ThrottleCounter(Vec<IntCounterVec>);

impl Intercept for ThrottleCounter {
    fn name(&self) -> &'static str {
        "ThrottleCounter"
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let verdict = run_classifiers_on_ctx(runtime_components.retry_classifiers(), context.inner());
        if let RetryAction::RetryIndicated(RetryReason::RetryableError {
            kind: ErrorKind::ThrottlingError,
            ..
        }) = verdict
        {
            let operation = cfg.load::<Metadata>().map_or("unknown", Metadata::name);
            for throttles in &self.0 {
                throttles.with_label_values(&[operation]).inc();
            }
        }
        Ok(())
    }
}
