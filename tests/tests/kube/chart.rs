//! The `standard` overlay installed from the Helm chart on a real node (#43;
//! `ebs_csi_tests::kube`): Kubernetes v1.35.4, the real sidecars at the
//! versions the chart pins (`tests/kube/sidecars.tsv`), the snapshot CRDs and
//! snapshot-controller of the pinned external-snapshotter, the project's two
//! images, and EC2 as moto behind serve.py on the node's address. The node
//! registers with the startup taint, as node groups register theirs, and a
//! taint of another owner; the test plays the AWS cloud controller manager
//! (providerID, zone and instance-type labels).
//!
//! Every pod of the chart becomes Ready with no container restarted (a
//! sidecar that refuses a flag the chart passes restarts), kubelet registers
//! the driver through the registrar (CSINode: the instance as the node id,
//! the zone as its topology, an attach limit), the agent removes the startup
//! taint through the real API server and keeps the other, the registrar's
//! own probe passes, and the uninstalled chart and the cluster leave nothing
//! behind. (The agent's retry of a taint patch that lost to another writer
//! stays with the API stand-in, `node_metadata.rs`, which can make one.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::time::Duration;

use ebs_csi_tests::kube::{Cluster, Driver, NODE_NAME, STARTUP_TAINT, driver_images};
use ebs_csi_tests::moto::ZONE;
use ebs_csi_tests::{require_root, wait_until};

#[test]
fn the_chart_installs_the_standard_overlay_on_a_real_node() {
    require_root();
    let taints = format!("{STARTUP_TAINT}=true:NoExecute,example.com/dedicated=storage:PreferNoSchedule");
    let cluster = Cluster::up_with(&[("NODE_TAINTS", &taints)], &driver_images());
    let driver = Driver::install(&cluster, false);
    driver.wait_until_ready(&cluster);
    let names = cluster.kubectl(&[
        "get",
        "pods",
        "--all-namespaces",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ]);
    for (prefix, replicas) in [
        ("ebs-csi-controller-", 2),
        ("ebs-csi-node-", 1),
        ("snapshot-controller-", 2),
    ] {
        assert_eq!(
            names.split(' ').filter(|n| n.starts_with(prefix)).count(),
            replicas,
            "{names}"
        );
    }

    let registered = cluster.kubectl(&[
        "get",
        "csinode",
        NODE_NAME,
        "-o",
        r#"jsonpath={.spec.drivers[?(@.name=="ebs.csi.aws.com")].nodeID} {.spec.drivers[?(@.name=="ebs.csi.aws.com")].topologyKeys} {.spec.drivers[?(@.name=="ebs.csi.aws.com")].allocatable.count}"#,
    ]);
    let fields: Vec<&str> = registered.split(' ').collect();
    assert_eq!(fields[0], driver.instance, "{registered}");
    assert!(fields[1].contains("topology.kubernetes.io/zone"), "{registered}");
    assert!(fields[2].parse::<u32>().is_ok_and(|n| n > 0), "{registered}");
    assert_eq!(
        cluster.kubectl(&[
            "get",
            "node",
            NODE_NAME,
            "-o",
            "jsonpath={.metadata.labels.topology\\.ebs\\.csi\\.aws\\.com/zone}"
        ]),
        ZONE
    );
    // The agent removes the startup taint and keeps every other.
    let taints = || cluster.kubectl(&["get", "node", NODE_NAME, "-o", "jsonpath={.spec.taints[*].key}"]);
    wait_until("the startup taint to go", Duration::from_secs(60), || {
        !taints().contains(STARTUP_TAINT)
    });
    assert_eq!(taints(), "example.com/dedicated");

    // The registrar's exec probe, as kubelet runs it.
    let node_pod = cluster.kubectl(&[
        "get",
        "pods",
        "-n",
        "kube-system",
        "-l",
        "app=ebs-csi-node",
        "-o",
        "name",
    ]);
    cluster.kubectl(&[
        "exec",
        "-n",
        "kube-system",
        node_pod.trim(),
        "-c",
        "node-driver-registrar",
        "--",
        "/csi-node-driver-registrar",
        &format!(
            "--kubelet-registration-path={}/plugins/ebs.csi.aws.com/csi.sock",
            cluster.dir().join("kubelet").display()
        ),
        "--mode=kubelet-registration-probe",
    ]);

    driver.assert_logs_are_clean(&cluster);
    cluster.helm(&["uninstall", "ebs-csi", "--namespace", "kube-system", "--wait"]);
    cluster.down();
}
