//! The `standard` overlay installed from the Helm chart on a real node (#43;
//! `ebs_csi_tests::kube`): Kubernetes v1.35.4, the real sidecars at the
//! versions the chart pins (`tests/kube/sidecars.tsv`), the snapshot CRDs and
//! snapshot-controller of the pinned external-snapshotter, the project's two
//! images, and EC2 as moto behind serve.py on the node's address. The node
//! registers with the startup taint, as node groups register theirs; the
//! test then plays the AWS cloud controller manager (providerID, zone and
//! instance-type labels).
//!
//! Every pod of the chart becomes Ready with no container restarted (a
//! sidecar that refuses a flag the chart passes restarts), kubelet registers
//! the driver through the registrar (CSINode: the instance as the node id,
//! the zone as its topology, an attach limit), the agent removes the startup
//! taint through the real API server, the registrar's own probe passes, and
//! the uninstalled chart and the cluster leave nothing behind.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::time::Duration;

use ebs_csi_tests::kube::{Cluster, NODE_IP, NODE_NAME, driver_images};
use ebs_csi_tests::moto::{Moto, REGION, ZONE};
use ebs_csi_tests::{repository, require_root, wait_until};

const TAINT: &str = "ebs.csi.aws.com/agent-not-ready";

#[test]
fn the_chart_installs_the_standard_overlay_on_a_real_node() {
    require_root();
    let cluster = Cluster::up_with(&[("NODE_TAINTS", &format!("{TAINT}=true:NoExecute"))], &driver_images());
    let moto = Moto::start_on(NODE_IP, &[]);
    let instance = moto.run_instance(REGION, ZONE);

    // What the AWS cloud controller manager would set.
    cluster.kubectl(&[
        "patch",
        "node",
        NODE_NAME,
        "--patch",
        &format!(r#"{{"spec": {{"providerID": "aws:///{ZONE}/{instance}"}}}}"#),
    ]);
    cluster.kubectl(&[
        "label",
        "node",
        NODE_NAME,
        &format!("topology.kubernetes.io/zone={ZONE}"),
        &format!("topology.kubernetes.io/region={REGION}"),
        "node.kubernetes.io/instance-type=m5.large",
    ]);

    cluster.install_snapshot_controller();
    let kubelet = cluster.dir().join("kubelet");
    let env = format!(
        r#"[{{"name": "AWS_ENDPOINT_URL_EC2", "value": "{0}"}}, {{"name": "AWS_ENDPOINT_URL_EBS", "value": "{0}"}},
            {{"name": "AWS_ACCESS_KEY_ID", "value": "testing"}}, {{"name": "AWS_SECRET_ACCESS_KEY", "value": "testing"}}]"#,
        moto.endpoint
    );
    cluster.helm(&[
        "install",
        "ebs-csi",
        &repository().join("charts/aws-ebs-csi-driver").to_string_lossy(),
        "--namespace",
        "kube-system",
        "--values",
        &repository()
            .join("deploy/kubernetes/overlays/standard/values.yaml")
            .to_string_lossy(),
        "--set",
        &format!("node.kubeletPath={},controller.region={REGION}", kubelet.display()),
        "--set-json",
        &format!("controller.env={env}"),
    ]);

    let pods = || cluster.kubectl(&["get", "pods", "--all-namespaces", "-o", "wide"]);
    wait_until("every pod Ready", Duration::from_secs(180), || {
        let statuses = cluster.kubectl(&[
            "get",
            "pods",
            "--all-namespaces",
            "-o",
            r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
        ]);
        !statuses.is_empty() && statuses.lines().all(|s| s == "True")
    });
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
            "{}",
            pods()
        );
    }
    let restarts = cluster.kubectl(&[
        "get",
        "pods",
        "--all-namespaces",
        "-o",
        r#"jsonpath={range .items[*].status.containerStatuses[*]}{.name} {.restartCount}{"\n"}{end}"#,
    ]);
    assert!(
        restarts.lines().all(|l| l.ends_with(" 0")),
        "containers restarted:\n{restarts}\n{}",
        pods()
    );

    let driver = cluster.kubectl(&[
        "get",
        "csinode",
        NODE_NAME,
        "-o",
        r#"jsonpath={.spec.drivers[?(@.name=="ebs.csi.aws.com")].nodeID} {.spec.drivers[?(@.name=="ebs.csi.aws.com")].topologyKeys} {.spec.drivers[?(@.name=="ebs.csi.aws.com")].allocatable.count}"#,
    ]);
    let fields: Vec<&str> = driver.split(' ').collect();
    assert_eq!(fields[0], instance, "{driver}");
    assert!(fields[1].contains("topology.kubernetes.io/zone"), "{driver}");
    assert!(fields[2].parse::<u32>().is_ok_and(|n| n > 0), "{driver}");
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
    wait_until("the startup taint to go", Duration::from_secs(60), || {
        !cluster
            .kubectl(&["get", "node", NODE_NAME, "-o", "jsonpath={.spec.taints}"])
            .contains(TAINT)
    });

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
            kubelet.display()
        ),
        "--mode=kubelet-registration-probe",
    ]);

    cluster.helm(&["uninstall", "ebs-csi", "--namespace", "kube-system", "--wait"]);
    cluster.down();
}
