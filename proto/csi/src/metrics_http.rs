//! The `/metrics` endpoint both services serve (Prometheus text format
//! 0.0.4 over HTTP/1.1, with hyper).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Binds `address` (a service's `--http-endpoint`) and serves `/metrics`
/// there on a task of its own ([`serve`]).
///
/// # Errors
/// The error binding `address`.
pub async fn start<F, R>(address: SocketAddr, render: F) -> io::Result<()>
where
    F: Fn() -> R + Clone + Send + Sync + 'static,
    R: Future<Output = String> + Send + 'static,
{
    let listener = TcpListener::bind(address).await?;
    tracing::info!(address = %listener.local_addr()?, "serving metrics");
    tokio::spawn(serve(listener, render));
    Ok(())
}

/// Serves `GET /metrics` on `listener`, answering with what `render`
/// produces for each request; any other method or path is 404. Runs until
/// the task is dropped.
pub async fn serve<F, R>(listener: TcpListener, render: F)
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
        tokio::spawn(async move {
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
        });
    }
}

fn metrics(body: String) -> Response<Full<Bytes>> {
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
        tokio::spawn(serve(listener, || async { "up 1\n".to_owned() }));
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        for piece in pieces {
            stream.write_all(piece.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
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
        assert!(response.ends_with("\r\n\r\nup 1\n"), "{response}");
    }

    #[tokio::test]
    async fn any_other_path_is_not_found() {
        let response = exchange(&["GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"]).await;
        assert!(response.starts_with("HTTP/1.1 404 Not Found\r\n"), "{response}");
    }
}
