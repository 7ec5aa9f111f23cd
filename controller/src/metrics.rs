//! Prometheus metrics of EC2 calls, with the Go driver's names so
//! existing dashboards keep working, served on `--http-endpoint`.

use std::future::Future;
use std::time::Instant;

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder};

use crate::ec2::Ec2Error;

/// Per-API duration, errors and throttles.
#[derive(Clone, Debug)]
pub struct ApiMetrics {
    registry: Registry,
    duration: HistogramVec,
    errors: IntCounterVec,
    throttles: IntCounterVec,
}

impl ApiMetrics {
    /// Registers the three metric families in a new registry.
    ///
    /// # Errors
    /// A registration error (never for these fixed names).
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "aws_ebs_csi_api_request_duration_seconds",
                "EC2 API request duration in seconds",
            ),
            &["request"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new("aws_ebs_csi_api_request_errors_total", "EC2 API request errors"),
            &["request", "error"],
        )?;
        let throttles = IntCounterVec::new(
            Opts::new("aws_ebs_csi_api_request_throttles_total", "EC2 API requests throttled"),
            &["request"],
        )?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(throttles.clone()))?;
        Ok(Self {
            registry,
            duration,
            errors,
            throttles,
        })
    }

    /// Runs one EC2 call, recording its duration and its outcome.
    pub async fn observe<T>(
        &self,
        request: &'static str,
        call: impl Future<Output = Result<T, Ec2Error>>,
    ) -> Result<T, Ec2Error> {
        let start = Instant::now();
        let result = call.await;
        self.duration
            .with_label_values(&[request])
            .observe(start.elapsed().as_secs_f64());
        if let Err(error) = &result {
            let kind = match error {
                Ec2Error::NotFound(_) => "NotFound",
                Ec2Error::IdempotentParameterMismatch(_) => "IdempotentParameterMismatch",
                Ec2Error::IncorrectState(_) => "IncorrectState",
                Ec2Error::DeviceNameRefused(_) => "InvalidParameterValue",
                Ec2Error::AttachmentLimitExceeded(_) => "AttachmentLimitExceeded",
                Ec2Error::QuotaExceeded(_) => "QuotaExceeded",
                Ec2Error::InvalidParameter(_) => "InvalidParameter",
                Ec2Error::Throttled(_) => "RequestLimitExceeded",
                Ec2Error::Transport(_) => "Transport",
                Ec2Error::Service { .. } => "ServiceError",
            };
            self.errors.with_label_values(&[request, kind]).inc();
            if matches!(error, Ec2Error::Throttled(_)) {
                self.throttles.with_label_values(&[request]).inc();
            }
        }
        result
    }

    /// The metrics in Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}
