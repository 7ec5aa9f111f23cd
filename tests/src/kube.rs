//! A real single-node Kubernetes for the tests (#43): `tests/kube/cluster.sh`
//! starts it in a sandbox (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, kube-proxy and kubelet v1.35.4 as `make kube-tools`
//! builds them, Debian's containerd with runc and the CNI bridge) and tears
//! it down when the [`Cluster`] is dropped, also when the test fails.
//!
//! Its world, each assumption broken or checked by `tests/kube/cluster.rs`:
//! one cluster at a time (fixed addresses and names: the scenarios share
//! one, each in a [`Namespace`] of its own, `tests/kube/main.rs`); nothing can
//! be pulled (every image is an archive `make kube-tools` built, imported at
//! start); what it leaves outside its directory (iptables chains, the
//! bridge, the node's address, containerd's and CNI's fixed directories) is
//! its own to remove.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::moto::{Moto, REGION, ZONE};
use crate::{Process, Sandbox, go_tool, repository};

/// The node's name, as kubelet registers it (`cluster.sh`'s `NODE_NAME`).
pub const NODE_NAME: &str = "ebs-csi-node";

/// The node's address, on the loopback interface; the API server listens
/// on it, port 6443 (`cluster.sh`'s `NODE_IP`).
pub const NODE_IP: &str = "10.231.0.1";

/// Where the cluster keeps what it cannot keep in its own directory
/// (`cluster.sh`'s `OUTSIDE`): containerd pins each pod sandbox's network
/// namespace at `/run/netns/cni-<uuid>` and mounts its shm beneath
/// `/run/containerd`, as its pods come and go beside other tests.
pub const OUTSIDE: [&str; 4] = ["/run/containerd", "/var/lib/cni", "/var/log/containers", "/run/netns"];

/// The CNI bridge `cluster.sh` names.
pub const BRIDGE: &str = "ebs-cni0";

/// The busybox image the scenarios' pods run (Debian's busybox-static,
/// `tests/kube/images.sh`).
pub const BUSYBOX: &str = "localhost/busybox:1.35.0";

/// A running cluster in a sandbox of its own; torn down on drop.
pub struct Cluster {
    sandbox: Sandbox,
    down: bool,
}

impl Cluster {
    /// Starts the cluster with the pause and busybox images and waits
    /// until its node is Ready. Panics with the components' logs when it
    /// cannot (the script tore down what it started).
    pub fn up() -> Self {
        Self::up_with(&[], &[])
    }

    /// [`Cluster::up`] with `cluster.sh`'s settings `env` (`NODE_TAINTS`,
    /// `KUBELET_ROOT`) and the OCI archives
    /// `images` imported besides.
    pub fn up_with(env: &[(&str, &str)], images: &[PathBuf]) -> Self {
        let sandbox = Sandbox::new();
        let mut command = script("up", &sandbox.path().join("cluster"));
        command.envs(env.iter().copied());
        for image in ["pause", "busybox"] {
            command.arg(images_dir().join(format!("{image}.oci.tar")));
        }
        command.args(images);
        let output = command.output().expect("running cluster.sh up");
        assert!(output.status.success(), "cluster.sh up failed:\n{}", text(&output));
        Self { sandbox, down: false }
    }

    /// The cluster's directory (`cluster.sh`'s DIR).
    pub fn dir(&self) -> PathBuf {
        self.sandbox.path().join("cluster")
    }

    /// `kubectl ARGS` as the cluster's admin: its stdout, or a panic with
    /// both outputs.
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.kubectl_with(args, "")
    }

    /// `kubectl ARGS` with `input` on its stdin (a manifest for `apply -f -`).
    pub fn kubectl_with(&self, args: &[&str], input: &str) -> String {
        let mut child = Command::new(go_tool("kubectl"))
            .arg("--kubeconfig")
            .arg(self.dir().join("admin.kubeconfig"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting kubectl");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("kubectl's stdin");
        let output = child.wait_with_output().expect("kubectl");
        assert!(output.status.success(), "kubectl {args:?} failed:\n{}", text(&output));
        String::from_utf8(output.stdout).expect("kubectl's output is UTF-8")
    }

    /// Creates the namespace `name` and returns it: each scenario keeps
    /// its objects in one, so that scenarios run side by side on one
    /// cluster.
    pub fn namespace(&self, name: &str) -> Namespace<'_> {
        self.kubectl(&["create", "namespace", name]);
        Namespace {
            cluster: self,
            name: name.to_owned(),
        }
    }

    /// `helm ARGS` against the cluster (helm of `make go-tools`): its
    /// stdout, or a panic with both outputs.
    pub fn helm(&self, args: &[&str]) -> String {
        let output = Command::new(go_tool("helm"))
            .arg("--kubeconfig")
            .arg(self.dir().join("admin.kubeconfig"))
            .args(args)
            .output()
            .expect("helm");
        assert!(output.status.success(), "helm {args:?} failed:\n{}", text(&output));
        String::from_utf8(output.stdout).expect("helm's output is UTF-8")
    }

    /// The volume snapshot CRDs (VolumeGroupSnapshot's among them) and the
    /// snapshot-controller (group snapshots on: GA since v8.7.0), from the
    /// external-snapshotter release `tests/kube/sidecars.tsv` pins: its
    /// `client/config/crd` and `deploy/kubernetes/snapshot-controller`,
    /// its Deployment running the image `make kube-tools` built.
    pub fn install_snapshot_controller(&self) {
        let (image, module, version) = sidecar("snapshot-controller");
        let modules = images_dir().parent().expect("go dir").join("mod");
        let client = modules.join(format!(
            "{}/client/v8@{version}/config/crd",
            module.trim_end_matches("/v8")
        ));
        for crd in std::fs::read_dir(&client)
            .expect("the snapshot CRDs")
            .map(|e| e.expect("entry").path())
        {
            if crd.extension().is_some_and(|e| e == "yaml") && !crd.ends_with("kustomization.yaml") {
                self.kubectl(&["apply", "-f", &crd.to_string_lossy()]);
            }
        }
        let deploy = modules.join(format!("{module}@{version}/deploy/kubernetes/snapshot-controller"));
        self.kubectl(&[
            "apply",
            "-f",
            &deploy.join("rbac-snapshot-controller.yaml").to_string_lossy(),
        ]);
        let setup = std::fs::read_to_string(deploy.join("setup-snapshot-controller.yaml")).expect("its Deployment");
        let (before, after) = setup.split_once("image: ").expect("its image");
        let (_, rest) = after.split_once('\n').expect("its image's line");
        self.kubectl_with(&["apply", "-f", "-"], &format!("{before}image: {image}\n{rest}"));
    }

    /// Waits until every pod is Ready and every Deployment and DaemonSet
    /// has all its replicas Ready (3 minutes at most), then asserts that no
    /// container restarted: a sidecar that refuses a flag it is given, or a
    /// probe that fails, restarts its container.
    ///
    /// A pod kubelet rejected at admission for a taint it did not tolerate
    /// ([`unready`]) is not waited for: its ReplicaSet replaces it.
    pub fn wait_until_every_pod_is_ready(&self) {
        let pods = || self.kubectl(&["get", "pods", "--all-namespaces", "-o", "wide"]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        loop {
            let states = self.kubectl(&["get", "pods", "--all-namespaces", "-o", POD_STATES]);
            let workloads = self.kubectl(&[
                "get",
                "deployments,daemonsets",
                "--all-namespaces",
                "-o",
                WORKLOAD_STATES,
            ]);
            let waiting = unready(&states, &workloads);
            if !states.is_empty() && waiting.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not Ready within 3 minutes: {waiting:?}\n{}",
                pods()
            );
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        let restarts = self.kubectl(&[
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
    }

    /// The JSONPath `path` of the driver's node pods (`app=ebs-csi-node`
    /// in kube-system), e.g. `{.items[*].metadata.name}`.
    pub fn node_pods(&self, path: &str) -> String {
        self.kubectl(&[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-l",
            "app=ebs-csi-node",
            "-o",
            &format!("jsonpath={path}"),
        ])
    }

    /// Restarts kubelet as systemd restarts it (`cluster.sh
    /// restart-kubelet`: SIGTERM, then the same command line), its pods'
    /// containers and volumes left as they are; returns once it serves and
    /// the node is Ready.
    pub fn restart_kubelet(&self) {
        let output = script("restart-kubelet", &self.dir())
            .output()
            .expect("running cluster.sh restart-kubelet");
        assert!(
            output.status.success(),
            "cluster.sh restart-kubelet failed:\n{}",
            text(&output)
        );
    }

    /// Tears the cluster down (`cluster.sh down`), asserting it succeeded;
    /// the sandbox goes when `self` does.
    pub fn down(mut self) {
        self.down = true;
        let output = script("down", &self.dir()).output().expect("running cluster.sh down");
        assert!(output.status.success(), "cluster.sh down failed:\n{}", text(&output));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.report();
        }
        if !self.down {
            let _ = script("down", &self.dir()).status();
        }
    }
}

impl Cluster {
    /// Prints what a failed test needs to be understood: the objects of
    /// storage, every event, and the last lines of each driver container's
    /// log.
    fn report(&self) {
        let kubectl = |args: &[&str]| {
            Command::new(go_tool("kubectl"))
                .arg("--kubeconfig")
                .arg(self.dir().join("admin.kubeconfig"))
                .args(args)
                .output()
                .map(|o| text(&o))
                .unwrap_or_else(|e| e.to_string())
        };
        eprintln!("--- the cluster at the failure ---");
        eprintln!(
            "{}",
            kubectl(&[
                "get",
                "pods,pvc,pv,volumeattachments,volumesnapshots,volumesnapshotcontents,\
                 volumegroupsnapshots,volumegroupsnapshotcontents",
                "--all-namespaces",
                "-o",
                "wide"
            ])
        );
        eprintln!(
            "{}",
            kubectl(&["get", "events", "--all-namespaces", "--sort-by=.lastTimestamp"])
        );
        for pod in kubectl(&[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-l",
            "app.kubernetes.io/name=aws-ebs-csi-driver",
            "-o",
            "name",
        ])
        .lines()
        {
            eprintln!("--- {pod} ---");
            eprintln!(
                "{}",
                kubectl(&[
                    "logs",
                    "-n",
                    "kube-system",
                    pod,
                    "--all-containers",
                    "--prefix",
                    "--tail=40"
                ])
            );
        }
    }
}

/// A namespace of a [`Cluster`] ([`Cluster::namespace`]): its kubectl
/// commands name it (`--namespace`); kubectl ignores that for objects of
/// the whole cluster (PersistentVolumes, classes, CSINodes).
pub struct Namespace<'a> {
    cluster: &'a Cluster,
    name: String,
}

impl<'a> Namespace<'a> {
    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cluster it is a namespace of.
    pub fn cluster(&self) -> &'a Cluster {
        self.cluster
    }

    /// `kubectl --namespace NAME ARGS` ([`Cluster::kubectl`]).
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.kubectl_with(args, "")
    }

    /// `kubectl --namespace NAME ARGS` with `input` on its stdin
    /// ([`Cluster::kubectl_with`]).
    pub fn kubectl_with(&self, args: &[&str], input: &str) -> String {
        let args: Vec<&str> = ["--namespace", self.name.as_str()]
            .iter()
            .chain(args)
            .copied()
            .collect();
        self.cluster.kubectl_with(&args, input)
    }

    /// `kubectl apply -f -` of `manifest` (YAML or JSON).
    pub fn apply(&self, manifest: &str) {
        self.kubectl_with(&["apply", "-f", "-"], manifest);
    }

    /// The JSONPath `path` of the object `kind`/`name` (`kubectl get -o
    /// jsonpath`); empty where the field is not set.
    pub fn get(&self, kind: &str, name: &str, path: &str) -> String {
        self.kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")])
    }

    /// The events of the objects named `name`, as `kubectl get events`
    /// shows them.
    pub fn events(&self, name: &str) -> String {
        self.kubectl(&[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name}"),
        ])
    }

    /// Waits until an event of the objects named `name` has the reason
    /// `reason` and a message containing `text` (`within`), and returns
    /// that message; panics with their events when none comes.
    pub fn wait_for_event(&self, name: &str, reason: &str, text: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let events = self.kubectl(&[
                "get",
                "events",
                "--field-selector",
                &format!("involvedObject.name={name},reason={reason}"),
                "-o",
                r#"jsonpath={range .items[*]}{.message}{"\n"}{end}"#,
            ]);
            if let Some(message) = events.lines().find(|m| m.contains(text)) {
                return message.to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "no {reason} event of {name} says {text:?} after {within:?}:\n{}",
                self.events(name)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits until `kind`/`name`'s `path` reads `value` (`within`), and
    /// panics with the object's events when it does not.
    pub fn wait_for(&self, kind: &str, name: &str, path: &str, value: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while self.get(kind, name, path) != value {
            assert!(
                Instant::now() < deadline,
                "{kind}/{name} {path} is {:?}, not {value:?}, after {within:?}:\n{}",
                self.get(kind, name, path),
                self.events(name)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs the pod of `manifest` (a pod named `name` that ends; see
    /// [`pod`]) to its end, asserts that it succeeded, and returns its log.
    pub fn run(&self, name: &str, manifest: &str) -> String {
        self.apply(manifest);
        let deadline = Instant::now() + Duration::from_secs(180);
        let phase = || self.get("pod", name, "{.status.phase}");
        while !matches!(phase().as_str(), "Succeeded" | "Failed") {
            assert!(
                Instant::now() < deadline,
                "pod {name} did not end:\n{}",
                self.events(name)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(
            phase(),
            "Succeeded",
            "{}\n{}",
            self.events(name),
            self.kubectl(&["logs", name])
        );
        self.kubectl(&["logs", name])
    }

    /// `sh -c script` in the running busybox pod `name` (see [`pod`]):
    /// its stdout.
    pub fn exec(&self, name: &str, script: &str) -> String {
        self.kubectl(&["exec", name, "--", "/bin/busybox", "sh", "-c", script])
    }
}

/// Asks `condition` every 200 ms until it holds, and panics naming `what`
/// after `within`. For conditions that ask the cluster ([`crate::wait_until`]
/// asks every 10 ms: a kubectl each time kept a core busy through every
/// wait).
pub fn poll_until(what: &str, within: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Each pod as `NAME\tPHASE\tREASON\tOWNER KIND\tREADY` (the Ready
/// condition's status), one a line, for [`unready`].
const POD_STATES: &str = r#"jsonpath={range .items[*]}{.metadata.name}{"\t"}{.status.phase}{"\t"}{.status.reason}{"\t"}{.metadata.ownerReferences[0].kind}{"\t"}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#;

/// Each Deployment and DaemonSet as `KIND/NAME\tWANTED\tREADY`
/// (`spec.replicas` and `status.readyReplicas`, or
/// `status.desiredNumberScheduled` and `status.numberReady`), for [`unready`].
const WORKLOAD_STATES: &str = r#"jsonpath={range .items[*]}{.kind}/{.metadata.name}{"\t"}{.spec.replicas}{.status.desiredNumberScheduled}{"\t"}{.status.readyReplicas}{.status.numberReady}{"\n"}{end}"#;

/// The pods ([`POD_STATES`]) and workloads ([`WORKLOAD_STATES`]) not yet
/// Ready.
///
/// A pod of a ReplicaSet that kubelet rejected at admission for a taint
/// (phase `Failed`, reason `TaintToleration`) is not one: a node registers
/// with the driver's `NoExecute` startup taint, the agent removes it, and
/// the scheduler may bind a pod before kubelet's own copy of its Node has
/// seen the removal; kubelet admits no pod that does not tolerate the
/// node's `NoSchedule` and `NoExecute` taints (`pkg/kubelet/lifecycle/
/// predicate.go`, kubernetes/kubernetes#101218), the pod fails for good,
/// and its ReplicaSet makes another (the same lag as the taint manager's,
/// kubernetes/kubernetes#139992). Its workload stays unready until the new
/// one is Ready. Any other failed pod is waited for, to the deadline.
fn unready(pods: &str, workloads: &str) -> Vec<String> {
    let pods = pods.lines().filter_map(|line| {
        let [name, phase, reason, owner, ready] = line.split('\t').collect::<Vec<_>>()[..] else {
            return Some(line.to_owned());
        };
        let rejected = phase == "Failed" && reason == "TaintToleration" && owner == "ReplicaSet";
        (ready != "True" && !rejected).then(|| name.to_owned())
    });
    let workloads = workloads.lines().filter_map(|line| {
        let [name, wanted, ready] = line.split('\t').collect::<Vec<_>>()[..] else {
            return Some(line.to_owned());
        };
        (ready.parse().unwrap_or(0) < wanted.parse().unwrap_or(1)).then(|| name.to_owned())
    });
    pods.chain(workloads).collect()
}

/// `cluster.sh VERB DIR` with the programs of `make kube-tools`.
fn script(verb: &str, dir: &Path) -> Command {
    let mut command = Command::new(repository().join("tests/kube/cluster.sh"));
    command
        .arg(verb)
        .arg(dir)
        .env("KUBE_BIN", go_tool("kubelet").parent().expect("bin"));
    command
}

/// The driver's startup taint, which node groups register their nodes with
/// and the agent removes once it is ready (`agent/src/taint.rs`).
pub const STARTUP_TAINT: &str = "ebs.csi.aws.com/agent-not-ready";

/// How long EC2 keeps a volume `detaching` after DetachVolume, in seconds
/// (serve.py's `--detach`; EC2 API Reference, DetachVolume): a drain's
/// preStop has a detach to wait for.
pub const DETACH_SECONDS: u32 = 3;

/// The driver installed from the chart with the `standard` overlay's values
/// on a cluster's node: EC2 is moto behind serve.py on the node's address,
/// the node is the instance it runs as (its providerID and its zone and
/// instance-type labels, as the AWS cloud controller manager sets them),
/// the snapshot CRDs and snapshot-controller are installed, the metadata
/// labeler runs beside the controller, and the attach simulator plays the instance's hypervisor: an attached
/// volume is a loop device with an EBS volume's links in `<DIR>/dev`, which
/// the agent takes as its device tree (`--dev-dir`) and the helper accepts
/// (`--allow-loop-devices`).
pub struct Driver {
    /// The instance the node runs as.
    pub instance: String,
    /// EC2.
    pub moto: Moto,
    /// The device tree the attach simulator fills (`<DIR>/dev`).
    dev: PathBuf,
    _simulator: Process,
}

impl Driver {
    /// Installs the driver on `cluster` (registered with [`STARTUP_TAINT`])
    /// with the attach simulator; returns once helm has.
    pub fn install(cluster: &Cluster) -> Self {
        Self::install_with(cluster, &[])
    }

    /// [`Driver::install`], EC2's serve.py given `ec2_args` (`--create`,
    /// `--attach`, … seconds) besides `--detach` [`DETACH_SECONDS`].
    pub fn install_with(cluster: &Cluster, ec2_args: &[&str]) -> Self {
        let detach = DETACH_SECONDS.to_string();
        let moto = Moto::start_on(NODE_IP, &[&["--detach", detach.as_str()][..], ec2_args].concat());
        let instance = moto.run_instance(REGION, ZONE);
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

        let env = format!(
            r#"[{{"name": "AWS_ENDPOINT_URL_EC2", "value": "{0}"}}, {{"name": "AWS_ENDPOINT_URL_EBS", "value": "{0}"}},
                {{"name": "AWS_ACCESS_KEY_ID", "value": "testing"}}, {{"name": "AWS_SECRET_ACCESS_KEY", "value": "testing"}}]"#,
            moto.endpoint
        );
        let chart = repository().join("charts/aws-ebs-csi-driver");
        let values = repository().join("deploy/kubernetes/overlays/standard/values.yaml");
        let mut args = vec![
            "install".to_owned(),
            "ebs-csi".to_owned(),
            chart.to_string_lossy().into_owned(),
            "--namespace=kube-system".to_owned(),
            format!("--values={}", values.display()),
            format!(
                "--set=node.kubeletPath={},controller.region={REGION}",
                cluster.dir().join("kubelet").display()
            ),
            format!("--set-json=controller.env={env}"),
            "--set=sidecars.metadataLabeler.enabled=true".to_owned(),
        ];
        let dev = cluster.dir().join("dev");
        let simulator = crate::lifecycle::start_simulator(&cluster.dir(), &moto.endpoint, &instance);
        args.extend([
            format!("--set-json=node.additionalArgs=[\"--dev-dir={}\"]", dev.display()),
            format!(
                r#"--set-json=node.volumes=[{{"name": "ebs-dev", "hostPath": {{"path": "{}"}}}}]"#,
                dev.display()
            ),
            format!(
                r#"--set-json=node.volumeMounts=[{{"name": "ebs-dev", "mountPath": "{}"}}]"#,
                dev.display()
            ),
            "--set-json=node.helper.additionalArgs=[\"--allow-loop-devices\"]".to_owned(),
        ]);
        cluster.helm(&args.iter().map(String::as_str).collect::<Vec<_>>());
        Self {
            instance,
            moto,
            dev,
            _simulator: simulator,
        }
    }
}

/// A busybox pod named `name` that runs `script` once (`restartPolicy:
/// Never`) with each claim of `claims` (`(claim, path)`) mounted at its
/// path, or, where the path is under `/dev/`, given as a raw block device
/// there. `security` is the pod's `securityContext` (`json!({})` for none).
pub fn pod(name: &str, script: &str, claims: &[(&str, &str)], security: &serde_json::Value) -> String {
    let volumes: Vec<_> = claims
        .iter()
        .map(|(claim, _)| json!({"name": claim, "persistentVolumeClaim": {"claimName": claim}}))
        .collect();
    let (devices, mounts): (Vec<_>, Vec<_>) = claims.iter().partition(|(_, path)| path.starts_with("/dev/"));
    let devices: Vec<_> = devices
        .iter()
        .map(|(claim, path)| json!({"name": claim, "devicePath": path}))
        .collect();
    let mounts: Vec<_> = mounts
        .iter()
        .map(|(claim, path)| json!({"name": claim, "mountPath": path}))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "dnsPolicy": "Default",
            "securityContext": security,
            "containers": [{
                "name": name,
                "image": BUSYBOX,
                "args": ["sh", "-c", script],
                "volumeMounts": mounts,
                "volumeDevices": devices,
            }],
            "volumes": volumes,
        },
    })
    .to_string()
}

impl Driver {
    /// The names of the attach simulator's links in `disk/by-id`: the
    /// instance's root volume's and each attached volume's.
    pub fn device_links(&self) -> Vec<String> {
        std::fs::read_dir(self.dev.join("disk/by-id"))
            .expect("the attach simulator's disk/by-id")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// Waits until every pod is Ready ([`Cluster::wait_until_every_pod_is_ready`])
    /// and kubelet has registered the driver in the node's CSINode (the
    /// registrar's registration reaches it after the pods are Ready; until
    /// then csi-provisioner fails a WaitForFirstConsumer claim with "no
    /// topology key found on CSINode").
    pub fn wait_until_ready(&self, cluster: &Cluster) {
        cluster.wait_until_every_pod_is_ready();
        poll_until("the driver in the node's CSINode", Duration::from_secs(60), || {
            // The cluster's only driver; `[?()]` fails while there is none.
            cluster.kubectl(&["get", "csinode", NODE_NAME, "-o", "jsonpath={.spec.drivers[*].nodeID}"]) == self.instance
        });
    }

    /// Asserts that the driver's logs are clean since it started (#43 item
    /// 4: the scenarios end with it, so noise is caught as it appears):
    /// no warning or error (klog's `W`/`E` lines, `E1128 18:51:31.322699 …`;
    /// tracing's `WARN`/`ERROR`) from the driver's own containers
    /// (`ebs-plugin` of both pods, `ebs-csi-helper`), and none from a
    /// sidecar or the snapshot-controller that carries a CSI call the
    /// driver failed (`rpc error: code = …`), but for [`KNOWN_CHATTER`] and
    /// the lines of the refusals a scenario `provoked` (what such a line
    /// contains, and which refusal it is). The sidecars' other warnings are
    /// their own retries against the API server (a Lease two replicas
    /// create at once, a patch of an object another controller changed, a
    /// PersistentVolume already gone), which come and go with timing;
    /// kubelet's log is not looked at. A pod kubelet rejected at admission
    /// (phase `Failed`, see [`unready`]) ran no container and has no log:
    /// kubectl refuses to read one ("container … is terminated", a warm
    /// run at 5a6657d), so the logs are read pod by pod of the others.
    pub fn assert_logs_are_clean(&self, cluster: &Cluster, provoked: &[(&str, &str)]) {
        let mut noise = Vec::new();
        for selector in [
            "app.kubernetes.io/name=aws-ebs-csi-driver",
            "app.kubernetes.io/name=snapshot-controller",
        ] {
            let pods = cluster.kubectl(&[
                "get",
                "pods",
                "-n",
                "kube-system",
                "-l",
                selector,
                "--field-selector=status.phase!=Failed",
                "-o",
                "name",
            ]);
            for pod in pods.lines() {
                let log = cluster.kubectl(&[
                    "logs",
                    "-n",
                    "kube-system",
                    pod,
                    "--all-containers",
                    "--prefix",
                    "--tail=-1",
                ]);
                noise.extend(
                    log.lines()
                        .filter(|line| is_noise(line) && !provoked.iter().any(|(text, _)| line.contains(text)))
                        .map(str::to_owned),
                );
            }
        }
        assert!(
            noise.is_empty(),
            "the driver's logs are not clean:\n{}",
            noise.join("\n")
        );
    }
}

/// The driver's own containers.
const DRIVER_CONTAINERS: [&str; 2] = ["ebs-plugin", "ebs-csi-helper"];

/// A sidecar's warnings about a CSI call that
/// [`Driver::assert_logs_are_clean`] lets pass: what the line contains and
/// why it is not the driver's noise.
const KNOWN_CHATTER: [(&str, &str); 1] = [(
    "Still connecting to /csi/csi.sock",
    "csi-node-driver-registrar starts beside the agent and dials its socket once a second until it \
     listens (csi-lib-utils connection.Connect)",
)];

/// Whether the `kubectl logs --prefix` line (`[pod/NAME/CONTAINER] …`) is
/// noise: a warning of the driver's own containers, or a sidecar's warning
/// about a CSI call the driver failed, not [`KNOWN_CHATTER`].
fn is_noise(line: &str) -> bool {
    let (prefix, message) = line.split_once("] ").unwrap_or(("", line));
    let container = prefix.rsplit('/').next().unwrap_or("");
    if !is_warning(message) {
        return false;
    }
    DRIVER_CONTAINERS.contains(&container)
        || (message.contains("rpc error: code =") && !KNOWN_CHATTER.iter().any(|(text, _)| message.contains(text)))
}

/// Whether the log message is a warning or an error: klog's `Lmmdd`
/// header with L `W` or `E` (k8s.io/klog), or a tracing line of level
/// `WARN` or `ERROR`.
fn is_warning(message: &str) -> bool {
    let klog = message.len() > 5
        && matches!(message.as_bytes()[0], b'W' | b'E')
        && message.as_bytes()[1..5].iter().all(u8::is_ascii_digit);
    let tracing = message
        .split_whitespace()
        .nth(1)
        .is_some_and(|level| matches!(level, "WARN" | "ERROR"));
    klog || tracing
}

/// The image, module and version of the sidecar `name` in
/// `tests/kube/sidecars.tsv`.
pub fn sidecar(name: &str) -> (String, String, String) {
    let table = std::fs::read_to_string(repository().join("tests/kube/sidecars.tsv")).expect("sidecars.tsv");
    table
        .lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| line.split('\t').map(str::to_owned).collect::<Vec<_>>())
        .find(|row| row[3].ends_with(&format!("/{name}")))
        .map(|row| (row[0].clone(), row[1].clone(), row[2].clone()))
        .unwrap_or_else(|| panic!("{name} is not in sidecars.tsv"))
}

/// Every image the driver's manifests name: the sidecars
/// (`<target dir>/go/sidecars`, `make kube-tools`) and the project's own
/// (`target/image`, `make image-build`).
pub fn driver_images() -> Vec<PathBuf> {
    let sidecars = images_dir().parent().expect("go dir").join("sidecars");
    let mut images = Vec::new();
    for dir in [sidecars, repository().join("target/image")] {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            if path.to_string_lossy().ends_with(".oci.tar") {
                images.push(path);
            }
        }
    }
    images.sort();
    images
}

/// The OCI archives `make kube-tools` built (`<target dir>/go/images`).
fn images_dir() -> PathBuf {
    go_tool("kubelet")
        .parent()
        .and_then(Path::parent)
        .expect("go dir")
        .join("images")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[cfg(test)]
mod tests {
    use super::unready;

    /// The cluster of a failed run (a47ab90's CI): one snapshot-controller
    /// pod bound as the agent removed the startup taint, rejected by kubelet,
    /// and its replacement.
    const PODS: &str = "ebs-csi-controller-86578b4bb-644t6\tRunning\t\tReplicaSet\tTrue\n\
                        ebs-csi-node-zmvwt\tRunning\t\tDaemonSet\tTrue\n\
                        snapshot-controller-759594c85d-2ddm5\tFailed\tTaintToleration\tReplicaSet\t\n\
                        snapshot-controller-759594c85d-xhvkd\tRunning\t\tReplicaSet\tTrue\n";

    #[test]
    fn a_pod_kubelet_rejected_for_a_taint_waits_for_its_workload_only() {
        let ready = "Deployment/snapshot-controller\t2\t2\nDaemonSet/ebs-csi-node\t1\t1\n";
        assert_eq!(unready(PODS, ready), Vec::<String>::new());
        let replacing = "Deployment/snapshot-controller\t2\t1\nDaemonSet/ebs-csi-node\t1\t1\n";
        assert_eq!(unready(PODS, replacing), ["Deployment/snapshot-controller"]);
        let none_ready = "Deployment/snapshot-controller\t2\t\n";
        assert_eq!(unready("", none_ready), ["Deployment/snapshot-controller"]);
    }

    #[test]
    fn any_other_failed_or_unready_pod_is_waited_for() {
        let pods = "a\tFailed\tTaintToleration\t\t\n\
                    b\tFailed\tOutOfcpu\tReplicaSet\t\n\
                    c\tRunning\t\tReplicaSet\tFalse\n\
                    d\tPending\t\tReplicaSet\t\n";
        assert_eq!(unready(pods, ""), ["a", "b", "c", "d"]);
    }
}
