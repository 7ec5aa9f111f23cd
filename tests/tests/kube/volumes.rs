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
//! the driver's own message, nothing of them left in EC2: a class with a
//! parameter the driver does not know, a mount option the helper refuses,
//! and a volume of another zone than the node's.

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
pub const PROVOKED: [(&str, &str); 3] = [
    ("tpye", "the class with a parameter the driver does not know"),
    (
        "refused: device nodes on the volume would open the node's devices",
        "the class whose mount option the helper refuses",
    ),
    (
        "is not in the same availability zone as instance",
        "the volume of another zone, its PersistentVolume without node affinity",
    ),
];

/// A zone of the region other than the node's.
const OTHER_ZONE: &str = "us-east-1b";

/// A PersistentVolume `name` of the EBS volume `volume_id` as a user writes
/// one for a volume made outside the cluster, but without the node affinity
/// that would keep its pods off nodes of other zones, and its claim, `name`.
fn static_volume(name: &str, namespace: &str, volume_id: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {name}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  claimRef: {{namespace: {namespace}, name: {name}}}
  csi: {{driver: ebs.csi.aws.com, volumeHandle: {volume_id}, fsType: ext4}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}}}
spec: {{accessModes: [ReadWriteOnce], storageClassName: "", volumeName: {name}, resources: {{requests: {{storage: 1Gi}}}}}}
"#
    )
}

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
    a_volume_of_another_zone_is_refused_by_ec2_in_the_pods_events(ns, driver);
}

/// A volume made in EC2 in another zone than the node's, given to a pod by
/// a PersistentVolume without node affinity: the scheduler places the pod,
/// EC2 refuses the attachment (`InvalidVolume.ZoneMismatch`) and the pod's
/// `FailedAttachVolume` event says so with the driver's message; the pod
/// and its claim deleted, the volume is as the user made it, never
/// attached, and nothing else was made.
fn a_volume_of_another_zone_is_refused_by_ec2_in_the_pods_events(ns: &Namespace<'_>, driver: &Driver) {
    let created = driver.moto.ec2(
        REGION,
        "CreateVolume",
        &[
            ("AvailabilityZone", OTHER_ZONE),
            ("Size", "1"),
            ("VolumeType", "gp3"),
            ("TagSpecification.1.ResourceType", "volume"),
            (
                "TagSpecification.1.Tag.1.Key",
                "kubernetes.io%2Fcreated-for%2Fpvc%2Fnamespace",
            ),
            ("TagSpecification.1.Tag.1.Value", ns.name()),
        ],
    );
    let volume_id = created
        .split("<volumeId>")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .unwrap_or_else(|| panic!("CreateVolume: {created}"));
    // As its user would, once EC2 shows it available (serve.py, as EC2,
    // leaves a new volume out of its answers for a while).
    driver
        .moto
        .volume_once(REGION, volume_id, |xml| xml.contains("<status>available</status>"));
    let name = format!("elsewhere-{}", ns.name());
    ns.apply(&static_volume(&name, ns.name(), volume_id));
    ns.apply(&kube::pod("elsewhere", "true", &[(name.as_str(), "/data")], &json!({})));
    let refused = ns.wait_for_event(
        "elsewhere",
        "FailedAttachVolume",
        "availability zone",
        Duration::from_secs(90),
    );
    assert!(
        refused.contains(&format!(
            "code = FailedPrecondition desc = incorrect state: The volume '{volume_id}' is not in the same availability zone as instance '{}'",
            driver.instance
        )),
        "{refused}"
    );
    assert_eq!(ns.get("pod", "elsewhere", "{.status.phase}"), "Pending");

    ns.kubectl(&["delete", "pods", "--all", "--wait"]);
    ns.kubectl(&["delete", "pvc", &name, "--wait"]);
    ns.kubectl(&["delete", "pv", &name, "--wait"]);
    poll_until("its VolumeAttachment to go", Duration::from_secs(120), || {
        !attached_volumes(ns).contains(&name)
    });
    let described = driver.moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", volume_id)]);
    assert!(
        described.contains("<status>available</status>") && !described.contains("<instanceId>"),
        "the volume of another zone is not as its user made it: {described}"
    );
    assert_eq!(
        ec2_volumes_of(ns, driver),
        BTreeSet::from([volume_id.to_owned()]),
        "the refusal made a volume"
    );
    driver.moto.ec2(REGION, "DeleteVolume", &[("VolumeId", volume_id)]);
    poll_until("EC2 to hold none of its volumes", Duration::from_secs(60), || {
        ec2_volumes_of(ns, driver).is_empty()
    });
}
