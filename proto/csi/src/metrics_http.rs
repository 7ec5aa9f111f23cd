//! The `/metrics` endpoint both services serve (Prometheus text format
//! 0.0.4 over HTTP/1.1 with hyper, or over TLS with rustls when given a
//! certificate, as the Go driver's `--metrics-cert-file` and
//! `--metrics-key-file`).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The flags of both services that say where and how `/metrics` is
/// served (the Go driver's names).
#[derive(Clone, Debug, clap::Args)]
pub struct MetricsFlags {
    /// Serve Prometheus metrics on this TCP address, e.g. `0.0.0.0:3301`,
    /// or `:3301` (every address, as Go reads it; default: none).
    #[arg(long, value_parser = parse_http_endpoint)]
    pub http_endpoint: Option<SocketAddr>,
    /// Serve metrics over TLS with this PEM certificate (the server's,
    /// then any intermediates).
    #[arg(long, requires_all = ["metrics_key_file", "http_endpoint"])]
    pub metrics_cert_file: Option<PathBuf>,
    /// The PEM private key (PKCS#8, PKCS#1 or SEC1) of `--metrics-cert-file`.
    #[arg(long, requires = "metrics_cert_file")]
    pub metrics_key_file: Option<PathBuf>,
}

/// `--http-endpoint`'s address: `host:port` with an IP address, or
/// `:port`, every address of the host, IPv6 and IPv4 (`[::]`, as Go's
/// `net.Listen` reads an empty host; the Go driver's docs give `:8080`).
fn parse_http_endpoint(text: &str) -> Result<SocketAddr, String> {
    let address = match text.strip_prefix(':') {
        Some(port) => format!("[::]:{port}"),
        None => text.to_owned(),
    };
    address
        .parse()
        .map_err(|_| format!("{text:?} is not an address such as 0.0.0.0:3301 or :3301"))
}

/// Why `/metrics` could not be served.
#[derive(Debug, thiserror::Error)]
pub enum MetricsHttpError {
    /// Binding the address failed.
    #[error("binding {0}: {1}")]
    Bind(SocketAddr, io::Error),
    /// A PEM file could not be read or held no certificate or key.
    #[error("{0}: {1}")]
    Pem(PathBuf, rustls::pki_types::pem::Error),
    /// rustls refused the certificate and key (e.g. they do not match).
    #[error("TLS certificate and key: {0}")]
    Tls(#[from] rustls::Error),
}

/// Binds `--http-endpoint`, if given, and serves `/metrics` there on a
/// task of its own ([`serve`]), over TLS when a certificate is given.
///
/// # Errors
/// [`MetricsHttpError`]: the address cannot be bound, or the certificate or
/// key cannot be read or used.
pub async fn start<F, R>(flags: &MetricsFlags, render: F) -> Result<(), MetricsHttpError>
where
    F: Fn() -> R + Clone + Send + Sync + 'static,
    R: Future<Output = String> + Send + 'static,
{
    let Some(address) = flags.http_endpoint else {
        return Ok(());
    };
    let acceptor = match (&flags.metrics_cert_file, &flags.metrics_key_file) {
        (Some(cert), Some(key)) => Some(acceptor(cert, key)?),
        _ => None,
    };
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| MetricsHttpError::Bind(address, e))?;
    let bound = listener.local_addr().map_err(|e| MetricsHttpError::Bind(address, e))?;
    tracing::info!(address = %bound, tls = acceptor.is_some(), "serving metrics");
    tokio::spawn(serve(listener, acceptor, render));
    Ok(())
}

/// A TLS acceptor for the certificate chain and key in these PEM files,
/// with rustls's safe default protocol versions and no client
/// authentication.
fn acceptor(cert_file: &Path, key_file: &Path) -> Result<TlsAcceptor, MetricsHttpError> {
    let pem = |path: &Path, e| MetricsHttpError::Pem(path.to_owned(), e);
    let certs = CertificateDer::pem_file_iter(cert_file)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| pem(cert_file, e))?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| pem(key_file, e))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `GET /metrics` on `listener` (through `tls` when given),
/// answering with what `render` produces for each request; any other
/// method or path is 404. Runs until the task is dropped.
pub async fn serve<F, R>(listener: TcpListener, tls: Option<TlsAcceptor>, render: F)
where
    F: Fn() -> R + Clone + Send + Sync + 'static,
    R: Future<Output = String> + Send + 'static,
{
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a metrics connection");
                continue;
            }
        };
        let render = render.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => answer(stream, render).await,
                Some(tls) => match tls.accept(stream).await {
                    Ok(stream) => answer(stream, render).await,
                    Err(e) => tracing::debug!(error = %e, "metrics TLS handshake"),
                },
            }
        });
    }
}

/// Answers the HTTP/1.1 requests of one connection.
async fn answer<S, F, R>(stream: S, render: F)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn() -> R + Clone + Send + Sync + 'static,
    R: Future<Output = String> + Send + 'static,
{
    let service = service_fn(move |request: Request<Incoming>| {
        let wanted = request.method() == Method::GET && request.uri().path() == "/metrics";
        let body = wanted.then(&render);
        async move {
            let response = match body {
                Some(body) => metrics(body.await),
                None => not_found(),
            };
            Ok::<_, Infallible>(response)
        }
    });
    let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    if let Err(e) = connection.await {
        tracing::debug!(error = %e, "metrics connection");
    }
}

/// `body` and the counters every service has (the rewritten `:authority`
/// headers of [`crate::authority`]), in Prometheus' text format.
fn metrics(mut body: String) -> Response<Full<Bytes>> {
    body.push_str(&format!(
        "# HELP ebs_csi_grpc_authority_rewritten_total gRPC requests whose :authority was a socket path, served as localhost.\n\
         # TYPE ebs_csi_grpc_authority_rewritten_total counter\n\
         ebs_csi_grpc_authority_rewritten_total {}\n",
        crate::authority::rewritten_total()
    ));
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    response
}

fn not_found() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a failed step fails the test")]

    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn exchange(pieces: &[&str]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, None, || async { "up 1\n".to_owned() }));
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        for piece in pieces {
            stream.write_all(piece.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    /// The Go driver's spellings of the address: an IP and port, or a port
    /// alone for every address.
    #[test]
    fn http_endpoints_as_go_reads_them() {
        assert_eq!(
            parse_http_endpoint("0.0.0.0:3301").unwrap(),
            "0.0.0.0:3301".parse().unwrap()
        );
        assert_eq!(parse_http_endpoint(":8080").unwrap(), "[::]:8080".parse().unwrap());
        assert_eq!(
            parse_http_endpoint("metrics:80").unwrap_err(),
            "\"metrics:80\" is not an address such as 0.0.0.0:3301 or :3301"
        );
    }

    /// A request that arrives in pieces (clients flush as they format) is
    /// still read whole: the answer is the metrics, not a 404 and a reset.
    #[tokio::test]
    async fn answers_a_request_sent_in_pieces() {
        let response = exchange(&["GET ", "/metrics HTTP/1.1\r\n", "host: x\r\nconnection: close\r\n\r\n"]).await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.contains("content-type: text/plain; version=0.0.4"),
            "{response}"
        );
        assert!(response.contains("\r\n\r\nup 1\n"), "{response}");
        assert!(
            response.contains("\nebs_csi_grpc_authority_rewritten_total "),
            "the counter every service has: {response}"
        );
    }

    #[tokio::test]
    async fn any_other_path_is_not_found() {
        let response = exchange(&["GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"]).await;
        assert!(response.starts_with("HTTP/1.1 404 Not Found\r\n"), "{response}");
    }
}
