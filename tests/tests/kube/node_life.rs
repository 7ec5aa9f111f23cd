//! The node's life around a mounted volume: kubelet restarted (as systemd
//! restarts it on an upgrade) keeps the pod's volume mounted and takes it
//! down afterwards from what it reconstructs; the node pod (the agent and
//! the helper) replaced as a volume is attached, kubelet's stage waits for
//! the new one and the pod gets its volume; a drain that ends the node pod
//! with the pods it evicts, whose preStop keeps the node pod until their
//! volumes are detached. Under the `hardened` overlay the node pod holds
//! no helper: the host's is restarted with it, as a package upgrade
//! restarts both.

use std::time::{Duration, Instant};

use ebs_csi_tests::kube::{Cluster, Driver, NODE_NAME, Namespace, poll_until};
use ebs_csi_tests::moto::REGION;
use ebs_csi_tests::{kubelet_staging_hash, mounts_under};

use crate::volumes::{self, CLASS_AND_CLAIM};

/// A pod that writes `kept` to its claim at /data and runs until deleted.
fn writer(name: &str) -> String {
    volumes::pod(
        name,
        "echo kept > /data/file && sync && trap 'exit 0' TERM; sleep 3600 & wait",
    )
}

/// The claim `data` in `ns` and the pod `app` that wrote to it, running:
/// the claim's PersistentVolume and EBS volume.
fn running_writer(ns: &Namespace<'_>) -> (String, String) {
    ns.apply(CLASS_AND_CLAIM);
    ns.apply(&writer("app"));
    ns.wait_for("pod", "app", "{.status.phase}", "Running", Duration::from_secs(180));
    let pv = ns.get("pvc", "data", "{.spec.volumeName}");
    let volume = ns.get("pv", &pv, "{.spec.csi.volumeHandle}");
    (pv, volume)
}

/// The mounts under kubelet's directory of the PersistentVolume `pv`: its
/// staging mount and its pod's.
fn mounts_of(cluster: &Cluster, pv: &str, volume: &str) -> Vec<String> {
    let staging = kubelet_staging_hash(volume);
    mounts_under(&cluster.dir().join("kubelet"))
        .into_iter()
        .filter(|m| m.contains(pv) || m.contains(&staging))
        .collect()
}

/// The agent's log lines that take `volume` down.
fn takedowns(cluster: &Cluster, volume: &str) -> usize {
    let log = cluster.kubectl(&[
        "logs",
        "-n",
        "kube-system",
        "-l",
        "app=ebs-csi-node",
        "-c",
        "ebs-plugin",
        "--tail=-1",
    ]);
    log.lines()
        .filter(|l| l.contains(volume) && (l.contains("unpublishing") || l.contains("unstaging")))
        .count()
}

/// The claim `data` of `ns` deleted with its pods: its PersistentVolume,
/// its VolumeAttachment and its EC2 volume go.
fn claim_goes(cluster: &Cluster, ns: &Namespace<'_>, driver: &Driver, pv: &str, volume: &str) {
    ns.kubectl(&["delete", "pods", "--all", "--wait"]);
    // The pod is gone once kubelet has unpublished; it unstages after.
    poll_until("kubelet to unstage the volume", Duration::from_secs(60), || {
        mounts_of(cluster, pv, volume).is_empty()
    });
    ns.kubectl(&["delete", "pvc", "data", "--wait"]);
    poll_until("the PersistentVolume to go", Duration::from_secs(120), || {
        !cluster.kubectl(&["get", "pv", "-o", "name"]).contains(pv)
    });
    poll_until("the volume to go from EC2", Duration::from_secs(60), || {
        driver
            .moto
            .ec2(REGION, "DescribeVolumes", &[("VolumeId.1", volume)])
            .contains("InvalidVolume.NotFound")
    });
}

/// Every scenario, one after another (each disturbs the whole node), in
/// namespaces named with `suffix`; `restart_helper` restarts the helper
/// where the node pod does not hold it, as the node pod is replaced.
pub fn every_scenario(cluster: &Cluster, driver: &Driver, suffix: &str, restart_helper: &mut dyn FnMut()) {
    kubelet_restarted_keeps_a_mounted_volume(&cluster.namespace(&format!("kubelet-restart{suffix}")), driver);
    the_node_pod_replaced_as_a_volume_attaches(
        &cluster.namespace(&format!("node-pod-restart{suffix}")),
        driver,
        restart_helper,
    );
    a_drain_keeps_the_node_pod_until_its_volume_detaches(&cluster.namespace(&format!("drain{suffix}")), driver);
}

/// kubelet restarted with a pod's volume mounted.
fn kubelet_restarted_keeps_a_mounted_volume(ns: &Namespace<'_>, driver: &Driver) {
    let cluster = ns.cluster();
    let (pv, volume) = running_writer(ns);
    let mounted = mounts_of(cluster, &pv, &volume);
    assert_eq!(mounted.len(), 2, "{mounted:?}");
    let taken_down = takedowns(cluster, &volume);

    cluster.restart_kubelet();
    // kubelet learns its pods from the API server once it runs again, and
    // serves an exec only for a pod it has: the node's Ready condition,
    // which cluster.sh waits for, can still be the old kubelet's. Its own
    // list (/pods, through the API server's node proxy) says when.
    let pods = format!("/api/v1/nodes/{NODE_NAME}/proxy/pods");
    let listed = format!(r#""namespace":"{}""#, ns.name());
    poll_until("kubelet to list the pod again", Duration::from_secs(60), || {
        cluster.kubectl(&["get", "--raw", &pods]).contains(&listed)
    });
    // kubelet reconstructs its volumes from what it finds mounted and its
    // records, and syncs its pods every 10 s (syncFrequency): through one
    // and a bit, the volume stays mounted, the pod reads its data, and the
    // driver is asked to take nothing down.
    let until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < until {
        assert_eq!(ns.exec("app", "cat /data/file"), "kept\n");
        assert_eq!(mounts_of(cluster, &pv, &volume), mounted);
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(takedowns(cluster, &volume), taken_down);
    claim_goes(cluster, ns, driver, &pv, &volume);
}

/// The node pod replaced (and the helper restarted with it,
/// `restart_helper`) as its volume is attached.
fn the_node_pod_replaced_as_a_volume_attaches(ns: &Namespace<'_>, driver: &Driver, restart_helper: &mut dyn FnMut()) {
    let cluster = ns.cluster();
    ns.apply(CLASS_AND_CLAIM);
    ns.apply(&writer("app"));
    poll_until("the claim's volume to be attached", Duration::from_secs(120), || {
        let attached = cluster.kubectl(&[
            "get",
            "volumeattachments",
            "-o",
            r#"jsonpath={range .items[?(@.status.attached==true)]}{.spec.source.persistentVolumeName}{"\n"}{end}"#,
        ]);
        let pv = ns.get("pvc", "data", "{.spec.volumeName}");
        !pv.is_empty() && attached.lines().any(|l| l == pv)
    });
    cluster.kubectl(&[
        "delete",
        "pods",
        "-n",
        "kube-system",
        "-l",
        "app=ebs-csi-node",
        "--wait=false",
    ]);
    restart_helper();
    ns.wait_for("pod", "app", "{.status.phase}", "Running", Duration::from_secs(180));
    assert_eq!(ns.exec("app", "cat /data/file"), "kept\n");
    driver.wait_until_ready(cluster);
    let pv = ns.get("pvc", "data", "{.spec.volumeName}");
    let volume = ns.get("pv", &pv, "{.spec.csi.volumeHandle}");
    claim_goes(cluster, ns, driver, &pv, &volume);
}

/// A drain as a node's scale-down does it: the node cordoned, its pod with
/// a volume evicted and, once kubelet has unstaged the volume (the node's
/// `volumesInUse` no longer names it), the node pod ended as the instance's
/// shutdown ends it, while EC2 detaches the volume (`detaching` for
/// [`ebs_csi_tests::kube::DETACH_SECONDS`]). The node pod's preStop
/// (`ebs-csi-agent pre-stop`) keeps it until the volume is detached: its
/// VolumeAttachment goes while the node pod is still there.
fn a_drain_keeps_the_node_pod_until_its_volume_detaches(ns: &Namespace<'_>, driver: &Driver) {
    let cluster = ns.cluster();
    let (pv, volume) = running_writer(ns);
    let old = cluster.node_pods("{.items[*].metadata.name}");

    cluster.kubectl(&["cordon", NODE_NAME]);
    ns.kubectl(&["delete", "pod", "app", "--wait"]);
    poll_until("kubelet to unstage the volume", Duration::from_secs(60), || {
        !cluster
            .kubectl(&["get", "node", NODE_NAME, "-o", "jsonpath={.status.volumesInUse}"])
            .contains(&volume)
    });
    cluster.kubectl(&["delete", "pod", "-n", "kube-system", &old, "--wait=false"]);
    assert!(
        volumes::attached_volumes(ns).contains(&pv),
        "the volume was detached before the node pod was ended: nothing to wait for"
    );
    let mut detached_before_it_went = None;
    poll_until("the old node pod to go", Duration::from_secs(120), || {
        let there = cluster
            .node_pods("{.items[*].metadata.name}")
            .split(' ')
            .any(|p| p == old);
        if detached_before_it_went.is_none() && !volumes::attached_volumes(ns).contains(&pv) {
            detached_before_it_went = Some(there);
        }
        !there
    });
    assert_eq!(
        detached_before_it_went,
        Some(true),
        "the node pod went before its volume was detached"
    );
    cluster.kubectl(&["uncordon", NODE_NAME]);
    driver.wait_until_ready(cluster);
    assert_eq!(mounts_of(cluster, &pv, &volume), Vec::<String>::new());
    claim_goes(cluster, ns, driver, &pv, &volume);
}
