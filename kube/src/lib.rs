//! The Kubernetes API client the agent and the controller share, configured
//! as the Go driver's client is (`clientcmd.BuildConfigFromFlags("",
//! kubeconfig)`, [`ApiSource`]): the kubeconfig file `--kubeconfig` names
//! ([`kubeconfig`]), else client-go's in-cluster configuration — the API
//! server at `KUBERNETES_SERVICE_HOST`:`KUBERNETES_SERVICE_PORT`, the bearer
//! token and CA bundle from the service account directory. Requests and
//! answers are JSON (Kubernetes API reference, "API Concepts").
//!
//! [`NodeApi`] is one node's view: its Node object (the name in
//! `CSI_NODE_NAME`, the Go driver's variable, set from the downward API's
//! `spec.nodeName`) and the VolumeAttachments.

mod exec_plugin;
mod kubeconfig;
mod rest_config;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http_body_util::{BodyExt, Full, Limited};
pub use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Deserialize;

pub use self::rest_config::ApiSource;
use self::rest_config::{Token, in_cluster, system_roots};

/// How long the whole request may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (bytes): a Node object is a few KiB, a page of
/// a list ([`LIST_PAGE`] objects) a few MiB at most.
const MAX_BODY: usize = 16 << 20;
/// How many objects one request of a list asks for (`limit`; the API
/// server then gives a `continue` token for the next page).
pub const LIST_PAGE: usize = 100;

/// Why a request to the API server failed, or what it answered is not
/// usable.
#[derive(Debug, thiserror::Error)]
pub enum KubernetesError {
    /// A variable of the in-cluster configuration is not set.
    #[error("{0} is not set")]
    Unset(&'static str),
    /// The kubeconfig file cannot be read or used.
    #[error("kubeconfig {}: {message}", path.display())]
    Kubeconfig {
        /// The file (`--kubeconfig`).
        path: PathBuf,
        /// What cannot be read or used, and why.
        message: String,
    },
    /// The kubeconfig's credential plugin gave no credential.
    #[error("credential plugin {}: {message}", command.display())]
    Exec {
        /// The plugin's command.
        command: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// `CSI_NODE_NAME` is not a Node name (RFC 1123 subdomain).
    #[error("CSI_NODE_NAME {0:?} is not a Node name")]
    NodeName(String),
    /// The token or CA bundle could not be read.
    #[error("reading {path}: {message}")]
    Credentials {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The TLS configuration was refused.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The request could not be built (an unusable host or port).
    #[error("the API server address: {0}")]
    Address(#[from] http::Error),
    /// The API server could not be reached or did not answer in time.
    #[error("{method} {uri}: {message}")]
    Request {
        /// The request's method.
        method: Method,
        /// The request's URI.
        uri: String,
        /// What went wrong.
        message: String,
    },
    /// The API server refused (its `Status` message).
    #[error("{method} {uri}: {code}: {message}")]
    Refused {
        /// The request's method.
        method: Method,
        /// The request's URI.
        uri: String,
        /// The HTTP status code.
        code: u16,
        /// The Status object's `message`.
        message: String,
    },
    /// The answer is not the object asked for.
    #[error("the answer: {0}")]
    Body(#[from] serde_json::Error),
    /// `spec.providerID` names no EC2 instance.
    #[error("spec.providerID {0:?} names no EC2 instance")]
    ProviderId(String),
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    message: String,
}

/// A client of the API server.
pub struct ApiClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// `https://<host>[:<port>]`.
    server: String,
    token: Token,
}

impl ApiClient {
    /// The client configured from `source` (a kubeconfig's credential
    /// plugin is run here).
    ///
    /// # Errors
    /// A variable unset, a kubeconfig that cannot be used, unreadable
    /// credentials, or a TLS configuration refused.
    pub async fn connect(source: &ApiSource) -> Result<Self, KubernetesError> {
        let config = match source {
            ApiSource::Kubeconfig(path) => kubeconfig::load(path).await?,
            ApiSource::InCluster(dir) => in_cluster(dir)?,
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions()?;
        let tls = match config.roots {
            Some(roots) => tls.with_root_certificates(roots),
            None => tls.with_root_certificates(system_roots()),
        };
        let tls = match config.identity {
            Some(identity) => tls.with_client_auth_cert(identity.chain, identity.key)?,
            None => tls.with_no_client_auth(),
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .build();
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            server: config.server,
            token: config.token,
        })
    }

    /// GETs `path` (`/api/v1/nodes/<name>`, …): the object, as JSON.
    ///
    /// # Errors
    /// The API server unreachable or refusing (404 when it is not there).
    pub async fn get(&self, path: &str) -> Result<Bytes, KubernetesError> {
        self.send(Method::GET, path, None).await
    }

    /// Every item of the list at `path` (`/api/v1/nodes`, …, with a query
    /// such as a `labelSelector` or not), read
    /// [`LIST_PAGE`] at a time with the `continue` token of each page
    /// ("API Concepts", retrieving large results in chunks), each item as
    /// JSON.
    ///
    /// # Errors
    /// The API server unreachable or refusing (403 without RBAC's `list`),
    /// or an answer that is not a list.
    pub async fn list(&self, path: &str) -> Result<Vec<serde_json::Value>, KubernetesError> {
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            items: Vec<serde_json::Value>,
            #[serde(default)]
            metadata: ListMeta,
        }
        #[derive(Default, Deserialize)]
        struct ListMeta {
            #[serde(rename = "continue", default)]
            next: String,
        }
        let separator = if path.contains('?') { '&' } else { '?' };
        let mut items = Vec::new();
        let mut next = String::new();
        loop {
            let page: Page = serde_json::from_slice(
                &self
                    .get(&format!(
                        "{path}{separator}limit={LIST_PAGE}&continue={}",
                        utf8_percent_encode(&next, NON_ALPHANUMERIC)
                    ))
                    .await?,
            )?;
            items.extend(page.items);
            if page.metadata.next.is_empty() {
                return Ok(items);
            }
            next = page.metadata.next;
        }
    }

    /// PATCHes `path` with `patch` of `content_type`
    /// (`application/merge-patch+json`, RFC 7386, or
    /// `application/json-patch+json`, RFC 6902, whose `test` operation that
    /// fails is 422: kube-apiserver answers a patch it cannot apply so,
    /// kubernetes/kubernetes#68346): the object patched, as JSON.
    ///
    /// # Errors
    /// The API server unreachable or refusing.
    pub async fn patch(
        &self,
        path: &str,
        content_type: &'static str,
        patch: &serde_json::Value,
    ) -> Result<Bytes, KubernetesError> {
        self.send(Method::PATCH, path, Some((content_type, patch.to_string())))
            .await
    }

    /// POSTs `object` to the collection at `path` (creates it): the object
    /// created, as JSON.
    ///
    /// # Errors
    /// The API server unreachable or refusing (409 when it exists).
    pub async fn create(&self, path: &str, object: &serde_json::Value) -> Result<Bytes, KubernetesError> {
        self.send(Method::POST, path, Some(("application/json", object.to_string())))
            .await
    }

    /// PUTs `object` at `path` (replaces it): the object stored, as JSON.
    ///
    /// # Errors
    /// The API server unreachable or refusing (409 when the object's
    /// `metadata.resourceVersion` is not the stored one's).
    pub async fn replace(&self, path: &str, object: &serde_json::Value) -> Result<Bytes, KubernetesError> {
        self.send(Method::PUT, path, Some(("application/json", object.to_string())))
            .await
    }

    /// Sends the request with the current token; after a 401, once more
    /// with a credential plugin's new token.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, String)>,
    ) -> Result<Bytes, KubernetesError> {
        let sent = self
            .send_with(method.clone(), path, body.clone(), self.token.current()?)
            .await;
        if let Err(KubernetesError::Refused { code: 401, .. }) = &sent
            && let Some(token) = self.token.renewed().await?
        {
            return self.send_with(method, path, body, Some(token)).await;
        }
        sent
    }

    async fn send_with(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, String)>,
        token: Option<String>,
    ) -> Result<Bytes, KubernetesError> {
        let uri = format!("{}{path}", self.server);
        let mut request = http::Request::builder()
            .method(method.clone())
            .uri(&uri)
            .header(ACCEPT, "application/json");
        if let Some(token) = token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = match body {
            Some((content_type, body)) => {
                request = request.header(CONTENT_TYPE, content_type);
                body
            }
            None => String::new(),
        };
        let request = request.body(Full::new(Bytes::from(body)))?;
        let failed = |message: String| KubernetesError::Request {
            method: method.clone(),
            uri: uri.clone(),
            message,
        };
        let (code, body) = tokio::time::timeout(TIMEOUT, async {
            let response = self.client.request(request).await.map_err(|e| failed(causes(&e)))?;
            let code = response.status();
            let body = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| failed(e.to_string()))?
                .to_bytes();
            Ok::<_, KubernetesError>((code, body))
        })
        .await
        .map_err(|_| failed(format!("no answer in {} s", TIMEOUT.as_secs())))??;
        if !code.is_success() {
            let message = serde_json::from_slice::<Status>(&body)
                .map(|s| s.message)
                .unwrap_or_default();
            return Err(KubernetesError::Refused {
                method,
                uri,
                code: code.as_u16(),
                message,
            });
        }
        Ok(body)
    }
}

/// This node's Node object, and the VolumeAttachments that name it.
pub struct NodeApi {
    api: ApiClient,
    /// The Node's name (`CSI_NODE_NAME`).
    node_name: String,
}

impl NodeApi {
    /// The client of the Node `CSI_NODE_NAME` names, configured from
    /// `source` ([`ApiClient::connect`]).
    ///
    /// # Errors
    /// A variable unset, a name that is not a Node's, a kubeconfig that
    /// cannot be used, unreadable credentials, or a TLS configuration
    /// refused.
    pub async fn connect(source: &ApiSource) -> Result<Self, KubernetesError> {
        let node_name = std::env::var("CSI_NODE_NAME").map_err(|_| KubernetesError::Unset("CSI_NODE_NAME"))?;
        if !is_node_name(&node_name) {
            return Err(KubernetesError::NodeName(node_name));
        }
        Ok(Self {
            api: ApiClient::connect(source).await?,
            node_name,
        })
    }

    /// The Node's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The Node object, as JSON.
    ///
    /// # Errors
    /// The API server unreachable or refusing (404 when the Node is gone).
    pub async fn get(&self) -> Result<Bytes, KubernetesError> {
        self.api.get(&self.node_path()).await
    }

    /// Every VolumeAttachment of the cluster (storage.k8s.io/v1; the API
    /// has no field selector on `spec.nodeName`), as a VolumeAttachmentList
    /// in JSON.
    ///
    /// # Errors
    /// The API server unreachable or refusing (403 without RBAC's `list`
    /// on volumeattachments).
    pub async fn volume_attachments(&self) -> Result<Bytes, KubernetesError> {
        self.api.get("/apis/storage.k8s.io/v1/volumeattachments").await
    }

    /// Applies a JSON Patch (RFC 6902) to the Node object
    /// ([`ApiClient::patch`]).
    ///
    /// # Errors
    /// The API server unreachable or refusing (422 for a failed `test`, 409
    /// for a stale object).
    pub async fn patch(&self, patch: &serde_json::Value) -> Result<(), KubernetesError> {
        self.api
            .patch(&self.node_path(), "application/json-patch+json", patch)
            .await
            .map(drop)
    }

    fn node_path(&self) -> String {
        format!("/api/v1/nodes/{}", self.node_name)
    }
}

/// The EC2 instance id a Node's `spec.providerID` names, as the AWS cloud
/// provider sets it (`aws:///<zone>/<instance id>`); `None` for another
/// provider's.
pub fn instance_id(provider_id: &str) -> Option<&str> {
    provider_id
        .strip_prefix("aws://")
        .and_then(|rest| rest.rsplit('/').next())
        .filter(|id| id.starts_with("i-"))
}

/// `error` and each of its sources, joined by `: ` (hyper's own message
/// hides the connect or TLS cause in its sources).
pub fn causes(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// An RFC 1123 subdomain: at most 253 characters of lowercase letters,
/// digits, `-` and `.` (Kubernetes object names).
fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}
