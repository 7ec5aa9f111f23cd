//! A volume's life through the real cluster: the real csi-provisioner,
//! csi-attacher and kubelet driving the driver, EC2 as moto behind serve.py
//! with the attach simulator playing the instance's hypervisor (an attached
//! volume is a loop device with an EBS volume's links).
//!
//! A claim of a WaitForFirstConsumer class is provisioned in the zone of
//! the pod's node, with both topology keys on its PersistentVolume; a pod
//! writes to it, is deleted, and a second pod reads what it wrote; the
//! claim deleted, the volume is gone from EC2 and nothing of it is left
//! attached or as a device on the node. Then, in a namespace of their own,
//! the refusals a user meets, each in the claim's or the pod's events with
//! the driver's own message, nothing of them left in EC2.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use ebs_csi_tests::kube::{self, Driver, Namespace, poll_until};
use ebs_csi_tests::moto::{REGION, ZONE};

/// A gp3 class that waits for the first consumer, and a 1 GiB claim of it,
/// `data`.
pub const CLASS_AND_CLAIM: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: ebs-gp3-ext4}
provisioner: ebs.csi.aws.com
volumeBindingMode: WaitForFirstConsumer
parameters: {type: gp3, csi.storage.k8s.io/fstype: ext4}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ebs-gp3-ext4
  resources: {requests: {storage: 1Gi}}
"#;

/// The pod `name` running `script` once with the claim at /data.
pub fn pod(name: &str, script: &str) -> String {
    kube::pod(name, script, &[("data", "/data")], &json!({}))
}

/// The volume's life, in `ns`; returns the EBS volume's id.
pub fn a_dynamic_volume_keeps_its_data_across_pods_and_goes_with_its_claim(
    ns: &Namespace<'_>,
    driver: &Driver,
) -> String {
    ns.apply(CLASS_AND_CLAIM);
    // WaitForFirstConsumer: nothing is provisioned before a pod uses it.
    assert_eq!(ns.get("pvc", "data", "{.status.phase}"), "Pending");

    assert_eq!(
        ns.run(
            "writer",
            &pod("writer", "echo kept > /data/file && sync && cat /data/file")
        ),
        "kept\n"
    );
    let pv = ns.get("pvc", "data", "{.spec.volumeName}");
    let volume = ns.get("pv", &pv, "{.spec.csi.volumeHandle}");
    assert!(volume.starts_with("vol-"), "{volume}");
    let affinity = ns.get("pv", &pv, "{.spec.nodeAffinity.required}");
    for key in ["topology.ebs.csi.aws.com/zone", "topology.kubernetes.io/zone"] {
        assert!(affinity.contains(key) && affinity.contains(ZONE), "{affinity}");
    }
    let described = driver.moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume)]);
    assert!(
        described.contains(&format!("<instanceId>{}</instanceId>", driver.instance)),
        "{described}"
    );

    ns.kubectl(&["delete", "pod", "writer", "--wait"]);
    assert_eq!(ns.run("reader", &pod("reader", "cat /data/file")), "kept\n");
    ns.kubectl(&["delete", "pod", "reader", "--wait"]);

    ns.kubectl(&["delete", "pvc", "data", "--wait"]);
    poll_until("the PersistentVolume to go", Duration::from_secs(120), || {
        !ns.kubectl(&["get", "pv", "-o", "name"]).contains(&pv)
    });
    poll_until("the volume to go from EC2", Duration::from_secs(60), || {
        driver
            .moto
            .ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume)])
            .contains("InvalidVolume.NotFound")
    });
    assert!(!attached_volumes(ns).contains(&pv));
    // The deleted volume's device links go with its detach.
    let serial = volume.replace('-', "");
    assert!(
        driver.device_links().iter().all(|l| !l.contains(&serial)),
        "the volume's links outlived its detach"
    );
    volume
}

/// The PersistentVolumes with a VolumeAttachment.
pub fn attached_volumes(ns: &Namespace<'_>) -> String {
    ns.kubectl(&[
        "get",
        "volumeattachments",
        "-o",
        "jsonpath={.items[*].spec.source.persistentVolumeName}",
    ])
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

/// What the refused claims leave in the driver's logs, and why
/// ([`Driver::assert_logs_are_clean`]).
pub const PROVOKED: [(&str, &str); 2] = [
    ("tpye", "the class with a parameter the driver does not know"),
    (
        "refused: device nodes on the volume would open the node's devices",
        "the class whose mount option the helper refuses",
    ),
];

/// The ids of the EC2 volumes made for claims of `ns` (the provisioner's
/// `--extra-create-metadata` tags, `kubernetes.io/created-for/pvc/namespace`;
/// an attached volume's id is in its attachment too).
fn ec2_volumes_of(ns: &Namespace<'_>, driver: &Driver) -> BTreeSet<String> {
    let described = driver.moto.ec2(
        REGION,
        "DescribeVolumes",
        &[
            ("Filter.1.Name", "tag%3Akubernetes.io%2Fcreated-for%2Fpvc%2Fnamespace"),
            ("Filter.1.Value.1", ns.name()),
        ],
    );
    described
        .split("<volumeId>")
        .skip(1)
        .filter_map(|s| s.split('<').next())
        .map(str::to_owned)
        .collect()
}

/// The refusals, in `ns`.
pub fn refusals_reach_the_claims_and_pods_events_and_leave_nothing_in_ec2(ns: &Namespace<'_>, driver: &Driver) {
    let within = Duration::from_secs(90);
    ns.apply(REFUSED);
    let typo = ns.wait_for_event("typo", "ProvisioningFailed", "tpye", within);
    assert!(
        typo.contains(r#"rpc error: code = InvalidArgument desc = parameter "tpye" is not known"#),
        "{typo}"
    );
    assert_eq!(
        ns.get("pvc", "typo", "{.status.phase}"),
        "Pending",
        "a refused class bound its claim"
    );

    let devices = kube::pod("devices", "true", &[("devices", "/data")], &json!({}));
    ns.apply(&devices);
    let mount = ns.wait_for_event("devices", "FailedMount", "refused", within);
    assert!(
        mount.contains(
            r#"code = InvalidArgument desc = mount option "dev" refused: device nodes on the volume would open the node's devices"#
        ),
        "{mount}"
    );
    let pv = ns.get("pvc", "devices", "{.spec.volumeName}");
    assert_eq!(ec2_volumes_of(ns, driver).len(), 1, "a refused class made a volume");

    ns.kubectl(&["delete", "pods", "--all", "--wait"]);
    ns.kubectl(&["delete", "pvc", "--all", "--wait"]);
    poll_until("the PersistentVolume to go", Duration::from_secs(120), || {
        !ns.kubectl(&["get", "pv", "-o", "name"]).contains(&pv)
    });
    poll_until("its VolumeAttachment to go", Duration::from_secs(120), || {
        !attached_volumes(ns).contains(&pv)
    });
    poll_until("EC2 to hold none of its volumes", Duration::from_secs(60), || {
        ec2_volumes_of(ns, driver).is_empty()
    });
}
