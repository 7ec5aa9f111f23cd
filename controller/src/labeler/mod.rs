//! `ebs-csi-controller metadata-labeler`: the Go driver's metadata labeler
//! (its `metadata-labeler` mode, `pkg/metadata/labeler.go`; its chart's
//! `sidecars.metadataLabeler`). It labels each Node whose instance EC2
//! knows with what a node cannot read without IMDS (a pod whose instance's
//! IMDSv2 hop limit is 1): its network interfaces ([`LABEL_ENIS`]) and its
//! EBS volumes besides the root that no PersistentVolume holds
//! ([`LABEL_NON_CSI_VOLUMES`]), both of which take attachment slots. The
//! agent reads them with `--metadata-sources metadata-labeler`.
//!
//! As the Go driver's: one replica labels, the holder of the Lease
//! `metadata-labeler-ebs.csi.aws.com` ([`lease`]); every Node is labeled
//! again every [`INTERVAL`], and a Node without the labels (one that has
//! just joined) within [`NEW_NODES`]. A volume is held by a
//! PersistentVolume of this driver (`spec.csi.volumeHandle`) or of the
//! in-tree `awsElasticBlockStore` (`spec.awsElasticBlockStore.volumeID`,
//! whose `aws://<zone>/` prefix is left out).

pub mod lease;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebs_csi_kube::{ApiClient, KubernetesError};
use ebs_csi_proto::{DRIVER_NAME, LABEL_ENIS, LABEL_NON_CSI_VOLUMES};
use serde_json::{Value, json};

use crate::ec2::{Ec2, Ec2Error, Instance};
use lease::{Lease, LostLease};

/// How often every Node is labeled again (the Go driver's
/// `ControllerMetadataLabelerInterval`).
pub const INTERVAL: Duration = Duration::from_secs(60 * 60);
/// How often Nodes without the labels are looked for (the Go driver
/// labels them from its Node informer's add events).
pub const NEW_NODES: Duration = Duration::from_secs(10);
/// How many instance ids one DescribeInstances asks for (an `instance-id`
/// filter takes at most 200 values: EC2 API Reference, "Filter").
const INSTANCES_PER_CALL: usize = 200;

/// Why a labeling pass failed.
#[derive(Debug, thiserror::Error)]
pub enum LabelerError {
    /// The Kubernetes API refused or could not be reached.
    #[error(transparent)]
    Kubernetes(#[from] KubernetesError),
    /// EC2 refused or could not be reached.
    #[error("DescribeInstances: {0}")]
    Ec2(#[from] Ec2Error),
}

/// Labels Nodes while this replica holds `lease`; returns when it lost it.
pub async fn run<E: Ec2>(api: &ApiClient, ec2: Arc<E>, lease: &Lease<'_>) -> LostLease {
    lease.acquire().await;
    tracing::info!("holding the metadata labeler's lease: labeling Nodes");
    tokio::select! {
        lost = lease.hold() => lost,
        never = label_forever(api, ec2.as_ref()) => match never {},
    }
}

/// Every Node labeled now and every [`INTERVAL`], the Nodes without the
/// labels every [`NEW_NODES`]; a pass that fails is logged, and the next
/// tries again. An instance EC2 does not know (the Node of a terminated
/// instance, until it is deleted) is asked about again only in the next
/// pass over every Node, as the Go driver's informer asks once per Node.
async fn label_forever<E: Ec2>(api: &ApiClient, ec2: &E) -> std::convert::Infallible {
    let mut every_node_labeled: Option<Instant> = None;
    let mut unknown = HashSet::new();
    loop {
        let every_node = every_node_labeled.is_none_or(|at| at.elapsed() >= INTERVAL);
        if every_node {
            unknown.clear();
        }
        match label(api, ec2, every_node, &mut unknown).await {
            Ok(labeled) => {
                if every_node {
                    every_node_labeled = Some(Instant::now());
                    tracing::info!(labeled, "every Node's labels written");
                } else if labeled > 0 {
                    tracing::info!(labeled, "new Nodes labeled");
                }
            }
            Err(error) => tracing::warn!(%error, "labeling Nodes failed; trying again"),
        }
        tokio::time::sleep(NEW_NODES).await;
    }
}

/// One pass over every Node, or with `every_node` false over the Nodes
/// without [`LABEL_ENIS`]: how many Nodes' labels it changed. Instances in
/// `unknown` are not asked about; those EC2 does not return join it. A
/// Node whose patch fails is named in a warning and the pass goes on.
///
/// # Errors
/// A list or DescribeInstances that failed.
async fn label<E: Ec2>(
    api: &ApiClient,
    ec2: &E,
    every_node: bool,
    unknown: &mut HashSet<String>,
) -> Result<usize, LabelerError> {
    let nodes = match every_node {
        true => api.list("/api/v1/nodes").await?,
        false => api.list(&format!("/api/v1/nodes?labelSelector=!{LABEL_ENIS}")).await?,
    };
    let nodes: Vec<(&Value, &str)> = nodes
        .iter()
        .filter_map(|node| Some((node, ebs_csi_kube::instance_id(node["spec"]["providerID"].as_str()?)?)))
        .collect();
    let ids = nodes.iter().map(|(_, id)| (*id).to_owned()).collect();
    let instances = describe(ec2, ids, unknown).await?;
    if instances.is_empty() {
        return Ok(0);
    }
    let held: HashSet<String> = api
        .list("/api/v1/persistentvolumes")
        .await?
        .iter()
        .filter_map(held_volume)
        .collect();
    let mut labeled = 0;
    for (node, instance_id) in nodes {
        let Some(instance) = instances.get(instance_id) else {
            continue;
        };
        let wanted = labels(instance, &held);
        let current = &node["metadata"]["labels"];
        if wanted.iter().all(|(key, value)| current[*key] == *value) {
            continue;
        }
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        let patch = json!({"metadata": {"labels": wanted}});
        match api
            .patch(&format!("/api/v1/nodes/{name}"), "application/merge-patch+json", &patch)
            .await
        {
            Ok(_) => labeled += 1,
            Err(error) => tracing::warn!(node = name, %error, "the Node's labels could not be written"),
        }
    }
    Ok(labeled)
}

/// The instances of `ids` EC2 knows, by id, asked for [`INSTANCES_PER_CALL`]
/// at a time, except those in `unknown`; the ids EC2 does not return join
/// `unknown`.
///
/// # Errors
/// A DescribeInstances that failed.
async fn describe<E: Ec2>(
    ec2: &E,
    ids: Vec<String>,
    unknown: &mut HashSet<String>,
) -> Result<HashMap<String, Instance>, Ec2Error> {
    let ids: Vec<String> = ids.into_iter().filter(|id| !unknown.contains(id)).collect();
    let mut instances = HashMap::new();
    // No ids, no call (DescribeInstances without ids describes every
    // instance): `chunks` of an empty slice yields none.
    for chunk in ids.chunks(INSTANCES_PER_CALL) {
        for instance in ec2.describe_instances(chunk.to_vec()).await? {
            instances.insert(instance.id.clone(), instance);
        }
    }
    unknown.extend(ids.into_iter().filter(|id| !instances.contains_key(id)));
    Ok(instances)
}

/// The labels of a Node whose instance is `instance`: its network
/// interfaces (at least one, as the Go driver counts an instance EC2 lists
/// none for) and its EBS volumes besides the root not in `held`.
fn labels(instance: &Instance, held: &HashSet<String>) -> HashMap<&'static str, String> {
    let volumes = instance.data_volume_ids.iter().filter(|id| !held.contains(*id)).count();
    HashMap::from([
        (LABEL_ENIS, instance.network_interfaces.max(1).to_string()),
        (LABEL_NON_CSI_VOLUMES, volumes.to_string()),
    ])
}

/// The EBS volume a PersistentVolume holds: this driver's volume handle,
/// or the in-tree plugin's volume id without its `aws://<zone>/` prefix.
fn held_volume(pv: &Value) -> Option<String> {
    let spec = &pv["spec"];
    if spec["csi"]["driver"] == DRIVER_NAME {
        return spec["csi"]["volumeHandle"].as_str().map(str::to_owned);
    }
    let in_tree = spec["awsElasticBlockStore"]["volumeID"].as_str()?;
    in_tree.rsplit('/').next().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ec2::model::{Behaviour, Model};

    #[test]
    fn counts_interfaces_and_the_volumes_no_volume_of_kubernetes_holds() {
        let instance = Instance {
            id: "i-0123456789abcdef0".into(),
            zone: "eu-west-1a".into(),
            device_names: vec!["/dev/xvda".into(), "/dev/xvdb".into(), "/dev/xvdc".into()],
            instance_type: "m5.large".into(),
            ebs_cards_in_use: vec![0, 0, 0],
            data_volume_ids: vec!["vol-0aaaaaaaaaaaaaaaa".into(), "vol-0bbbbbbbbbbbbbbbb".into()],
            network_interfaces: 3,
        };
        let held = HashSet::from(["vol-0bbbbbbbbbbbbbbbb".to_owned()]);
        assert_eq!(
            labels(&instance, &held),
            HashMap::from([(LABEL_ENIS, "3".to_owned()), (LABEL_NON_CSI_VOLUMES, "1".to_owned())])
        );
        let none = Instance {
            network_interfaces: 0,
            ..instance
        };
        assert_eq!(labels(&none, &HashSet::new())[LABEL_ENIS], "1");
    }

    /// An instance EC2 does not return (a terminated instance whose Node
    /// lingers) is not asked about again until `unknown` is cleared, at
    /// the next pass over every Node.
    #[tokio::test]
    async fn an_instance_ec2_does_not_know_is_asked_about_once() {
        let ec2 = Model::new(Behaviour::default());
        ec2.add_instance("i-0aaaaaaaaaaaaaaa1", "eu-west-1a");
        let ids = || vec!["i-0aaaaaaaaaaaaaaa1".to_owned(), "i-0ffffffffffffff99".to_owned()];
        let mut unknown = HashSet::new();
        let found = describe(&ec2, ids(), &mut unknown).await.unwrap();
        assert_eq!(found.keys().collect::<Vec<_>>(), ["i-0aaaaaaaaaaaaaaa1"]);
        assert_eq!(unknown, HashSet::from(["i-0ffffffffffffff99".to_owned()]));
        assert_eq!(
            describe(&ec2, vec!["i-0ffffffffffffff99".to_owned()], &mut unknown)
                .await
                .unwrap()
                .len(),
            0
        );
        describe(&ec2, ids(), &mut unknown).await.unwrap();
        assert_eq!(
            ec2.calls("DescribeInstances"),
            2,
            "the known instance is asked about again"
        );
        unknown.clear();
        describe(&ec2, ids(), &mut unknown).await.unwrap();
        assert_eq!(ec2.calls("DescribeInstances"), 3);
        assert_eq!(unknown.len(), 1);
    }

    #[test]
    fn a_volume_is_held_by_this_drivers_pv_or_the_in_tree_plugins() {
        let csi = json!({"spec": {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-01"}}});
        let other = json!({"spec": {"csi": {"driver": "efs.csi.aws.com", "volumeHandle": "fs-01"}}});
        let in_tree = json!({"spec": {"awsElasticBlockStore": {"volumeID": "aws://eu-west-1a/vol-02"}}});
        let bare = json!({"spec": {"awsElasticBlockStore": {"volumeID": "vol-03"}}});
        let held: Vec<Option<String>> = [csi, other, in_tree, bare].iter().map(held_volume).collect();
        assert_eq!(
            held,
            [
                Some("vol-01".into()),
                None,
                Some("vol-02".into()),
                Some("vol-03".into())
            ]
        );
    }
}
