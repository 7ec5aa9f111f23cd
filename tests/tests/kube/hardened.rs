//! The `hardened` overlay on the same node: the helper runs on the host, as
//! its systemd unit runs it (`docs/install-systemd.md`), and the chart,
//! upgraded to the overlay's values, gives the node pod no helper container
//! and no privileged one: the agent reaches the host's helper through
//! `/run/ebs-csi`, on nodes labelled `ebs.csi.aws.com/helper=installed`.
//! Every scenario (`main.rs`) then runs through the host's helper.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ebs_csi_tests::kube::{Cluster, Driver, NODE_NAME, poll_until};
use ebs_csi_tests::{Process, binary, repository, spawn};

use crate::volumes;

/// Where the chart's `hardened` node pod finds the helper's socket (its
/// `helper-socket` hostPath), as `ebs-csi-helper.socket` makes it.
const SOCKET_DIR: &str = "/run/ebs-csi";

/// The uid and group the chart runs the agent as, the helper's
/// `--allowed-uid` and `--socket-group`.
const AGENT_ID: &str = "990";

/// The helper on the host, as its unit runs it with this node's
/// arguments (its kubelet directory, the attach simulator's loop devices):
/// the process and each earlier one's log.
pub struct HostHelper {
    dir: PathBuf,
    process: Option<Process>,
    logs: Vec<String>,
}

impl HostHelper {
    /// Starts it, its log `host-helper-N.log` in the cluster's directory
    /// (N: how many ran before it).
    fn start(dir: PathBuf) -> Self {
        let mut helper = Self {
            dir,
            process: None,
            logs: Vec::new(),
        };
        helper.spawn();
        helper
    }

    fn spawn(&mut self) {
        std::fs::create_dir_all(SOCKET_DIR).unwrap();
        let socket = Path::new(SOCKET_DIR).join("helper.sock");
        let mut command = Command::new(binary("ebs-csi-helper"));
        command
            .arg("--socket")
            .arg(&socket)
            .args(["--socket-group", AGENT_ID, "--allowed-uid", AGENT_ID, "--allowed-root"])
            .arg(self.dir.join("kubelet"))
            .arg("--allow-loop-devices");
        let log = self.dir.join(format!("host-helper-{}.log", self.logs.len()));
        self.process = Some(spawn("host helper", command, log, &socket));
    }

    /// Restarts it as systemd restarts the unit (on a package upgrade):
    /// SIGTERM, then the same command line.
    pub fn restart(&mut self) {
        let stopped = self.process.take().expect("a running host helper");
        let log = stopped.log();
        drop(stopped);
        self.logs.push(log);
        self.spawn();
    }

    /// Asserts that it served the volume `volume` and that no run of it
    /// warned of anything but the refusals the scenarios provoke
    /// ([`volumes::PROVOKED`]), and stops it.
    pub fn served(mut self, volume: &str) {
        let stopped = self.process.take().expect("a running host helper");
        self.logs.push(stopped.log());
        drop(stopped);
        let log = self.logs.join("");
        assert!(log.contains(volume), "the host's helper never saw {volume}:\n{log}");
        let warned: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .filter(|l| !volumes::PROVOKED.iter().any(|(text, _)| l.contains(text)))
            .collect();
        assert!(warned.is_empty(), "the host's helper warned:\n{}", warned.join("\n"));
        std::fs::remove_dir_all(SOCKET_DIR).unwrap();
    }
}

/// Starts the host's helper and upgrades the chart to the `hardened`
/// overlay to use it; returns the helper once the node pod has no helper
/// container, nothing privileged, and the driver is ready again.
pub fn upgrade_to_the_overlay_with_the_hosts_helper(cluster: &Cluster, driver: &Driver) -> HostHelper {
    let helper = HostHelper::start(cluster.dir());
    cluster.kubectl(&["label", "node", NODE_NAME, "ebs.csi.aws.com/helper=installed"]);
    let values = repository().join("deploy/kubernetes/overlays/hardened/values.yaml");
    cluster.helm(&[
        "upgrade",
        "ebs-csi",
        &repository().join("charts/aws-ebs-csi-driver").to_string_lossy(),
        "--namespace=kube-system",
        "--reuse-values",
        &format!("--values={}", values.display()),
    ]);
    poll_until(
        "one node pod, without a helper container",
        Duration::from_secs(120),
        || {
            cluster.node_pods("{.items[*].spec.containers[*].name}")
                == "ebs-plugin node-driver-registrar liveness-probe"
        },
    );
    let privileged = cluster.node_pods(
        "{.items[*].spec.initContainers[*].securityContext.privileged} {.items[*].spec.containers[*].securityContext.privileged}",
    );
    assert!(!privileged.contains("true"), "{privileged}");
    driver.wait_until_ready(cluster);
    helper
}
