//! The startup taint `ebs.csi.aws.com/agent-not-ready`: node groups and
//! Karpenter put it on a new node (the Go driver's docs, and Karpenter's
//! and EKS's, tell users to set it as a startup taint) so that no pod with
//! an EBS volume lands there before the node plugin can stage volumes. The
//! node plugin removes it once it is ready (the Go driver:
//! `pkg/driver/node.go`, `removeTaintInBackground`); here, once the agent
//! has answered NodeGetInfo (kubelet registered it) and the helper answers.

use std::future::Future;
use std::time::Duration;

use serde_json::{Value, json};

use crate::metadata::kubernetes::{ApiSource, KubernetesError, NodeApi};

/// The taint's key (the Go driver's `AgentNotReadyNodeTaintKey`).
pub const STARTUP_TAINT: &str = "ebs.csi.aws.com/agent-not-ready";

/// How many times a patch that lost a race with another writer of the
/// Node (kubelet, the node lifecycle controller, Karpenter) is tried again
/// from a fresh read before [`remove`] reports the conflict.
const CONFLICT_ATTEMPTS: usize = 5;

/// What [`remove`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// The taint was there and is gone.
    Removed,
    /// The Node had no such taint.
    Absent,
}

/// Removes the startup taint from the Node, keeping every other taint as
/// it is: reads the Node and, when the taint is there, sends a JSON Patch
/// (RFC 6902) that tests the object's `resourceVersion` and replaces
/// `spec.taints` with the others, so a change another writer made since
/// the read is never overwritten (kube-apiserver answers the failed test
/// 422); a conflict is read again, up to [`CONFLICT_ATTEMPTS`] times.
///
/// # Errors
/// The API server unreachable or refusing (403 without RBAC's `patch` on
/// nodes), or a Node that is not JSON.
pub async fn remove(api: &NodeApi) -> Result<Removal, KubernetesError> {
    let mut attempt = 1;
    loop {
        let node: Value = serde_json::from_slice(&api.get().await?)?;
        let taints = node["spec"]["taints"].as_array().cloned().unwrap_or_default();
        let others: Vec<Value> = taints.iter().filter(|t| t["key"] != STARTUP_TAINT).cloned().collect();
        if others.len() == taints.len() {
            return Ok(Removal::Absent);
        }
        let patch = json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]},
            {"op": "replace", "path": "/spec/taints", "value": others},
        ]);
        match api.patch(&patch).await {
            Ok(()) => return Ok(Removal::Removed),
            Err(KubernetesError::Refused { code: 409 | 422, .. }) if attempt < CONFLICT_ATTEMPTS => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Once `ready` completes, removes the startup taint in the background,
/// trying again after a failure (1 s, doubling, at most 60 s apart) until
/// it is gone. Nothing is looked for where `source` names no API server
/// (without `--kubeconfig`, `KUBERNETES_SERVICE_HOST` unset): a systemd or
/// Nomad node has no Node object. A client that cannot be made (a
/// kubeconfig or service account that cannot be used) is an error logged
/// once.
pub fn remove_when_ready(source: ApiSource, ready: impl Future<Output = ()> + Send + 'static) {
    if !source.is_configured() {
        tracing::debug!("no Kubernetes API: the startup taint is not looked for");
        return;
    }
    tokio::spawn(async move {
        let api = match NodeApi::connect(&source).await {
            Ok(api) => api,
            Err(e) => {
                tracing::error!(taint = STARTUP_TAINT, error = %e, "the startup taint cannot be removed");
                return;
            }
        };
        ready.await;
        let mut pause = Duration::from_secs(1);
        loop {
            match remove(&api).await {
                Ok(Removal::Removed) => {
                    tracing::info!(taint = STARTUP_TAINT, "removed the startup taint from this node");
                    return;
                }
                Ok(Removal::Absent) => {
                    tracing::debug!(taint = STARTUP_TAINT, "this node has no startup taint");
                    return;
                }
                Err(e) => tracing::warn!(taint = STARTUP_TAINT, error = %e, "removing the startup taint; trying again"),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(60));
        }
    });
}
