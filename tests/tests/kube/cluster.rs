//! The cluster itself (`ebs_csi_tests::kube`): Kubernetes v1.35.4 built from
//! its module, Debian's containerd, runc and the CNI bridge. Its node is
//! Ready, a pod on the bridge reaches the API server through the
//! `kubernetes` Service (kube-proxy's DNAT) with the token the controller
//! manager's service-account machinery gives it, a second cluster is refused
//! before it touches the first, an image nobody built is never run — and
//! down leaves nothing behind.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ebs_csi_tests::kube::{BRIDGE, BUSYBOX, Cluster, NODE_IP, NODE_NAME, poll_until};
use ebs_csi_tests::{mounts_under, repository};

/// What the cluster may leave outside its directory, each printed as it is
/// now: the node's address, the bridge, the iptables chains kube-proxy and
/// kubelet make, containerd's and CNI's fixed directories, the cgroups
/// kubelet makes, a containerd shim, /dev's propagation (made shared), a
/// file in /dev (a termination message file a container made there).
pub fn outside_state() -> Vec<String> {
    let run = |program: &str, args: &[&str]| {
        String::from_utf8(Command::new(program).args(args).output().unwrap().stdout).unwrap()
    };
    let mut state = vec![
        format!(
            "address on lo: {}",
            run("ip", &["-brief", "address", "show", "dev", "lo"]).contains(NODE_IP)
        ),
        format!("bridge: {}", Path::new("/sys/class/net").join(BRIDGE).exists()),
        format!("containerd shims: {}", run("pgrep", &["-c", "containerd-shim"]).trim()),
        format!("/dev: {}", run("findmnt", &["-no", "PROPAGATION", "/dev"]).trim()),
        format!("/dev/termination-log: {}", Path::new("/dev/termination-log").exists()),
    ];
    for program in ["iptables-save", "ip6tables-save"] {
        let chains: Vec<_> = run(program, &[])
            .lines()
            .filter(|l| l.contains("KUBE-"))
            .map(str::to_owned)
            .collect();
        state.push(format!("{program}: {chains:?}"));
    }
    for path in [
        "/run/containerd",
        "/var/lib/cni",
        "/var/log/containers",
        "/run/netns",
        "/sys/fs/cgroup/memory/kubepods",
    ] {
        state.push(format!("{path}: {}", Path::new(path).exists()));
    }
    state
}

/// The pod `name`'s phase.
fn phase(cluster: &Cluster, name: &str) -> String {
    cluster.kubectl(&["get", "pod", name, "-o", "jsonpath={.status.phase}"])
}

/// The node runs the version built, a pod reaches the API server, an
/// image the tests did not build is never pulled, and a second cluster is
/// refused before it touches this one.
pub fn runs_a_pod_that_reaches_its_api_server_and_pulls_nothing(cluster: &Cluster) {
    let dir = cluster.dir();
    let info = cluster.kubectl(&[
        "get",
        "node",
        NODE_NAME,
        "-o",
        "jsonpath={.status.nodeInfo.kubeletVersion} {.status.nodeInfo.containerRuntimeVersion}",
    ]);
    assert!(info.starts_with("v1.35.4 containerd://1.6."), "{info}");

    cluster.kubectl_with(
        &["apply", "-f", "-"],
        &format!(
            r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "probe"}},
              "spec": {{"restartPolicy": "Never", "dnsPolicy": "Default", "containers": [{{
                "name": "probe", "image": "{BUSYBOX}",
                "args": ["sh", "-c", "test -s /var/run/secrets/kubernetes.io/serviceaccount/token && nc -w 5 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT </dev/null && echo reached the API server"]}}]}}}}"#
        ),
    );
    poll_until("the probe pod to end", Duration::from_secs(60), || {
        matches!(phase(cluster, "probe").as_str(), "Succeeded" | "Failed")
    });
    assert_eq!(cluster.kubectl(&["logs", "probe"]), "reached the API server\n");
    assert_eq!(phase(cluster, "probe"), "Succeeded");

    // Nothing is pulled: an image the tests did not build is never run,
    // and the pod's events name it.
    cluster.kubectl(&[
        "run",
        "unbuilt",
        "--image",
        "registry.k8s.io/not-built:1",
        "--restart",
        "Never",
    ]);
    poll_until("the pull's failure", Duration::from_secs(60), || {
        cluster
            .kubectl(&[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=unbuilt",
                "-o",
                "jsonpath={.items[*].message}",
            ])
            .contains("Failed to pull image \"registry.k8s.io/not-built:1\"")
    });
    cluster.kubectl(&["delete", "pods", "probe", "unbuilt", "--wait"]);

    // A second cluster is refused before it touches the first.
    let second = Command::new(repository().join("tests/kube/cluster.sh"))
        .args(["up", &format!("{}-second", dir.display())])
        .env("KUBE_BIN", ebs_csi_tests::go_tool("kubelet").parent().unwrap())
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&second.stderr),
        format!("cluster.sh: another cluster runs on this machine ({NODE_IP} is on lo)\n")
    );
    assert!(!Path::new(&format!("{}-second", dir.display())).exists());
    cluster.kubectl(&[
        "wait",
        "--for",
        "condition=Ready",
        "--timeout",
        "10s",
        &format!("node/{NODE_NAME}"),
    ]);
}

/// Tears `cluster` down and asserts that it left nothing: the state
/// outside its directory as it was `before` it started, its directory and
/// mounts gone, none of its processes left.
pub fn goes_and_leaves_nothing(cluster: Cluster, before: &[String]) {
    let dir = cluster.dir();
    let sandbox = dir.parent().unwrap().to_owned();
    cluster.down();
    assert_eq!(outside_state(), before);
    assert!(!dir.exists());
    assert_eq!(mounts_under(&sandbox), Vec::<String>::new());
    let left = Command::new("pgrep")
        .args(["-f", &dir.to_string_lossy()])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&left.stdout),
        "",
        "processes of the cluster outlived it"
    );
}
