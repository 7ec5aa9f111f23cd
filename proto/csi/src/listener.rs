//! Where a CSI service listens (`--endpoint`) and serving its connections.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, UnixListener};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::server::Router;

use crate::connection::Connection;
use crate::endpoint::shutdown_signal;

/// A CSI endpoint that is neither a unix socket nor a TCP address.
#[derive(Debug, thiserror::Error)]
#[error("endpoint {0:?} is neither unix:///absolute/path nor tcp://host:port")]
pub struct InvalidEndpoint(pub String);

/// A CSI endpoint, read as the Go driver's `util.ParseEndpoint`
/// (`pkg/util/util.go`) reads `--endpoint`: the scheme in any case, `unix`
/// or `tcp`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix socket's path: `unix:///csi/csi.sock`, `unix:/csi/csi.sock`,
    /// or `unix://csi/csi.sock`, which Go roots at `/` as well.
    Unix(PathBuf),
    /// A TCP address, `host:port` (`tcp://10.0.0.1:10000`); an empty host
    /// (`tcp://:10000`) is every IPv4 address.
    Tcp(String),
}

impl Endpoint {
    /// Parses an `--endpoint` value.
    ///
    /// # Errors
    /// [`InvalidEndpoint`] for another scheme, an empty or relative unix
    /// path, or a TCP address without a port.
    pub fn parse(endpoint: &str) -> Result<Self, InvalidEndpoint> {
        let invalid = || InvalidEndpoint(endpoint.to_owned());
        let (scheme, rest) = endpoint.split_once(':').ok_or_else(invalid)?;
        match scheme.to_ascii_lowercase().as_str() {
            "unix" => {
                let path = match rest.strip_prefix("//") {
                    Some(joined) => format!("/{}", joined.trim_start_matches('/')),
                    None => rest.to_owned(),
                };
                (path.starts_with('/') && path.len() > 1)
                    .then(|| Self::Unix(PathBuf::from(path)))
                    .ok_or_else(invalid)
            }
            "tcp" => {
                let address = rest.strip_prefix("//").ok_or_else(invalid)?;
                let (host, port) = address.rsplit_once(':').ok_or_else(invalid)?;
                port.parse::<u16>().map_err(|_| invalid())?;
                let host = if host.is_empty() { "0.0.0.0" } else { host };
                Ok(Self::Tcp(format!("{host}:{port}")))
            }
            _ => Err(invalid()),
        }
    }
}

/// The socket path of a unix endpoint (the SnapshotMetadata service's,
/// which the external-snapshot-metadata sidecar reaches on a unix socket
/// only).
///
/// # Errors
/// [`InvalidEndpoint`] for anything but a unix endpoint.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, InvalidEndpoint> {
    match Endpoint::parse(endpoint)? {
        Endpoint::Unix(path) => Ok(path),
        Endpoint::Tcp(_) => Err(InvalidEndpoint(endpoint.to_owned())),
    }
}

/// Listens on `socket`, replacing a stale socket file left by an earlier
/// run. The socket is mode 0660: the service's user and group may connect
/// (kubelet and Nomad connect as root; sidecars that run without
/// capabilities connect through the group).
///
/// # Errors
/// The error removing the old file, binding or setting the mode.
pub fn bind(socket: &Path) -> io::Result<UnixListener> {
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o660))?;
    Ok(listener)
}

/// A listening socket of either kind.
pub enum Listener {
    /// On a unix socket.
    Unix(UnixListener),
    /// On a TCP address.
    Tcp(TcpListener),
}

/// Where a service listens.
pub struct Listening {
    /// The listening socket.
    pub listener: Listener,
    /// The socket was passed in (sd_listen_fds(3): by systemd, or by
    /// `systemd-socket-activate` as in the Nomad jobs): its file is not
    /// this process's to remove.
    pub passed: bool,
}

/// The socket passed by socket activation if there is one, otherwise
/// `endpoint` bound here: a unix socket by [`bind`], or a TCP address,
/// the address bound (its port, where the endpoint's is 0) named in a warning — CSI has no authentication of its own, so every
/// peer that reaches the address may call every RPC, as with the Go
/// driver's `tcp://`.
///
/// # Errors
/// The error adopting the passed socket or binding `endpoint`.
pub async fn listen(endpoint: &Endpoint) -> io::Result<Listening> {
    if let Some(passed) = ebs_csi_linux::activation::listener_from_systemd()? {
        passed.set_nonblocking(true)?;
        return Ok(Listening {
            listener: Listener::Unix(UnixListener::from_std(passed)?),
            passed: true,
        });
    }
    let listener = match endpoint {
        Endpoint::Unix(socket) => Listener::Unix(bind(socket)?),
        Endpoint::Tcp(address) => {
            let listener = TcpListener::bind(address).await?;
            tracing::warn!(
                address = %listener.local_addr()?,
                "serving CSI on TCP: CSI has no authentication, so every peer that reaches this address \
                 may call every RPC; keep it on an address only the CO's components reach"
            );
            Listener::Tcp(listener)
        }
    };
    Ok(Listening {
        listener,
        passed: false,
    })
}

/// Serves `router` on `listener` until SIGTERM or SIGINT. Each accepted
/// client's bytes pass through the
/// [`AuthorityFilter`](crate::authority::AuthorityFilter), so any gRPC
/// client is served, whatever `:authority` it sends.
///
/// # Errors
/// The transport's error.
pub async fn serve(router: Router, listener: Listener) -> Result<(), tonic::transport::Error> {
    match listener {
        Listener::Unix(listener) => {
            let incoming = UnixListenerStream::new(listener).map(|accepted| accepted.map(Connection::unix));
            router.serve_with_incoming_shutdown(incoming, shutdown_signal()).await
        }
        Listener::Tcp(listener) => {
            let incoming = TcpListenerStream::new(listener).map(|accepted| accepted.map(Connection::tcp));
            router.serve_with_incoming_shutdown(incoming, shutdown_signal()).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints_as_the_go_driver() {
        let unix = |path: &str| Ok(Endpoint::Unix(PathBuf::from(path)));
        let parsed = |endpoint: &str| Endpoint::parse(endpoint).map_err(|e| e.to_string());
        assert_eq!(parsed("unix:///csi/csi.sock"), unix("/csi/csi.sock"));
        assert_eq!(parsed("unix:/csi/csi.sock"), unix("/csi/csi.sock"));
        assert_eq!(parsed("unix://csi/csi.sock"), unix("/csi/csi.sock"));
        assert_eq!(parsed("UNIX:///csi/csi.sock"), unix("/csi/csi.sock"));
        assert_eq!(
            parsed("tcp://127.0.0.1:10000"),
            Ok(Endpoint::Tcp("127.0.0.1:10000".into()))
        );
        assert_eq!(parsed("tcp://:10000"), Ok(Endpoint::Tcp("0.0.0.0:10000".into())));
        assert_eq!(parsed("tcp://[::1]:10000"), Ok(Endpoint::Tcp("[::1]:10000".into())));
        for bad in [
            "/csi.sock",
            "unix:csi.sock",
            "unix://",
            "tcp://127.0.0.1",
            "tcp:127.0.0.1:1",
            "http://x:1",
        ] {
            assert_eq!(
                parsed(bad),
                Err(format!(
                    "endpoint {bad:?} is neither unix:///absolute/path nor tcp://host:port"
                ))
            );
        }
        assert!(socket_path("tcp://127.0.0.1:1").is_err());
    }

    #[tokio::test]
    async fn binds_over_a_stale_socket_with_mode_0660() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        std::fs::write(&socket, b"stale").unwrap();
        let _listener = bind(&socket).unwrap();
        let metadata = std::fs::metadata(&socket).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_socket(&metadata.file_type()));
        assert_eq!(metadata.permissions().mode() & 0o777, 0o660);
    }
}
