//! Serving a CSI endpoint: what both gRPC binaries share.

use std::io;
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::DRIVER_NAME;
use crate::v1::plugin_capability::{self, service};
use crate::v1::{GetPluginCapabilitiesResponse, GetPluginInfoResponse, PluginCapability};

/// A CSI endpoint that is not a unix socket path.
#[derive(Debug, thiserror::Error)]
#[error("endpoint {0:?} is not unix:///absolute/path")]
pub struct InvalidEndpoint(pub String);

/// The socket path of a CSI endpoint such as `unix:///csi/csi.sock` (also
/// `unix:/csi/csi.sock`).
///
/// # Errors
/// [`InvalidEndpoint`] for anything but an absolute unix path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, InvalidEndpoint> {
    endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .filter(|p| p.starts_with('/'))
        .map(PathBuf::from)
        .ok_or_else(|| InvalidEndpoint(endpoint.to_owned()))
}

/// Listens on `socket`, replacing a stale socket file left by an earlier
/// run.
///
/// # Errors
/// The error removing the old file or binding.
pub fn bind(socket: &Path) -> io::Result<UnixListenerStream> {
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    Ok(UnixListenerStream::new(UnixListener::bind(socket)?))
}

/// Completes on SIGTERM or SIGINT (never, if the handlers cannot be set).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down");
}

/// GetPluginInfo's answer: the driver name and `version`.
pub fn plugin_info(version: &str) -> GetPluginInfoResponse {
    GetPluginInfoResponse {
        name: DRIVER_NAME.to_owned(),
        vendor_version: version.to_owned(),
        manifest: Default::default(),
    }
}

/// GetPluginCapabilities' answer: the given plugin services.
pub fn plugin_capabilities(services: &[service::Type]) -> GetPluginCapabilitiesResponse {
    GetPluginCapabilitiesResponse {
        capabilities: services
            .iter()
            .map(|kind| PluginCapability {
                r#type: Some(plugin_capability::Type::Service(plugin_capability::Service {
                    r#type: *kind as i32,
                })),
            })
            .collect(),
    }
}

/// Logs to stderr at `info`, or as `RUST_LOG` says.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unix_endpoints() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        for bad in ["tcp://127.0.0.1:1", "unix://relative", "/csi.sock"] {
            assert!(socket_path(bad).is_err(), "{bad}");
        }
    }
}
