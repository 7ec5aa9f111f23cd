//! This node's Node object in the Kubernetes API, read with the
//! configuration the Go driver's client takes
//! (`clientcmd.BuildConfigFromFlags("", kubeconfig)`, [`ApiSource`]): the
//! kubeconfig file `--kubeconfig` names ([`kubeconfig`]), else client-go's
//! in-cluster configuration — the API server at
//! `KUBERNETES_SERVICE_HOST`:`KUBERNETES_SERVICE_PORT`, the bearer token
//! and CA bundle from the service account directory. The node's name is
//! `CSI_NODE_NAME` either way (the Go driver's variable, set from the
//! downward API's `spec.nodeName`).
//!
//! From the Node (Kubernetes API reference, Node v1): the instance id is
//! the last segment of `spec.providerID` (`aws:///<zone>/<instance id>`, as
//! the AWS cloud provider sets it), the zone the `topology.kubernetes.io/zone`
//! label, the type the `node.kubernetes.io/instance-type` label.
//!
//! The cost: RBAC cannot narrow `get` to the caller's own Node, so the
//! agent's token can read every Node object; for the startup taint
//! ([`crate::taint`]), `patch` them; and, for the pre-stop step
//! ([`crate::pre_stop`]), list every VolumeAttachment.

mod exec_plugin;
mod kubeconfig;
mod rest_config;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

pub use self::rest_config::ApiSource;
use self::rest_config::{Token, in_cluster, system_roots};
use super::{Found, causes};

/// How long the whole request may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest Node object read (bytes); real ones are a few KiB.
const MAX_BODY: usize = 1 << 20;
/// Label with the node's zone (Kubernetes well-known labels).
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The zone id label the AWS cloud controller manager sets.
const ZONE_ID_LABEL: &str = "topology.k8s.aws/zone-id";
/// Label with the node's instance type (Kubernetes well-known labels).
const TYPE_LABEL: &str = "node.kubernetes.io/instance-type";

/// Why the Node object gave no metadata.
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
    /// The answer is not a Node object.
    #[error("the Node object: {0}")]
    Body(#[from] serde_json::Error),
    /// `spec.providerID` names no EC2 instance.
    #[error("spec.providerID {0:?} names no EC2 instance")]
    ProviderId(String),
}

#[derive(Deserialize)]
struct Node {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: NodeSpec,
}

#[derive(Default, Deserialize)]
struct ObjectMeta {
    #[serde(default)]
    labels: HashMap<String, String>,
}

#[derive(Default, Deserialize)]
struct NodeSpec {
    #[serde(rename = "providerID", default)]
    provider_id: String,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    message: String,
}

/// Reads this node's instance id, zone and type from its Node object.
///
/// # Errors
/// [`KubernetesError`]: configuration missing, API server unreachable or
/// refusing, or a Node without an EC2 provider id.
pub async fn read(source: &ApiSource) -> Result<Found, KubernetesError> {
    let node: Node = serde_json::from_slice(&NodeApi::connect(source).await?.get().await?)?;
    let instance_id = node
        .spec
        .provider_id
        .strip_prefix("aws://")
        .and_then(|rest| rest.rsplit('/').next())
        .filter(|id| id.starts_with("i-"))
        .ok_or_else(|| KubernetesError::ProviderId(node.spec.provider_id.clone()))?;
    Ok(Found {
        instance_id: Some(instance_id.to_owned()),
        availability_zone: node.metadata.labels.get(ZONE_LABEL).cloned(),
        availability_zone_id: node.metadata.labels.get(ZONE_ID_LABEL).cloned(),
        instance_type: node.metadata.labels.get(TYPE_LABEL).cloned(),
        ..Found::default()
    })
}

/// This node's Node object, and the VolumeAttachments that name it.
pub struct NodeApi {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// `https://<host>[:<port>]`.
    server: String,
    /// The Node's name (`CSI_NODE_NAME`).
    node_name: String,
    token: Token,
}

impl NodeApi {
    /// The client of the Node `CSI_NODE_NAME` names, configured from
    /// `source` (a kubeconfig's credential plugin is run here).
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
            node_name,
            token: config.token,
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
        self.send(Method::GET, &self.node_path(), None).await
    }

    /// Every VolumeAttachment of the cluster (storage.k8s.io/v1; the API
    /// has no field selector on `spec.nodeName`), as a VolumeAttachmentList
    /// in JSON.
    ///
    /// # Errors
    /// The API server unreachable or refusing (403 without RBAC's `list`
    /// on volumeattachments).
    pub async fn volume_attachments(&self) -> Result<Bytes, KubernetesError> {
        self.send(Method::GET, "/apis/storage.k8s.io/v1/volumeattachments", None)
            .await
    }

    /// Applies a JSON Patch (RFC 6902) to the Node object.
    ///
    /// # Errors
    /// The API server unreachable or refusing: a `test` operation that
    /// fails is 422 (kube-apiserver answers a patch it cannot apply so,
    /// kubernetes/kubernetes#68346), a stale object 409.
    pub async fn patch(&self, patch: &serde_json::Value) -> Result<(), KubernetesError> {
        self.send(Method::PATCH, &self.node_path(), Some(patch.to_string()))
            .await
            .map(drop)
    }

    fn node_path(&self) -> String {
        format!("/api/v1/nodes/{}", self.node_name)
    }

    /// Sends the request with the current token; after a 401, once more
    /// with a credential plugin's new token.
    async fn send(&self, method: Method, path: &str, body: Option<String>) -> Result<Bytes, KubernetesError> {
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
        body: Option<String>,
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
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json-patch+json");
        }
        let request = request.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
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

/// An RFC 1123 subdomain: at most 253 characters of lowercase letters,
/// digits, `-` and `.` (Kubernetes object names).
fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}
