//! This node's Node object in the Kubernetes API ([`ebs_csi_kube`]: the
//! configuration the Go driver's client takes, `--kubeconfig` or the
//! in-cluster one; the node's name in `CSI_NODE_NAME`).
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

use std::collections::HashMap;

pub use ebs_csi_kube::{ApiSource, KubernetesError, NodeApi};
use ebs_csi_proto::{LABEL_ENIS, LABEL_NON_CSI_VOLUMES};
use serde::Deserialize;

use super::Found;

/// Label with the node's zone (Kubernetes well-known labels).
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The zone id label the AWS cloud controller manager sets.
const ZONE_ID_LABEL: &str = "topology.k8s.aws/zone-id";
/// Label with the node's instance type (Kubernetes well-known labels).
const TYPE_LABEL: &str = "node.kubernetes.io/instance-type";

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

/// Reads this node's instance id, zone and type from its Node object; with
/// `counts`, its network interfaces and its EBS volumes besides the root
/// that no PersistentVolume holds from the labels of the controller's
/// metadata labeler, where it has written them
/// ([`ebs_csi_proto::LABEL_ENIS`], [`ebs_csi_proto::LABEL_NON_CSI_VOLUMES`]).
///
/// # Errors
/// [`KubernetesError`]: configuration missing, API server unreachable or
/// refusing, or a Node without an EC2 provider id.
pub async fn read(source: &ApiSource, counts: bool) -> Result<Found, KubernetesError> {
    let node: Node = serde_json::from_slice(&NodeApi::connect(source).await?.get().await?)?;
    let count = |label: &str| {
        node.metadata
            .labels
            .get(label)
            .filter(|_| counts)
            .and_then(|value| value.parse::<u32>().ok())
    };
    let instance_id = ebs_csi_kube::instance_id(&node.spec.provider_id)
        .ok_or_else(|| KubernetesError::ProviderId(node.spec.provider_id.clone()))?;
    Ok(Found {
        instance_id: Some(instance_id.to_owned()),
        availability_zone: node.metadata.labels.get(ZONE_LABEL).cloned(),
        availability_zone_id: node.metadata.labels.get(ZONE_ID_LABEL).cloned(),
        instance_type: node.metadata.labels.get(TYPE_LABEL).cloned(),
        network_interfaces: count(LABEL_ENIS),
        boot_volumes: count(LABEL_NON_CSI_VOLUMES),
        ..Found::default()
    })
}
