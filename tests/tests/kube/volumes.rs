//! A volume's life through a real cluster (#43 item 4;
//! `ebs_csi_tests::kube`): the `standard` overlay installed from the chart,
//! the real csi-provisioner, csi-attacher and kubelet driving the driver,
//! EC2 as moto behind serve.py with the attach simulator playing the
//! instance's hypervisor (an attached volume is a loop device with an EBS
//! volume's links).
//!
//! A claim of a WaitForFirstConsumer class is provisioned in the zone of
//! the pod's node, with both topology keys on its PersistentVolume; a pod
//! writes to it, is deleted, and a second pod reads what it wrote; the
//! claim deleted, the volume is gone from EC2 and nothing of it is left
//! attached, mounted or as a device on the node. Then, on the same cluster,
//! the refusals a user meets (#43 item 4), each in the claim's or the pod's
//! events with the driver's own message, nothing of them left in EC2.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use ebs_csi_tests::kube::{self, Cluster, Driver, driver_images};
use ebs_csi_tests::moto::{REGION, ZONE};

use ebs_csi_tests::{mounts_under, require_root, wait_until};

/// A gp3 class that waits for the first consumer, and a 1 GiB claim of it.
const CLASS_AND_CLAIM: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: ebs-gp3}
provisioner: ebs.csi.aws.com
volumeBindingMode: WaitForFirstConsumer
parameters: {type: gp3, csi.storage.k8s.io/fstype: ext4}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ebs-gp3
  resources: {requests: {storage: 1Gi}}
"#;

/// The pod `name` running `script` once with the claim at /data.
fn pod(name: &str, script: &str) -> String {
    kube::pod(name, script, &[("data", "/data")], &json!({}))
}

#[test]
fn a_dynamic_volume_goes_with_its_claim_and_each_refusal_reaches_the_user() {
    require_root();
    let cluster = Cluster::up_with(&[], &driver_images());
    let driver = Driver::install(&cluster, true);
    driver.wait_until_ready(&cluster);
    a_dynamic_volume_keeps_its_data_across_pods_and_goes_with_its_claim(&cluster, &driver);
    driver.assert_logs_are_clean(&cluster);
    refusals_reach_the_claims_and_pods_events_and_leave_nothing_in_ec2(&cluster, &driver);
    cluster.helm(&["uninstall", "ebs-csi", "--namespace", "kube-system", "--wait"]);
    cluster.down();
}

fn a_dynamic_volume_keeps_its_data_across_pods_and_goes_with_its_claim(cluster: &Cluster, driver: &Driver) {
    cluster.apply(CLASS_AND_CLAIM);
    // WaitForFirstConsumer: nothing is provisioned before a pod uses it.
    assert_eq!(cluster.get("pvc", "data", "{.status.phase}"), "Pending");

    assert_eq!(
        cluster.run(
            "writer",
            &pod("writer", "echo kept > /data/file && sync && cat /data/file")
        ),
        "kept\n"
    );
    let pv = cluster.get("pvc", "data", "{.spec.volumeName}");
    let volume = cluster.get("pv", &pv, "{.spec.csi.volumeHandle}");
    assert!(volume.starts_with("vol-"), "{volume}");
    let affinity = cluster.get("pv", &pv, "{.spec.nodeAffinity.required}");
    for key in ["topology.ebs.csi.aws.com/zone", "topology.kubernetes.io/zone"] {
        assert!(affinity.contains(key) && affinity.contains(ZONE), "{affinity}");
    }
    let described = driver.moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume)]);
    assert!(
        described.contains(&format!("<instanceId>{}</instanceId>", driver.instance)),
        "{described}"
    );

    cluster.kubectl(&["delete", "pod", "writer", "--wait"]);
    assert_eq!(cluster.run("reader", &pod("reader", "cat /data/file")), "kept\n");
    cluster.kubectl(&["delete", "pod", "reader", "--wait"]);

    cluster.kubectl(&["delete", "pvc", "data", "--wait"]);
    wait_until("the PersistentVolume to go", Duration::from_secs(120), || {
        cluster.kubectl(&["get", "pv", "-o", "name"]).is_empty()
    });
    wait_until("the volume to go from EC2", Duration::from_secs(60), || {
        driver
            .moto
            .ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume)])
            .contains("InvalidVolume.NotFound")
    });
    assert_eq!(cluster.kubectl(&["get", "volumeattachments", "-o", "name"]), "");
    let csi_mounts: Vec<String> = mounts_under(&cluster.dir().join("kubelet"))
        .into_iter()
        .filter(|m| m.contains("/kubernetes.io~csi/") || m.contains("/plugins/kubernetes.io/csi/"))
        .collect();
    assert_eq!(csi_mounts, Vec::<String>::new());
    // The instance's root volume keeps its links; the deleted one has none.
    let serial = volume.replace('-', "");
    let links: Vec<String> = std::fs::read_dir(cluster.dir().join("dev/disk/by-id"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        links.iter().all(|l| !l.contains(&serial)),
        "the volume's links outlived its detach: {links:?}"
    );
    assert_eq!(links.len(), 1, "{links:?}");
}

/// What a user gets wrong, each met where a user looks: a class with a
/// parameter the driver does not know (the claim's ProvisioningFailed) and
/// a mount option the helper refuses (the pod's FailedMount), each with the
/// driver's own message (`controller/src/parameters.rs`,
/// `helper/src/options.rs`).
const REFUSED: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: typo}
provisioner: ebs.csi.aws.com
parameters: {tpye: gp3}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: typo}
spec: {accessModes: [ReadWriteOnce], storageClassName: typo, resources: {requests: {storage: 1Gi}}}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: devices}
provisioner: ebs.csi.aws.com
volumeBindingMode: WaitForFirstConsumer
mountOptions: [dev]
parameters: {type: gp3}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: devices}
spec: {accessModes: [ReadWriteOnce], storageClassName: devices, resources: {requests: {storage: 1Gi}}}
"#;

/// The ids of the EC2 volumes moto holds, the instance's root volume
/// among them.
fn ec2_volumes(driver: &Driver) -> BTreeSet<String> {
    let described = driver.moto.ec2(REGION, "DescribeVolumes", &[]);
    described
        .split("<volumeId>")
        .skip(1)
        .filter_map(|s| s.split('<').next())
        .map(str::to_owned)
        .collect()
}

fn refusals_reach_the_claims_and_pods_events_and_leave_nothing_in_ec2(cluster: &Cluster, driver: &Driver) {
    let before = ec2_volumes(driver);
    let within = Duration::from_secs(90);
    cluster.apply(REFUSED);
    let typo = cluster.wait_for_event("typo", "ProvisioningFailed", "tpye", within);
    assert!(
        typo.contains(r#"rpc error: code = InvalidArgument desc = parameter "tpye" is not known"#),
        "{typo}"
    );
    assert_eq!(ec2_volumes(driver), before, "a refused class made a volume");

    let devices = kube::pod("devices", "true", &[("devices", "/data")], &json!({}));
    cluster.apply(&devices);
    let mount = cluster.wait_for_event("devices", "FailedMount", "refused", within);
    assert!(
        mount.contains(
            r#"code = InvalidArgument desc = mount option "dev" refused: device nodes on the volume would open the node's devices"#
        ),
        "{mount}"
    );

    cluster.kubectl(&["delete", "pods", "--all", "--wait"]);
    cluster.kubectl(&["delete", "pvc", "--all", "--wait"]);
    wait_until("every PersistentVolume to go", Duration::from_secs(120), || {
        cluster.kubectl(&["get", "pv", "-o", "name"]).is_empty()
    });
    wait_until("no VolumeAttachment to be left", Duration::from_secs(120), || {
        cluster.kubectl(&["get", "volumeattachments", "-o", "name"]).is_empty()
    });
    wait_until(
        "EC2 to hold the volumes it held before",
        Duration::from_secs(60),
        || ec2_volumes(driver) == before,
    );
}
