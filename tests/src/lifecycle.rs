//! The main job end to end on one machine: moto as EC2, the controller,
//! the attach simulator as the hypervisor, the helper and the agent, driven
//! over gRPC exactly as Kubernetes' sidecars and kubelet would. `make demo`
//! (the `ebs-csi-demo` binary) prints it; the `lifecycle` test asserts it.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ebs_csi_proto::v1::controller_client::ControllerClient;
use ebs_csi_proto::v1::node_client::NodeClient;
use ebs_csi_proto::v1::volume_capability::access_mode::Mode;
use ebs_csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use ebs_csi_proto::v1::*;
use tonic::transport::Channel;

use crate::moto::{Controller, Moto, REGION, ZONE};
use crate::{Agent, Helper, Process, Sandbox, binary, spawn};

mod backup;

const GIB: i64 = 1 << 30;
const CONTENT: &str = "written before the snapshot\n";

/// The part of the system a step exercises, whose log explains a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    /// moto server, the emulated EC2.
    Ec2,
    /// `ebs-csi-controller`.
    Controller,
    /// `ebs-csi-attach-sim`.
    Simulator,
    /// `ebs-csi-helper`.
    Helper,
    /// `ebs-csi-agent` (and the helper behind it).
    Agent,
    /// The driver of the demo itself (file I/O in the mounted volume).
    Workload,
}

impl Component {
    fn logs(self) -> &'static [&'static str] {
        match self {
            Self::Ec2 | Self::Workload => &[],
            Self::Controller => &["controller.log"],
            Self::Simulator => &["attach-sim.log"],
            Self::Helper => &["helper.log"],
            Self::Agent => &["agent.log", "helper.log", "attach-sim.log"],
        }
    }
}

/// Why the lifecycle stopped.
#[derive(Debug)]
pub struct Failure {
    /// The step that failed.
    pub step: String,
    /// The component at fault.
    pub component: Component,
    /// What went wrong.
    pub error: String,
    /// The last lines of that component's logs.
    pub log_tail: String,
}

/// One finished step.
#[derive(Clone, Debug)]
pub struct Step {
    /// What was done.
    pub name: String,
    /// How long it took.
    pub elapsed: Duration,
}

/// Runs and times steps, printing each as it finishes when `verbose`.
#[derive(Debug, Default)]
pub struct Report {
    /// The steps done so far.
    pub steps: Vec<Step>,
    verbose: bool,
    log_dir: Option<PathBuf>,
}

impl Report {
    /// A report that prints (`verbose`) or stays quiet (tests).
    pub fn new(verbose: bool) -> Self {
        Self {
            verbose,
            ..Self::default()
        }
    }

    /// Prints a line that is not a step.
    pub fn note(&self, text: &str) {
        if self.verbose {
            println!("  · {text}");
        }
    }

    /// Runs one step.
    ///
    /// # Errors
    /// A [`Failure`] naming the step, with `component`'s log tail.
    pub async fn step<T>(
        &mut self,
        name: &str,
        component: Component,
        work: impl Future<Output = Result<T, String>>,
    ) -> Result<T, Failure> {
        let start = Instant::now();
        match work.await {
            Ok(value) => {
                let elapsed = start.elapsed();
                if self.verbose {
                    println!("  ✓ {name:<58} {:>8.1} ms", elapsed.as_secs_f64() * 1000.0);
                }
                self.steps.push(Step {
                    name: name.to_owned(),
                    elapsed,
                });
                Ok(value)
            }
            Err(error) => {
                if self.verbose {
                    println!("  ✗ {name}");
                }
                Err(Failure {
                    step: name.to_owned(),
                    component,
                    error,
                    log_tail: self.log_tail(component),
                })
            }
        }
    }

    fn log_tail(&self, component: Component) -> String {
        let Some(dir) = &self.log_dir else { return String::new() };
        let mut tail = String::new();
        for log in component.logs() {
            let text = std::fs::read_to_string(dir.join(log)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let _ = writeln!(tail, "--- last lines of {log} ---");
            for line in &lines[lines.len().saturating_sub(15)..] {
                let _ = writeln!(tail, "{line}");
            }
        }
        tail
    }

    /// The steps as a table with a total.
    pub fn summary(&self) -> String {
        let mut out = format!("{:<60} {:>11}\n{}\n", "step", "latency", "-".repeat(72));
        for step in &self.steps {
            let _ = writeln!(out, "{:<60} {:>8.1} ms", step.name, step.elapsed.as_secs_f64() * 1000.0);
        }
        let total: Duration = self.steps.iter().map(|s| s.elapsed).sum();
        let _ = writeln!(
            out,
            "{}\n{:<60} {:>8.1} ms",
            "-".repeat(72),
            format!("{} steps", self.steps.len()),
            total.as_secs_f64() * 1000.0
        );
        out
    }
}

/// Everything running for the lifecycle; dropping it stops the processes
/// and removes mounts, loop devices and files.
pub struct Environment {
    // Drop order: the agent and helper first, then the simulator (which
    // detaches its loop devices), EC2, and the sandbox last.
    agent: Agent,
    _helper: Helper,
    _simulator: Process,
    controller: Controller,
    _moto: Moto,
    sandbox: Sandbox,
    instance_id: String,
    fs_type: &'static str,
}

impl Environment {
    /// The directory everything runs in; the helper's allowed root is its
    /// `kubelet` ([`Helper::args`]).
    pub fn dir(&self) -> &Path {
        self.sandbox.path()
    }

    /// The agent's CSI socket (Node and Identity).
    pub fn node_socket(&self) -> &Path {
        &self.agent.socket
    }

    /// The controller's CSI socket (Controller, GroupController, Identity).
    pub fn controller_socket(&self) -> &Path {
        &self.controller.socket
    }
}

/// Starts every component, each as a step.
///
/// # Errors
/// The [`Failure`] of the component that did not start.
pub async fn start(report: &mut Report) -> Result<Environment, Failure> {
    start_with(report, &[], &[]).await
}

/// [`start`], the helper given `helper_args` besides [`Helper::args`] and
/// `tests/ec2/serve.py` given `ec2_args` (`--zones`, …).
///
/// # Errors
/// The [`Failure`] of the component that did not start.
pub async fn start_with(
    report: &mut Report,
    helper_args: &'static [&'static str],
    ec2_args: &'static [&'static str],
) -> Result<Environment, Failure> {
    let sandbox = Sandbox::new();
    report.log_dir = Some(sandbox.path().to_owned());
    // The attach simulator copies snapshot contents here; serve.py lists
    // their blocks (EBS direct APIs) from them.
    let images = sandbox.path().join("ebs/snapshots").to_string_lossy().into_owned();
    let moto = report
        .step(
            "start moto server (EC2 and EBS direct APIs) on 127.0.0.1",
            Component::Ec2,
            blocking(move || Moto::start_with(&[&["--snapshot-images", &images][..], ec2_args].concat())),
        )
        .await?;
    let instance_id = moto.run_instance(REGION, ZONE);
    report.note(&format!("demo instance {instance_id} in {ZONE}"));
    let controller = report
        .step(
            "start ebs-csi-controller (AWS_ENDPOINT_URL_EC2 → moto)",
            Component::Controller,
            {
                let (dir, endpoint) = (sandbox.path().to_owned(), moto.endpoint.clone());
                blocking(move || Controller::start_in(&dir, &endpoint, REGION, &[]))
            },
        )
        .await?;
    let simulator = report
        .step(
            "start the attach simulator (loop devices as EBS volumes)",
            Component::Simulator,
            {
                let (dir, endpoint, instance) = (sandbox.path().to_owned(), moto.endpoint.clone(), instance_id.clone());
                blocking(move || start_simulator(&dir, &endpoint, &instance))
            },
        )
        .await?;
    let helper = report
        .step(
            "start ebs-csi-helper (root, --allow-loop-devices)",
            Component::Helper,
            {
                let dir = sandbox.path().to_owned();
                blocking(move || Helper::start_in(&dir, helper_args))
            },
        )
        .await?;
    let agent = report
        .step("start ebs-csi-agent (uid 65534, no capabilities)", Component::Agent, {
            let (dir, socket, instance) = (sandbox.path().to_owned(), helper.socket.clone(), instance_id.clone());
            blocking(move || {
                let args = [
                    "--node-id",
                    &instance,
                    "--availability-zone",
                    ZONE,
                    "--instance-type",
                    "m5.large",
                    "--device-wait-seconds",
                    "30",
                ];
                Agent::spawn_in(&dir, &socket, &args, &[])
            })
        })
        .await?;
    let fs_type = if crate::has_cap_sys_resource() {
        "ext4"
    } else {
        report.note("this machine withholds CAP_SYS_RESOURCE from root, so ext4 cannot grow online here: using xfs");
        "xfs"
    };
    Ok(Environment {
        agent,
        _helper: helper,
        _simulator: simulator,
        controller,
        _moto: moto,
        sandbox,
        instance_id,
        fs_type,
    })
}

/// Runs a blocking start-up function, turning its panic into an error.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| match e.try_into_panic() {
            Ok(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default(),
            Err(e) => e.to_string(),
        })
}

/// The attach simulator for `instance_id` on the EC2 at `endpoint`: its
/// device tree `<dir>/dev`, its backing files `<dir>/ebs`, its log
/// `<dir>/attach-sim.log`; returns once it is ready.
pub fn start_simulator(dir: &Path, endpoint: &str, instance_id: &str) -> Process {
    let ready = dir.join("attach-sim.ready");
    let mut command = Command::new(binary("ebs-csi-attach-sim"));
    command
        .args(["--instance-id", instance_id, "--poll-ms", "100"])
        .arg("--dev-dir")
        .arg(dir.join("dev"))
        .arg("--data-dir")
        .arg(dir.join("ebs"))
        .arg("--ready-file")
        .arg(&ready);
    crate::moto::aws_env(&mut command, endpoint, REGION);
    spawn("attach simulator", command, dir.join("attach-sim.log"), &ready)
}

fn mount_capability(fs_type: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            ..MountVolume::default()
        })),
    }
}

fn status(e: tonic::Status) -> String {
    format!("{:?}: {}", e.code(), e.message())
}

/// One volume as kubelet sees it on the node.
struct NodeVolume {
    volume_id: String,
    device_path: String,
    staging: PathBuf,
    target: PathBuf,
}

/// The clients and paths of a run.
#[derive(Clone)]
struct Driver {
    controller: ControllerClient<Channel>,
    node: NodeClient<Channel>,
    instance_id: String,
    kubelet: PathBuf,
    dev_dir: PathBuf,
    capability: VolumeCapability,
}

impl Driver {
    async fn create(&mut self, name: &str, gib: i64, source: Option<VolumeContentSource>) -> Result<String, String> {
        let request = CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: gib * GIB,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![self.capability.clone()],
            parameters: HashMap::from([("type".into(), "gp3".into())]),
            accessibility_requirements: Some(TopologyRequirement {
                requisite: vec![],
                preferred: vec![Topology {
                    segments: HashMap::from([("topology.ebs.csi.aws.com/zone".into(), ZONE.into())]),
                }],
            }),
            volume_content_source: source,
            ..Default::default()
        };
        let volume = self
            .controller
            .create_volume(request)
            .await
            .map_err(status)?
            .into_inner()
            .volume
            .ok_or("no volume")?;
        Ok(volume.volume_id)
    }

    async fn attach(&mut self, volume_id: &str, name: &str) -> Result<NodeVolume, String> {
        let request = ControllerPublishVolumeRequest {
            volume_id: volume_id.into(),
            node_id: self.instance_id.clone(),
            volume_capability: Some(self.capability.clone()),
            ..Default::default()
        };
        let context = self
            .controller
            .controller_publish_volume(request)
            .await
            .map_err(status)?
            .into_inner()
            .publish_context;
        // kubelet's staging and target paths, made as kubelet makes them
        // (its record of the volume beside each): a directory to mount on,
        // or for a raw block volume a file to bind the device on.
        let staging = crate::kubelet_staging(&self.kubelet, volume_id);
        let pod = format!("pod-{name}");
        let target = match self.capability.access_type {
            Some(AccessType::Block(_)) => crate::kubelet_block_target(&self.kubelet, &pod, name, volume_id),
            _ => crate::kubelet_target(&self.kubelet, &pod, name, volume_id),
        };
        Ok(NodeVolume {
            volume_id: volume_id.into(),
            device_path: context.get("devicePath").cloned().unwrap_or_default(),
            staging,
            target,
        })
    }

    async fn stage(&mut self, v: &NodeVolume) -> Result<(), String> {
        let request = NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            publish_context: HashMap::from([("devicePath".into(), v.device_path.clone())]),
            staging_target_path: path(&v.staging),
            volume_capability: Some(self.capability.clone()),
            ..Default::default()
        };
        self.node.node_stage_volume(request).await.map(drop).map_err(status)
    }

    async fn publish(&mut self, v: &NodeVolume) -> Result<(), String> {
        let request = NodePublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: path(&v.staging),
            target_path: path(&v.target),
            volume_capability: Some(self.capability.clone()),
            ..Default::default()
        };
        self.node.node_publish_volume(request).await.map(drop).map_err(status)
    }

    async fn teardown(&mut self, v: &NodeVolume, report: &mut Report) -> Result<(), Failure> {
        let (volume_id, target, staging) = (v.volume_id.clone(), path(&v.target), path(&v.staging));
        let mut node = self.node.clone();
        report
            .step(&format!("NodeUnpublishVolume {volume_id}"), Component::Agent, async {
                let r = NodeUnpublishVolumeRequest {
                    volume_id: volume_id.clone(),
                    target_path: target,
                };
                node.node_unpublish_volume(r).await.map(drop).map_err(status)
            })
            .await?;
        report
            .step(&format!("NodeUnstageVolume {volume_id}"), Component::Agent, async {
                let r = NodeUnstageVolumeRequest {
                    volume_id: volume_id.clone(),
                    staging_target_path: staging,
                };
                node.node_unstage_volume(r).await.map(drop).map_err(status)
            })
            .await?;
        let mut controller = self.controller.clone();
        let node_id = self.instance_id.clone();
        report
            .step(
                &format!("ControllerUnpublishVolume {volume_id}"),
                Component::Controller,
                async {
                    let r = ControllerUnpublishVolumeRequest {
                        volume_id: volume_id.clone(),
                        node_id,
                        ..Default::default()
                    };
                    controller
                        .controller_unpublish_volume(r)
                        .await
                        .map(drop)
                        .map_err(status)
                },
            )
            .await
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), String> {
        let request = DeleteSnapshotRequest {
            snapshot_id: snapshot_id.into(),
            ..Default::default()
        };
        self.controller
            .clone()
            .delete_snapshot(request)
            .await
            .map(drop)
            .map_err(status)
    }

    async fn delete_volume(&self, volume_id: &str) -> Result<(), String> {
        let request = DeleteVolumeRequest {
            volume_id: volume_id.into(),
            ..Default::default()
        };
        self.controller
            .clone()
            .delete_volume(request)
            .await
            .map(drop)
            .map_err(status)
    }

    /// Waits until the simulated device of `volume_id` has `gib` GiB, as
    /// the hypervisor resizes an NVMe namespace after ModifyVolume.
    async fn device_size(&self, volume_id: &str, gib: i64) -> Result<(), String> {
        let link = self.dev_dir.join(format!(
            "disk/by-id/nvme-Amazon_Elastic_Block_Store_{}",
            volume_id.replacen('-', "", 1)
        ));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let device = std::fs::canonicalize(&link).map_err(|e| format!("{}: {e}", link.display()))?;
            let name = device
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let sectors: i64 = std::fs::read_to_string(format!("/sys/block/{name}/size"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            if sectors * 512 >= gib * GIB {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{} stayed at {sectors} sectors", device.display()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The whole volume lifecycle.
///
/// # Errors
/// The first step that fails.
pub async fn lifecycle(env: &Environment, report: &mut Report) -> Result<(), Failure> {
    let fs = env.fs_type;
    let mut d = Driver {
        controller: env.controller.client().await,
        node: env.agent.node().await,
        instance_id: env.instance_id.clone(),
        kubelet: env.sandbox.kubelet(),
        dev_dir: env.sandbox.dev_dir(),
        capability: mount_capability(fs),
    };
    let volume_id = report
        .step(
            &format!("CreateVolume (gp3, 4 GiB, {fs}, {ZONE})"),
            Component::Controller,
            d.create("pvc-demo", 4, None),
        )
        .await?;
    let volume = report
        .step(
            "ControllerPublishVolume → demo instance",
            Component::Controller,
            d.attach(&volume_id, "pvc-demo"),
        )
        .await?;
    report.note(&format!("{volume_id} attached as {}", volume.device_path));
    report
        .step(
            "NodeStageVolume (device appears, mkfs, mount)",
            Component::Agent,
            d.stage(&volume),
        )
        .await?;
    report
        .step(
            "NodePublishVolume (bind mount into the pod)",
            Component::Agent,
            d.publish(&volume),
        )
        .await?;
    let file = volume.target.join("hello.txt");
    report
        .step(
            "write a file in the volume and read it back",
            Component::Workload,
            write_and_check(&file),
        )
        .await?;
    let mut controller = d.controller.clone();
    let expand = ControllerExpandVolumeRequest {
        volume_id: volume_id.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: 8 * GIB,
            limit_bytes: 0,
        }),
        volume_capability: Some(d.capability.clone()),
        ..Default::default()
    };
    report
        .step(
            "ControllerExpandVolume to 8 GiB (ModifyVolume)",
            Component::Controller,
            async {
                controller
                    .controller_expand_volume(expand)
                    .await
                    .map(drop)
                    .map_err(status)
            },
        )
        .await?;
    report
        .step(
            "the device grows to 8 GiB (attach simulator)",
            Component::Simulator,
            d.device_size(&volume_id, 8),
        )
        .await?;
    let mut node = d.node.clone();
    let grow = NodeExpandVolumeRequest {
        volume_id: volume_id.clone(),
        volume_path: path(&volume.target),
        staging_target_path: path(&volume.staging),
        volume_capability: Some(d.capability.clone()),
        ..Default::default()
    };
    let target = volume.target.clone();
    report
        .step(
            &format!("NodeExpandVolume ({fs} grows online)"),
            Component::Agent,
            async {
                let capacity = node
                    .node_expand_volume(grow)
                    .await
                    .map_err(status)?
                    .into_inner()
                    .capacity_bytes;
                let vfs = rustix::fs::statvfs(&target).map_err(|e| e.to_string())?;
                let size = i64::try_from(vfs.f_blocks * vfs.f_frsize).unwrap_or_default();
                if capacity < 8 * GIB || size < 7 * GIB {
                    return Err(format!("capacity {capacity} bytes, filesystem {size} bytes"));
                }
                Ok(())
            },
        )
        .await?;
    let mut controller = d.controller.clone();
    let snapshot_request = CreateSnapshotRequest {
        source_volume_id: volume_id.clone(),
        name: "snapshot-demo".into(),
        ..Default::default()
    };
    let snapshot_id = report
        .step("CreateSnapshot", Component::Controller, async {
            let s = controller
                .create_snapshot(snapshot_request)
                .await
                .map_err(status)?
                .into_inner()
                .snapshot
                .ok_or("no snapshot")?;
            Ok(s.snapshot_id)
        })
        .await?;
    let source = VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: snapshot_id.clone(),
            },
        )),
    };
    let restored_id = report
        .step(
            "CreateVolume from the snapshot",
            Component::Controller,
            d.create("pvc-restored", 8, Some(source)),
        )
        .await?;
    let restored = report
        .step(
            "ControllerPublishVolume (restored volume)",
            Component::Controller,
            d.attach(&restored_id, "pvc-restored"),
        )
        .await?;
    report
        .step(
            "NodeStageVolume (restored: mounted, not formatted)",
            Component::Agent,
            d.stage(&restored),
        )
        .await?;
    report
        .step("NodePublishVolume (restored)", Component::Agent, d.publish(&restored))
        .await?;
    let copy = restored.target.join("hello.txt");
    report
        .step("the file is in the restored volume", Component::Workload, async {
            let text = std::fs::read_to_string(&copy).map_err(|e| format!("{}: {e}", copy.display()))?;
            if text == CONTENT {
                Ok(())
            } else {
                Err(format!("read {text:?}"))
            }
        })
        .await?;
    let mut groups = env.controller.groups().await;
    let members = [volume_id.clone(), restored_id.clone()];
    let group_request = CreateVolumeGroupSnapshotRequest {
        name: "groupsnapshot-demo".into(),
        source_volume_ids: members.to_vec(),
        ..Default::default()
    };
    let group = report
        .step(
            "CreateVolumeGroupSnapshot of both volumes (attached to one instance: one CreateSnapshots)",
            Component::Controller,
            async {
                let group = groups
                    .create_volume_group_snapshot(group_request)
                    .await
                    .map_err(status)?
                    .into_inner()
                    .group_snapshot
                    .ok_or("no group snapshot")?;
                let mut sources: Vec<&str> = group.snapshots.iter().map(|s| s.source_volume_id.as_str()).collect();
                sources.sort_unstable();
                let mut expected: Vec<&str> = members.iter().map(String::as_str).collect();
                expected.sort_unstable();
                if sources != expected
                    || group
                        .snapshots
                        .iter()
                        .any(|s| s.group_snapshot_id != group.group_snapshot_id)
                {
                    return Err(format!("members {sources:?}, of {expected:?}"));
                }
                Ok(group)
            },
        )
        .await?;
    report
        .step(
            "DeleteVolumeGroupSnapshot (and its members)",
            Component::Controller,
            async {
                let r = DeleteVolumeGroupSnapshotRequest {
                    group_snapshot_id: group.group_snapshot_id.clone(),
                    snapshot_ids: group.snapshots.iter().map(|s| s.snapshot_id.clone()).collect(),
                    ..Default::default()
                };
                groups.delete_volume_group_snapshot(r).await.map(drop).map_err(status)
            },
        )
        .await?;
    backup::changed_blocks(&d, env, report).await?;
    d.teardown(&restored, report).await?;
    d.teardown(&volume, report).await?;
    report
        .step(
            &format!("DeleteSnapshot {snapshot_id}"),
            Component::Controller,
            d.delete_snapshot(&snapshot_id),
        )
        .await?;
    for id in [restored_id, volume_id] {
        report
            .step(
                &format!("DeleteVolume {id}"),
                Component::Controller,
                d.delete_volume(&id),
            )
            .await?;
    }
    let sandbox = &env.sandbox;
    report
        .step("nothing left mounted", Component::Agent, async {
            let left = sandbox.mounts();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("still mounted: {left:?}"))
            }
        })
        .await
}

async fn write_and_check(file: &Path) -> Result<(), String> {
    let error = |e: std::io::Error| format!("{}: {e}", file.display());
    std::fs::write(file, CONTENT).map_err(error)?;
    let handle = std::fs::File::open(file).map_err(error)?;
    handle.sync_all().map_err(error)?;
    rustix::fs::syncfs(&handle).map_err(|e| e.to_string())?;
    let back = std::fs::read_to_string(file).map_err(error)?;
    if back == CONTENT {
        Ok(())
    } else {
        Err(format!("read back {back:?}"))
    }
}

/// Starts everything, runs the lifecycle, and cleans up (processes,
/// mounts, loop devices, files) whatever the outcome.
///
/// # Errors
/// The first step that fails.
pub async fn run(report: &mut Report) -> Result<(), Failure> {
    let env = start(report).await?;
    let result = lifecycle(&env, report).await;
    tokio::task::spawn_blocking(move || drop(env))
        .await
        .map_err(|e| Failure {
            step: "clean up".into(),
            component: Component::Workload,
            error: e.to_string(),
            log_tail: String::new(),
        })?;
    result
}
