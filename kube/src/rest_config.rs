//! The client's configuration (client-go's `rest.Config`): where the API
//! server is, the CAs its certificate must chain to, and the credentials
//! sent to it, from a kubeconfig ([`super::kubeconfig`]) or the in-cluster
//! configuration.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::KubernetesError;
use super::exec_plugin::{self, ExecPlugin};

/// Where the client finds the API server and its credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiSource {
    /// `--kubeconfig`: that file's current context ([`super::kubeconfig`]).
    Kubeconfig(PathBuf),
    /// The in-cluster configuration, with this service account directory
    /// (`token`, read again at each request as kubelet rotates it, and
    /// `ca.crt`).
    InCluster(PathBuf),
}

impl ApiSource {
    /// Whether there is an API server to ask: a kubeconfig names one; the
    /// in-cluster configuration has one where `KUBERNETES_SERVICE_HOST` is
    /// set (a systemd or Nomad node has none).
    pub fn is_configured(&self) -> bool {
        match self {
            Self::Kubeconfig(_) => true,
            Self::InCluster(_) => std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
        }
    }
}

/// What the client is made of (client-go's `rest.Config`): the API
/// server, the CAs it must chain to, and the credentials.
pub(super) struct RestConfig {
    /// `https://<host>[:<port>]`, without a trailing `/`.
    pub server: String,
    /// The CAs; `None`: the system's roots.
    pub roots: Option<rustls::RootCertStore>,
    /// A client certificate and key for the TLS handshake.
    pub identity: Option<ClientIdentity>,
    /// The bearer token.
    pub token: Token,
}

/// A client certificate chain and its private key.
pub struct ClientIdentity {
    pub(super) chain: Vec<CertificateDer<'static>>,
    pub(super) key: PrivateKeyDer<'static>,
}

/// The bearer token sent with each request.
pub(super) enum Token {
    /// None: a client certificate authenticates, or nothing does.
    None,
    /// The same at each request (a kubeconfig's `token`).
    Fixed(String),
    /// The file's contents, read at each request (the service account's
    /// token; a kubeconfig's `tokenFile`).
    File(PathBuf),
    /// A credential plugin's, obtained again after a 401 (as client-go).
    Exec(ExecPlugin, Mutex<String>),
}

impl Token {
    /// The token to send now.
    pub(super) fn current(&self) -> Result<Option<String>, KubernetesError> {
        match self {
            Self::None => Ok(None),
            Self::Fixed(token) => Ok(Some(token.clone())),
            Self::File(path) => credential(path, |bytes| {
                String::from_utf8(bytes.to_vec())
                    .map(|t| Some(t.trim().to_owned()))
                    .map_err(|e| e.to_string())
            }),
            Self::Exec(_, token) => Ok(Some(token.lock().unwrap_or_else(PoisonError::into_inner).clone())),
        }
    }

    /// After a 401: a credential plugin's new token, if this is one.
    pub(super) async fn renewed(&self) -> Result<Option<String>, KubernetesError> {
        let Self::Exec(plugin, current) = self else {
            return Ok(None);
        };
        let exec_plugin::Credential::Token(token) = plugin.run().await? else {
            return Ok(None);
        };
        *current.lock().unwrap_or_else(PoisonError::into_inner) = token.clone();
        Ok(Some(token))
    }
}

/// client-go's in-cluster configuration, with the service account
/// directory `dir`.
pub(super) fn in_cluster(dir: &Path) -> Result<RestConfig, KubernetesError> {
    let variable = |name: &'static str| std::env::var(name).map_err(|_| KubernetesError::Unset(name));
    let host = variable("KUBERNETES_SERVICE_HOST")?;
    let port = variable("KUBERNETES_SERVICE_PORT")?;
    let host = if host.contains(':') { format!("[{host}]") } else { host };
    let ca = dir.join("ca.crt");
    let roots = credential(&ca, roots)?;
    Ok(RestConfig {
        server: format!("https://{host}:{port}"),
        roots: Some(roots),
        identity: None,
        token: Token::File(dir.join("token")),
    })
}

/// The certificates of a PEM bundle, as trust roots.
pub(super) fn roots(pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(pem) {
        roots
            .add(certificate.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    if roots.is_empty() {
        return Err("no certificate".into());
    }
    Ok(roots)
}

/// The system's trust roots (its CA bundle, as client-go takes them where
/// a kubeconfig names no CA); a certificate that does not parse is left
/// out.
pub(super) fn system_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    roots
}

/// Reads `path` and turns its bytes into a value with `parse`.
fn credential<T>(path: &Path, parse: impl FnOnce(&[u8]) -> Result<T, String>) -> Result<T, KubernetesError> {
    let failed = |message: String| KubernetesError::Credentials {
        path: path.to_owned(),
        message,
    };
    let bytes = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
    parse(&bytes).map_err(failed)
}
