//! `ebs-csi-agent pre-stop`: the step before the agent stops (the
//! DaemonSet's `preStop` hook, systemd's `ExecStop=`), as the Go driver's
//! `pre-stop-hook`. When the node is being drained, it waits until no
//! VolumeAttachment of this driver names the node: kubelet has unstaged
//! and the attach/detach controller has detached every EBS volume. Without
//! it the agent can stop first, the unstages fail, and the controller waits
//! out its 6-minute `maxWaitForUnmountDuration` before it force-detaches
//! (the Go driver's FAQ, "6-Minute Delays in Attaching Volumes"). On a
//! rollout (the node not being drained) it returns at once.

use std::time::{Duration, Instant};

use ebs_csi_proto::DRIVER_NAME;
use serde_json::Value;

use crate::metadata::kubernetes::{KubernetesError, NodeApi};

/// Taints that mean the node is being drained, besides
/// `spec.unschedulable` (which `kubectl drain` and `cordon` set).
const DRAIN_TAINTS: [&str; 5] = [
    // What the node lifecycle controller adds for `spec.unschedulable`
    // (Kubernetes well-known taints).
    "node.kubernetes.io/unschedulable",
    // Non-graceful node shutdown (Kubernetes well-known taints, KEP-2268).
    "node.kubernetes.io/out-of-service",
    // Cluster Autoscaler's, on a node it scales down (its FAQ).
    "ToBeDeletedByClusterAutoscaler",
    // Karpenter's on a node it disrupts: v1, and v1beta1's key.
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
];

/// How often the VolumeAttachments are listed while waiting.
const POLL: Duration = Duration::from_secs(2);

/// What the step found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The node is not being drained: nothing to wait for.
    NotDraining,
    /// No VolumeAttachment of this driver names the node (any more).
    Detached,
}

/// Why the step gave up.
#[derive(Debug, thiserror::Error)]
pub enum PreStopError {
    /// The Kubernetes API failed (the last error, when the wait ran out).
    #[error(transparent)]
    Kubernetes(#[from] KubernetesError),
    /// The answer is not JSON.
    #[error("the API server's answer: {0}")]
    Body(#[from] serde_json::Error),
    /// The wait ran out with volumes still attached.
    #[error("after {seconds} s, VolumeAttachments still name this node: {names}")]
    TimedOut {
        /// The time allowed, in seconds.
        seconds: u64,
        /// The VolumeAttachments' names, comma-separated.
        names: String,
    },
}

/// Reads the Node and, when it is being drained (or is gone: the instance
/// is terminating), waits until no VolumeAttachment whose attacher is this
/// driver names it, listing them every 2 s, for at most `timeout` (none:
/// until the pod's grace period or systemd's `TimeoutStopSec` ends it).
///
/// # Errors
/// [`PreStopError`]: the Node unreadable, or at `timeout` the
/// VolumeAttachments left (or the last error listing them).
pub async fn run(api: &NodeApi, timeout: Option<Duration>) -> Result<Outcome, PreStopError> {
    match api.get().await {
        Ok(node) if !draining(&serde_json::from_slice(&node)?) => {
            tracing::info!(node = api.node_name(), "pre-stop: the node is not being drained");
            return Ok(Outcome::NotDraining);
        }
        Ok(_) => tracing::info!(
            node = api.node_name(),
            "pre-stop: the node is being drained; waiting for its volumes to detach"
        ),
        Err(KubernetesError::Refused { code: 404, .. }) => {
            tracing::info!(
                node = api.node_name(),
                "pre-stop: the Node is gone; waiting for its volumes to detach"
            );
        }
        Err(e) => return Err(e.into()),
    }
    let started = Instant::now();
    loop {
        let left = attached(api).await;
        match &left {
            Ok(names) if names.is_empty() => {
                tracing::info!(node = api.node_name(), "pre-stop: no VolumeAttachment names this node");
                return Ok(Outcome::Detached);
            }
            Ok(names) => tracing::info!(?names, "pre-stop: waiting for VolumeAttachments"),
            Err(error) => tracing::warn!(%error, "pre-stop: listing VolumeAttachments; trying again"),
        }
        let remaining = timeout.map(|t| t.saturating_sub(started.elapsed()));
        if let (Some(timeout), Some(Duration::ZERO)) = (timeout, remaining) {
            return Err(match left {
                Ok(names) => PreStopError::TimedOut {
                    seconds: timeout.as_secs(),
                    names: names.join(", "),
                },
                Err(e) => e,
            });
        }
        tokio::time::sleep(remaining.map_or(POLL, |r| r.min(POLL))).await;
    }
}

/// Whether `node` (a Node object) is being drained.
fn draining(node: &Value) -> bool {
    let taints = node["spec"]["taints"].as_array().map(Vec::as_slice).unwrap_or_default();
    node["spec"]["unschedulable"] == true
        || taints
            .iter()
            .any(|t| t["key"].as_str().is_some_and(|key| DRAIN_TAINTS.contains(&key)))
}

/// The names of this driver's VolumeAttachments that name the node.
async fn attached(api: &NodeApi) -> Result<Vec<String>, PreStopError> {
    let list: Value = serde_json::from_slice(&api.volume_attachments().await?)?;
    let items = list["items"].as_array().map(Vec::as_slice).unwrap_or_default();
    Ok(items
        .iter()
        .filter(|a| a["spec"]["attacher"] == DRIVER_NAME && a["spec"]["nodeName"] == api.node_name())
        .map(|a| a["metadata"]["name"].as_str().unwrap_or_default().to_owned())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_drained_when_unschedulable_or_tainted_so() {
        let node = |spec: Value| serde_json::json!({ "spec": spec });
        assert!(!draining(&node(serde_json::json!({}))));
        assert!(!draining(&node(serde_json::json!({"unschedulable": false}))));
        assert!(draining(&node(serde_json::json!({"unschedulable": true}))));
        let other = serde_json::json!({"key": "example.com/dedicated", "effect": "NoSchedule"});
        assert!(!draining(&node(serde_json::json!({ "taints": [other] }))));
        for key in DRAIN_TAINTS {
            let taint = serde_json::json!({"key": key, "effect": "NoSchedule"});
            assert!(
                draining(&node(serde_json::json!({ "taints": [other, taint] }))),
                "{key}"
            );
        }
    }
}
