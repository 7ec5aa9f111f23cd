//! `ebs-csi-agent pre-stop` (the DaemonSet's preStop hook) against
//! `tests/kube-api/serve.py`: on a rollout it returns at once; while the
//! node is drained (`kubectl drain` sets `spec.unschedulable`; Karpenter
//! and Cluster Autoscaler taint it) it waits until the attach/detach
//! controller has deleted every VolumeAttachment of this driver naming the
//! node (storage.k8s.io/v1: `spec.attacher`, `spec.nodeName`), as the Go
//! driver's `pre-stop-hook` does.
//!
//! What these tests assume of their world, and where it is broken: the
//! Node exists (and is gone), the cluster holds attachments of other nodes
//! and of other drivers beside this node's, and the attachments go while
//! the step waits (or never go).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ebs_csi_tests::binary;
use ebs_csi_tests::kube_api::{KubeApi, NODE_NAME};
use serde_json::{Value, json};

/// A VolumeAttachment as the attach/detach controller makes it (`kubectl
/// get volumeattachment -o json`, storage.k8s.io/v1).
fn attachment(name: &str, attacher: &str, node: &str) -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttachment",
        "metadata": {"name": name, "resourceVersion": "912400"},
        "spec": {"attacher": attacher, "nodeName": node, "source": {"persistentVolumeName": format!("pv-{name}")}},
        "status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/xvdaa"}}
    })
}

/// This node's EBS attachment, another node's, and another driver's on
/// this node.
fn cluster() -> Value {
    json!([
        attachment("csi-ours", "ebs.csi.aws.com", NODE_NAME),
        attachment(
            "csi-other-node",
            "ebs.csi.aws.com",
            "ip-10-0-9-9.eu-west-1.compute.internal"
        ),
        attachment("csi-other-driver", "efs.csi.aws.com", NODE_NAME),
    ])
}

/// `ebs-csi-agent pre-stop [args]` as node `node` against `api`.
fn pre_stop(api: &KubeApi, node: &str, args: &[&str]) -> Command {
    let mut command = Command::new(binary("ebs-csi-agent"));
    command
        .arg("--service-account-dir")
        .arg(api.service_account_dir())
        .arg("pre-stop")
        .args(args)
        .env("CSI_NODE_NAME", node)
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", api.port.to_string())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Waits up to `timeout` for `child`; panics if it still runs.
fn finished(child: Child, timeout: Duration) -> Output {
    let deadline = Instant::now() + timeout;
    let mut child = child;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!(
                "pre-stop still running after {timeout:?}: {:?}",
                child.wait_with_output().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn attachment_lists(api: &KubeApi) -> usize {
    api.requests()
        .lines()
        .filter(|l| l.starts_with("GET /apis/storage.k8s.io/v1/volumeattachments "))
        .count()
}

#[test]
fn on_a_rollout_the_step_returns_at_once() {
    let attachments = cluster().to_string();
    let api = KubeApi::start_with(&["--volume-attachments", &attachments]);
    let output = finished(pre_stop(&api, NODE_NAME, &[]).spawn().unwrap(), Duration::from_secs(10));
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    assert!(log.contains("pre-stop: the node is not being drained"), "{log}");
    assert_eq!(attachment_lists(&api), 0, "{}", api.requests());
}

#[test]
fn while_drained_the_step_waits_for_this_nodes_attachments_only() {
    let drains: [&[&str]; 3] = [
        &["--unschedulable"],
        &[
            "--taints",
            r#"[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]"#,
        ],
        &[
            "--taints",
            r#"[{"key": "ToBeDeletedByClusterAutoscaler", "value": "1732450000", "effect": "NoSchedule"}]"#,
        ],
    ];
    for drain in drains {
        let attachments = cluster().to_string();
        let api = KubeApi::start_with(&[drain, &["--volume-attachments", &attachments][..]].concat());
        let mut child = pre_stop(&api, NODE_NAME, &[]).spawn().unwrap();
        let started = Instant::now();
        ebs_csi_tests::wait_until("a second list", Duration::from_secs(10), || attachment_lists(&api) >= 2);
        assert!(
            child.try_wait().unwrap().is_none(),
            "{drain:?}: returned with csi-ours attached"
        );
        // The attach/detach controller deletes this node's attachment; the
        // others stay.
        let left: Vec<Value> = cluster().as_array().unwrap()[1..].to_vec();
        api.set_volume_attachments(&Value::Array(left));
        let output = finished(child, Duration::from_secs(10));
        let log = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{drain:?}: {log}");
        assert!(log.contains("pre-stop: the node is being drained"), "{log}");
        assert!(log.contains(r#"names=["csi-ours"]"#), "{log}");
        assert!(log.contains("pre-stop: no VolumeAttachment names this node"), "{log}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}

#[test]
fn a_node_that_is_gone_is_waited_for_and_the_wait_is_bounded() {
    let attachments = json!([attachment(
        "csi-gone",
        "ebs.csi.aws.com",
        "ip-10-0-7-7.eu-west-1.compute.internal"
    )]);
    let api = KubeApi::start_with(&["--volume-attachments", &attachments.to_string()]);
    let child = pre_stop(
        &api,
        "ip-10-0-7-7.eu-west-1.compute.internal",
        &["--timeout-seconds", "3"],
    )
    .spawn()
    .unwrap();
    let output = finished(child, Duration::from_secs(10));
    let log = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{log}");
    assert!(log.contains("pre-stop: the Node is gone"), "{log}");
    assert!(
        log.contains("Error: pre-stop\n\nCaused by:\n    after 3 s, VolumeAttachments still name this node: csi-gone"),
        "{log}"
    );
}

#[test]
fn without_kubernetes_there_is_nothing_to_wait_for() {
    let output = Command::new(binary("ebs-csi-agent"))
        .arg("pre-stop")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    assert!(log.contains("pre-stop: not on Kubernetes"), "{log}");
}
