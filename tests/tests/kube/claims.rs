//! What a claim can ask for, through the real cluster: the real
//! csi-provisioner, csi-attacher, csi-resizer, csi-snapshotter,
//! snapshot-controller and kubelet driving the driver, EC2 as moto behind
//! serve.py with the attach simulator playing the instance's hypervisor
//! (it grows a loop device when its volume grows, and keeps a snapshot's
//! contents for the volumes restored from it).
//!
//! Each step is checked where a user would look: the claim's status, what
//! the pod sees (`df`, the data, owners and modes) and what EC2 says.

use std::time::Duration;

use serde_json::json;

use ebs_csi_tests::kube::{Driver, Namespace, pod, poll_until};
use ebs_csi_tests::moto::REGION;

/// A gp3 class that waits for the first consumer and lets its claims grow;
/// the classes of snapshots, group snapshots and volume attributes. Its
/// filesystem is XFS: online ext4 growth needs `CAP_SYS_RESOURCE`, which
/// this project's machines withhold even from root (README, "Known
/// limitations"; `node_lifecycle.rs` checks ext4's refusal there).
pub const CLASSES: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: ebs-gp3-xfs}
provisioner: ebs.csi.aws.com
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
parameters: {type: gp3, csi.storage.k8s.io/fstype: xfs}
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: ebs}
driver: ebs.csi.aws.com
deletionPolicy: Delete
---
apiVersion: groupsnapshot.storage.k8s.io/v1
kind: VolumeGroupSnapshotClass
metadata: {name: ebs}
driver: ebs.csi.aws.com
deletionPolicy: Delete
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata: {name: fast}
driverName: ebs.csi.aws.com
parameters: {iops: "4000", throughput: "250"}
"#;

/// A claim of `ebs-gp3-xfs` named `name`, of `size`, with `spec` merged in
/// (`dataSource`, `accessModes`, `volumeMode`) and the label `group: app`.
fn claim(name: &str, size: &str, spec: &serde_json::Value) -> String {
    let mut claim = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": {"group": "app"}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "ebs-gp3-xfs",
            "resources": {"requests": {"storage": size}},
        },
    });
    for (key, value) in spec.as_object().expect("an object") {
        claim["spec"][key] = value.clone();
    }
    claim.to_string()
}

/// A pod that runs until it is deleted, with `claims` (see [`pod`]).
fn running_pod(ns: &Namespace<'_>, name: &str, claims: &[(&str, &str)]) {
    ns.apply(&pod(name, "trap 'exit 0' TERM; sleep 3600 & wait", claims, &json!({})));
    ns.wait_for("pod", name, "{.status.phase}", "Running", Duration::from_secs(180));
}

/// The EBS volume bound to the claim `name`.
fn volume_of(ns: &Namespace<'_>, name: &str) -> String {
    let pv = ns.get("pvc", name, "{.spec.volumeName}");
    ns.get("pv", &pv, "{.spec.csi.volumeHandle}")
}

/// The PersistentVolumes whose claims are in `ns` (kubectl lists every
/// PersistentVolume: they belong to the whole cluster).
fn volumes_of_claims_in(ns: &Namespace<'_>) -> Vec<String> {
    let claimed = ns.kubectl(&[
        "get",
        "pv",
        "-o",
        r#"jsonpath={range .items[*]}{.spec.claimRef.namespace} {.metadata.name}{"\n"}{end}"#,
    ]);
    claimed
        .lines()
        .filter_map(|line| line.strip_prefix(&format!("{} ", ns.name())))
        .map(str::to_owned)
        .collect()
}

/// The size in KiB of the filesystem mounted at `path` in the pod `name`.
fn filesystem_kib(ns: &Namespace<'_>, name: &str, path: &str) -> u64 {
    let df = ns.exec(name, &format!("df -k {path} | tail -n 1"));
    df.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("df: {df}"))
}

/// A claim grown while mounted, changed to another VolumeAttributesClass,
/// snapshotted and restored, and with a second claim snapshotted as a
/// group and restored, in `ns` ([`CLASSES`] applied).
pub fn a_mounted_claim_grows_changes_its_class_and_is_restored_from_snapshots(ns: &Namespace<'_>, driver: &Driver) {
    ns.apply(&claim("data", "1Gi", &json!({})));
    ns.apply(&claim("logs", "1Gi", &json!({})));
    running_pod(ns, "app", &[("data", "/data"), ("logs", "/logs")]);
    ns.exec("app", "echo data > /data/file && echo logs > /logs/file && sync");
    let volume = volume_of(ns, "data");
    let ec2 = |field: &str| {
        let described = driver.moto.ec2(REGION, "DescribeVolumes", &[("VolumeId.1", &volume)]);
        let (_, rest) = described.split_once(&format!("<{field}>")).expect(field);
        rest.split_once('<').expect(field).0.to_owned()
    };

    // Online expansion: the resizer grows the volume in EC2, kubelet the
    // filesystem the pod has mounted.
    let before = filesystem_kib(ns, "app", "/data");
    assert!(before < 1 << 20, "{before} KiB");
    ns.kubectl(&[
        "patch",
        "pvc",
        "data",
        "--patch",
        r#"{"spec": {"resources": {"requests": {"storage": "8Gi"}}}}"#,
    ]);
    ns.wait_for(
        "pvc",
        "data",
        "{.status.capacity.storage}",
        "8Gi",
        Duration::from_secs(120),
    );
    assert_eq!(ec2("size"), "8");
    poll_until("the pod to see the grown filesystem", Duration::from_secs(60), || {
        filesystem_kib(ns, "app", "/data") > 7 << 20
    });

    // A VolumeAttributesClass: EC2 shows its IOPS and throughput (4,000
    // IOPS: gp3 takes 500 per GiB, at least 3,000, so 8 GiB and more).
    ns.kubectl(&[
        "patch",
        "pvc",
        "data",
        "--patch",
        r#"{"spec": {"volumeAttributesClassName": "fast"}}"#,
    ]);
    ns.wait_for(
        "pvc",
        "data",
        "{.status.currentVolumeAttributesClassName}",
        "fast",
        Duration::from_secs(120),
    );
    assert_eq!((ec2("iops"), ec2("throughput")), ("4000".to_owned(), "250".to_owned()));

    // A snapshot, restored into a claim of its own.
    ns.apply(
        r#"{"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "metadata": {"name": "snap"},
            "spec": {"volumeSnapshotClassName": "ebs", "source": {"persistentVolumeClaimName": "data"}}}"#,
    );
    ns.wait_for(
        "volumesnapshot",
        "snap",
        "{.status.readyToUse}",
        "true",
        Duration::from_secs(120),
    );
    let from_snapshot =
        json!({"dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}});
    ns.apply(&claim("restored", "8Gi", &from_snapshot));
    assert_eq!(
        ns.run(
            "reader",
            &pod("reader", "cat /data/file", &[("restored", "/data")], &json!({}))
        ),
        "data\n"
    );

    // A group snapshot of both claims (label group: app): one snapshot of
    // each, restored together.
    ns.kubectl(&["label", "pvc", "restored", "group-"]);
    ns.apply(
        r#"{"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot", "metadata": {"name": "group"},
            "spec": {"volumeGroupSnapshotClassName": "ebs", "source": {"selector": {"matchLabels": {"group": "app"}}}}}"#,
    );
    ns.wait_for(
        "volumegroupsnapshot",
        "group",
        "{.status.readyToUse}",
        "true",
        Duration::from_secs(120),
    );
    let members = ns.kubectl(&[
        "get",
        "volumesnapshots",
        "-o",
        r#"jsonpath={range .items[?(@.status.volumeGroupSnapshotName=="group")]}{.metadata.name}{"\n"}{end}"#,
    ]);
    let members: Vec<&str> = members.lines().collect();
    assert_eq!(members.len(), 2, "{members:?}");
    // Each member is restored once it is ready, as a user would: the
    // csi-snapshotter's one-minute resync (the chart's --resync-period)
    // undoes snapshot-controller setting a ready member back to not ready.
    for member in &members {
        ns.wait_for(
            "volumesnapshot",
            member,
            "{.status.readyToUse}",
            "true",
            Duration::from_secs(150),
        );
    }
    for (i, member) in members.iter().enumerate() {
        let source =
            json!({"dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": member}});
        ns.apply(&claim(&format!("member-{i}"), "8Gi", &source));
    }
    let read = ns.run(
        "group-reader",
        &pod(
            "group-reader",
            "cat /a/file /b/file | sort",
            &[("member-0", "/a"), ("member-1", "/b")],
            &json!({}),
        ),
    );
    assert_eq!(read, "data\nlogs\n");

    ns.kubectl(&["delete", "pods", "--all", "--wait"]);
    ns.kubectl(&["delete", "volumegroupsnapshots,volumesnapshots,pvc", "--all", "--wait"]);
    poll_until(
        "every PersistentVolume of its claims to go",
        Duration::from_secs(120),
        || volumes_of_claims_in(ns).is_empty(),
    );
}

/// A raw block claim, a ReadWriteOncePod claim and a claim given to a
/// pod's fsGroup, each reaching its pods as asked, in `ns` ([`CLASSES`]
/// applied).
pub fn block_single_pod_and_fs_group_claims_reach_their_pods_as_asked(ns: &Namespace<'_>) {
    // A raw block claim: the device itself, never formatted, kept across pods.
    ns.apply(&claim("block", "1Gi", &json!({"volumeMode": "Block"})));
    let write = "head -c 4096 /dev/xvdb | tr -d '\\0' | wc -c && blockdev --getsize64 /dev/xvdb \
                 && printf kept | dd of=/dev/xvdb bs=512 seek=2048 conv=fsync 2>/dev/null";
    assert_eq!(
        ns.run(
            "block-writer",
            &pod("block-writer", write, &[("block", "/dev/xvdb")], &json!({}))
        ),
        "0\n1073741824\n"
    );
    let read = "dd if=/dev/xvdb bs=512 skip=2048 count=1 2>/dev/null | head -c 4";
    assert_eq!(
        ns.run(
            "block-reader",
            &pod("block-reader", read, &[("block", "/dev/xvdb")], &json!({}))
        ),
        "kept"
    );

    // ReadWriteOncePod: a second pod waits until the first is gone.
    ns.apply(&claim("only", "1Gi", &json!({"accessModes": ["ReadWriteOncePod"]})));
    running_pod(ns, "owner", &[("only", "/data")]);
    ns.apply(&pod("second", "echo in", &[("only", "/data")], &json!({})));
    poll_until("the second pod to be held back", Duration::from_secs(60), || {
        ns.events("second").contains("ReadWriteOncePod")
    });
    assert_eq!(ns.get("pod", "second", "{.status.phase}"), "Pending");
    ns.kubectl(&["delete", "pod", "owner", "--wait"]);
    ns.wait_for(
        "pod",
        "second",
        "{.status.phase}",
        "Succeeded",
        Duration::from_secs(180),
    );

    // fsGroup: kubelet gives the volume to the pod's group (the driver's
    // fsGroupPolicy File), so a pod of another user writes to it.
    ns.apply(&claim("shared", "1Gi", &json!({})));
    let script = "touch /data/file && stat -c '%u %g %a' /data /data/file";
    let security = json!({"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000});
    assert_eq!(
        ns.run("grouped", &pod("grouped", script, &[("shared", "/data")], &security)),
        "0 2000 2775\n1000 2000 644\n"
    );

    ns.kubectl(&["delete", "pods", "--all", "--wait"]);
    ns.kubectl(&["delete", "pvc", "--all", "--wait"]);
    poll_until(
        "every PersistentVolume of its claims to go",
        Duration::from_secs(120),
        || volumes_of_claims_in(ns).is_empty(),
    );
}
