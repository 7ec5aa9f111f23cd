//! The `standard` overlay installed from the Helm chart on the real node:
//! the real sidecars at the versions the chart pins
//! (`tests/kube/sidecars.tsv`), the snapshot CRDs and snapshot-controller of
//! the pinned external-snapshotter, the project's two images, and EC2 as
//! moto behind serve.py on the node's address. The node registers with the
//! startup taint, as node groups register theirs, and a taint of another
//! owner; the test plays the AWS cloud controller manager (providerID, zone
//! and instance-type labels).
//!
//! Every pod of the chart becomes Ready with no container restarted (a
//! sidecar that refuses a flag the chart passes restarts), kubelet registers
//! the driver through the registrar (CSINode: the instance as the node id,
//! the zone as its topology, an attach limit), the agent removes the startup
//! taint through the real API server and keeps the other, the agent reads
//! its Node from outside the cluster with the cluster's kubeconfig
//! (`--kubeconfig`), the controller's metadata labeler labels the Node
//! holding its Lease, and the registrar's own probe passes. (The agent's
//! retry of a taint patch that lost to another writer stays with the API
//! stand-in, `node_metadata.rs`, which can make one.)

use std::process::Command;
use std::time::Duration;

use ebs_csi_tests::binary;
use ebs_csi_tests::kube::{Cluster, Driver, NODE_NAME, STARTUP_TAINT, poll_until};
use ebs_csi_tests::moto::ZONE;

/// The taints the node registers with: the driver's startup taint and
/// another owner's (`cluster.sh`'s `NODE_TAINTS`).
pub fn node_taints() -> String {
    format!("{STARTUP_TAINT}=true:NoExecute,{OTHER_TAINT}=storage:PreferNoSchedule")
}

/// Another owner's taint, which the agent keeps.
const OTHER_TAINT: &str = "example.com/dedicated";

/// Once `driver` is ready: its pods, its CSINode, the node's zone label,
/// the taints and the registrar's probe.
pub fn installs_the_standard_overlay(cluster: &Cluster, driver: &Driver) {
    let names = cluster.kubectl(&[
        "get",
        "pods",
        "--all-namespaces",
        // Not one kubelet rejected and its ReplicaSet replaced.
        "--field-selector=status.phase!=Failed",
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
    poll_until("the startup taint to go", Duration::from_secs(60), || {
        !taints().contains(STARTUP_TAINT)
    });
    assert_eq!(taints(), OTHER_TAINT);

    // The agent's Kubernetes client outside the cluster, as `--kubeconfig`
    // gives it: the cluster's own admin kubeconfig (flow mappings, a CA
    // file, a token), against the real API server.
    let outside = Command::new(binary("ebs-csi-agent"))
        .args(["--metadata-sources", "kubernetes", "--kubeconfig"])
        .arg(cluster.dir().join("admin.kubeconfig"))
        .arg("metadata")
        .env("CSI_NODE_NAME", NODE_NAME)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("ebs-csi-agent metadata");
    let summary = String::from_utf8_lossy(&outside.stdout);
    assert!(
        outside.status.success()
            && summary.starts_with(&format!(
                "instance id\t{}\navailability zone\t{ZONE}\n",
                driver.instance
            )),
        "{outside:?}"
    );

    // The metadata labeler (sidecars.metadataLabeler.enabled): one of the
    // two replicas holds its Lease and labels the Node from EC2, the
    // instance's one interface and no volume besides the root.
    let labels = || {
        cluster.kubectl(&[
            "get",
            "node",
            NODE_NAME,
            "-o",
            r"jsonpath={.metadata.labels.ebs\.csi\.aws\.com/enis-count} {.metadata.labels.ebs\.csi\.aws\.com/non-csi-ebs-volumes-count}",
        ])
    };
    poll_until("the metadata labeler's labels", Duration::from_secs(60), || {
        labels() == "1 0"
    });
    let holder = cluster.kubectl(&[
        "get",
        "lease",
        "--namespace=kube-system",
        "metadata-labeler-ebs.csi.aws.com",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert!(
        holder.starts_with("ebs-csi-controller-") && names.split(' ').any(|name| name == holder),
        "{holder} among {names}"
    );

    // The registrar's exec probe, as kubelet runs it.
    let node_pod = cluster.node_pods("{.items[*].metadata.name}");
    cluster.kubectl(&[
        "exec",
        "-n",
        "kube-system",
        &node_pod,
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
}
