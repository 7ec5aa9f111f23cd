//! The one log line of a CSI RPC, the same for both services.

use std::future::Future;
use std::time::Instant;

use tonic::{Response, Status};

/// Runs one RPC and logs its outcome: every failure at warn, with its gRPC
/// code and cause; a `mutating` RPC that succeeds once at info, any other
/// at debug (`-v 4`: the Go driver logs each of its RPCs at klog's V(4),
/// `pkg/driver/node.go` and `controller.go`, "…: called"). All carry
/// `subject` (the volume id, or a new volume's or snapshot's name) and the
/// latency in milliseconds (to the microsecond). Request strings are
/// logged escaped (`Debug`); nothing else of the request is logged, so its
/// secrets never are. The RPC's span ([`crate::telemetry::rpc_span`])
/// gets its outcome.
///
/// # Errors
/// The call's error, as its gRPC status.
pub async fn observed<T, E: Into<Status>>(
    rpc: &'static str,
    subject: &str,
    mutating: bool,
    call: impl Future<Output = Result<T, E>>,
) -> Result<Response<T>, Status> {
    let started = Instant::now();
    let result = call.await.map_err(Into::into);
    // Milliseconds to the microsecond, a number in the JSON format too.
    let latency_ms = (started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
    crate::telemetry::record_outcome(result.as_ref().map(|_| ()));
    match &result {
        Err(status) => {
            tracing::warn!(rpc, ?subject, code = ?status.code(), cause = ?status.message(), latency_ms, "failed");
        }
        Ok(_) if mutating => tracing::info!(rpc, ?subject, latency_ms, "done"),
        Ok(_) => tracing::debug!(rpc, ?subject, latency_ms, "done"),
    }
    result.map(Response::new)
}
