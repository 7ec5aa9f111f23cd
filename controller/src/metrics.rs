//! Prometheus metrics of EC2 calls, with the Go driver's names so
//! existing dashboards keep working, served on `--http-endpoint`.

use std::convert::Infallible;
use std::future::Future;
use std::time::Instant;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder};
use tokio::net::TcpListener;

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

    /// Serves `GET /metrics` (Prometheus text format 0.0.4) over HTTP/1.1
    /// on `listener` with hyper; any other path is 404. Runs until the task
    /// is dropped.
    pub async fn serve(self, listener: TcpListener) {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a metrics connection");
                    continue;
                }
            };
            let metrics = self.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let response = metrics.respond(&request);
                    async move { Ok::<_, Infallible>(response) }
                });
                let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "metrics connection");
                }
            });
        }
    }

    /// The answer to one HTTP request.
    fn respond(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        if request.method() == Method::GET && request.uri().path() == "/metrics" {
            let mut response = Response::new(Full::new(Bytes::from(self.render())));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
            response
        } else {
            let mut response = Response::new(Full::new(Bytes::new()));
            *response.status_mut() = StatusCode::NOT_FOUND;
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A request that arrives in pieces (clients flush as they format) is
    /// still read whole: the answer is the metrics, not a 404 and a reset.
    #[tokio::test]
    async fn answers_a_request_sent_in_pieces() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(ApiMetrics::new().unwrap().serve(listener));
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        for piece in ["GET ", "/metrics HTTP/1.1\r\n", "host: x\r\nconnection: close\r\n\r\n"] {
            stream.write_all(piece.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.contains("content-type: text/plain; version=0.0.4"),
            "{response}"
        );
    }
}
