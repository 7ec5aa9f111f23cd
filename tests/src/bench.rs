//! `make bench`: what operators feel, each figure next to a baseline
//! measured in the same run (the machine is shared and noisy, so ratios
//! are what count), median and spread over repetitions. The table goes to
//! `target/bench/report.md`, the figures to `target/bench/report.json`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use ebs_csi_proto::v1::node_client::NodeClient;
use ebs_csi_proto::v1::volume_capability::access_mode::Mode;
use ebs_csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use ebs_csi_proto::v1::*;
use tonic::transport::Channel;

use crate::run;
use crate::trace::ClientStamps;
use crate::{Agent, Helper, LoopVolume, Sandbox};

pub mod claims;

/// How big and how often.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    /// Repetitions of each timed step.
    pub reps: usize,
    /// Size of the ordinary volume, MiB.
    pub volume_mib: u64,
    /// Size of the large volume, MiB (16383 GiB in the full run).
    pub large_mib: u64,
    /// Volumes staged at once.
    pub concurrent: usize,
    /// Claims taken to their pods through the real cluster (P9).
    pub claims: usize,
}

impl Scale {
    /// The full run.
    pub const FULL: Self = Self {
        reps: 5,
        volume_mib: 1024,
        large_mib: 16_383 << 10,
        concurrent: 32,
        claims: 20,
    };
    /// The smoke run inside `make test`: tiny sizes, one repetition.
    pub const SMOKE: Self = Self {
        reps: 1,
        volume_mib: 320,
        large_mib: 1024,
        concurrent: 4,
        claims: 1,
    };
}

/// One line of the report.
#[derive(Clone, Debug)]
pub struct Row {
    /// What was measured.
    pub name: String,
    /// Median, in `unit`.
    pub value: f64,
    /// Smallest and largest sample.
    pub spread: (f64, f64),
    /// `ms`, `MiB`, `sectors`, `calls`, …
    pub unit: &'static str,
    /// The baseline's median, when there is one.
    pub baseline: Option<f64>,
    /// The target, as text (`≤ 1.10× floor`).
    pub target: String,
    /// Whether the target is met.
    pub met: bool,
}

/// Median, minimum and maximum.
pub fn summarize(samples: &[f64]) -> (f64, (f64, f64)) {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = if sorted.is_empty() {
        0.0
    } else {
        sorted[sorted.len() / 2]
    };
    (
        median,
        (
            sorted.first().copied().unwrap_or(0.0),
            sorted.last().copied().unwrap_or(0.0),
        ),
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn capability(fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..MountVolume::default()
        })),
    }
}

/// A node under test: helper, agent and a client.
pub struct Node {
    /// The sandbox.
    pub sandbox: Sandbox,
    /// The helper.
    pub helper: Helper,
    /// The agent.
    pub agent: Agent,
    /// Stages and publishes through the agent.
    pub stager: Stager,
    next: u64,
}

/// What [`Stager::stage_publish`] measured.
#[derive(Clone, Copy, Debug)]
pub struct StagePublish {
    /// From sending NodeStageVolume to NodePublishVolume's answer.
    pub elapsed: Duration,
    /// The client's moments.
    pub stamps: ClientStamps,
}

/// Drives NodeStage/NodePublish; cheap to clone for concurrent calls.
#[derive(Clone)]
pub struct Stager {
    client: NodeClient<Channel>,
    kubelet: PathBuf,
}

impl Node {
    /// Starts a helper and an agent (`extra` agent flags).
    pub async fn start(extra: &[&str]) -> Self {
        Self::start_with(&[], extra).await
    }

    /// Starts a helper (`helper_flags`) and an agent (`extra` agent flags).
    pub async fn start_with(helper_flags: &[&str], extra: &[&str]) -> Self {
        let sandbox = Sandbox::new();
        let helper = Helper::start(&sandbox, helper_flags);
        let args = [&Agent::NODE_FLAGS[..], &["--device-wait-seconds", "60"], extra].concat();
        let agent = Agent::spawn(&sandbox, &helper, &args, &[]);
        let stager = Stager {
            client: agent.node().await,
            kubelet: sandbox.kubelet(),
        };
        Self {
            sandbox,
            helper,
            agent,
            stager,
            next: 0,
        }
    }

    /// A fresh volume id.
    pub fn volume_id(&mut self) -> String {
        self.next += 1;
        format!("vol-{:017x}", 0xbe00_0000_0000_u64 + self.next)
    }

    /// A blank volume of `mib` MiB, linked as an EBS volume.
    pub fn volume(&mut self, mib: u64) -> LoopVolume {
        let volume = self.plain_volume(mib);
        self.sandbox.link_ebs_device(&volume);
        volume
    }

    /// A blank loop volume of `mib` MiB that the agent cannot see (for
    /// the baselines).
    pub fn plain_volume(&mut self, mib: u64) -> LoopVolume {
        let id = self.volume_id();
        LoopVolume::create(self.sandbox.path(), &id, mib)
    }
}

impl Stager {
    fn paths(&self, volume_id: &str) -> (String, String) {
        let staging = crate::kubelet_staging(&self.kubelet, volume_id);
        let target = crate::kubelet_target(&self.kubelet, &format!("pod-{volume_id}"), volume_id, volume_id);
        (
            staging.to_string_lossy().into_owned(),
            target.to_string_lossy().into_owned(),
        )
    }

    /// NodeStage + NodePublish of `volume_id`: the time both took, and
    /// when each was sent and answered (for [`crate::trace::steps`]).
    pub async fn stage_publish(&mut self, volume_id: &str, fs: &str) -> StagePublish {
        let (staging, target) = self.paths(volume_id);
        let start = Instant::now();
        let stage_sent = SystemTime::now();
        let stage = NodeStageVolumeRequest {
            volume_id: volume_id.into(),
            staging_target_path: staging.clone(),
            volume_capability: Some(capability(fs)),
            ..Default::default()
        };
        // A busy helper answers UNAVAILABLE; retry as kubelet would.
        while let Err(status) = self.client.node_stage_volume(stage.clone()).await {
            assert_eq!(status.code(), tonic::Code::Unavailable, "NodeStageVolume: {status:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let staged = SystemTime::now();
        let publish = NodePublishVolumeRequest {
            volume_id: volume_id.into(),
            staging_target_path: staging,
            target_path: target,
            volume_capability: Some(capability(fs)),
            ..Default::default()
        };
        let publish_sent = SystemTime::now();
        while let Err(status) = self.client.node_publish_volume(publish.clone()).await {
            assert_eq!(status.code(), tonic::Code::Unavailable, "NodePublishVolume: {status:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        StagePublish {
            elapsed: start.elapsed(),
            stamps: ClientStamps {
                stage_sent,
                staged,
                publish_sent,
                published: SystemTime::now(),
            },
        }
    }

    /// NodeUnpublish + NodeUnstage.
    pub async fn teardown(&mut self, volume_id: &str) {
        let (staging, target) = self.paths(volume_id);
        let unpublish = NodeUnpublishVolumeRequest {
            volume_id: volume_id.into(),
            target_path: target,
        };
        self.client
            .node_unpublish_volume(unpublish)
            .await
            .expect("NodeUnpublishVolume");
        let unstage = NodeUnstageVolumeRequest {
            volume_id: volume_id.into(),
            staging_target_path: staging,
        };
        self.client
            .node_unstage_volume(unstage)
            .await
            .expect("NodeUnstageVolume");
    }
}

/// The floor: the same mkfs, `mount(2)` and bind mount, done directly.
pub fn floor(device: &Path, dir: &Path, fs: &str) -> Duration {
    let (staging, target) = (
        crate::make_dir(&dir.join("floor-staging")),
        crate::make_dir(&dir.join("floor-target")),
    );
    let dev = device.to_string_lossy();
    let start = Instant::now();
    match fs {
        "xfs" => run("mkfs.xfs", &["-q", "-K", &dev]),
        _ => run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-m0",
                "-E",
                "nodiscard,lazy_itable_init=1,lazy_journal_init=1",
                &dev,
            ],
        ),
    };
    let data = if fs == "xfs" { Some(c"nouuid") } else { None };
    rustix::mount::mount(
        &*dev,
        &staging,
        fs,
        rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
        data,
    )
    .expect("mount");
    rustix::mount::mount_bind(&staging, &target).expect("bind");
    let elapsed = start.elapsed();
    for path in [&target, &staging] {
        rustix::mount::unmount(path, rustix::mount::UnmountFlags::empty()).expect("umount");
    }
    elapsed
}

/// The Go driver's command sequence (mount-utils): `blkid` probe,
/// `mkfs -F -m0` (`mkfs.xfs -f`), `mount`, `mount --bind`.
pub fn go_sequence(device: &Path, dir: &Path, fs: &str) -> Duration {
    let (staging, target) = (
        crate::make_dir(&dir.join("go-staging")),
        crate::make_dir(&dir.join("go-target")),
    );
    let (dev, st, tg) = (
        device.to_string_lossy(),
        staging.to_string_lossy(),
        target.to_string_lossy(),
    );
    let start = Instant::now();
    let _ = Command::new("blkid")
        .args(["-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", &dev])
        .output();
    match fs {
        "xfs" => run("mkfs.xfs", &["-f", &dev]),
        _ => run("mkfs.ext4", &["-F", "-m0", &dev]),
    };
    let options = if fs == "xfs" { "defaults,nouuid" } else { "defaults" };
    run("mount", &["-t", fs, "-o", options, &dev, &st]);
    run("mount", &["--bind", &st, &tg]);
    let elapsed = start.elapsed();
    run("umount", &[&tg]);
    run("umount", &[&st]);
    elapsed
}

/// Discarded sectors so far on a block device (`/sys/block/DEV/stat`,
/// field 15: discard sectors; Documentation/block/stat.rst).
pub fn discarded_sectors(device: &Path) -> u64 {
    let name = device
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    std::fs::read_to_string(format!("/sys/block/{name}/stat"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(13).and_then(|f| f.parse().ok()))
        .unwrap_or(0)
}

/// Resident set size of a process, MiB (`VmRSS` of `/proc/PID/status`).
pub fn rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// The anonymous part of a process's resident set, MiB (`RssAnon`: heap,
/// stacks; the rest of the RSS is mapped files, chiefly program text).
pub fn anonymous_mib(pid: u32) -> f64 {
    status_mib(pid, "RssAnon:")
}

/// A process's proportional set size, MiB (`Pss` of
/// `/proc/PID/smaps_rollup`: each page shared with other processes counted
/// in shares, so that the helper's and its runner's, which share the pages
/// of one program, add up to what both cost the node).
pub fn pss_mib(pid: u32) -> f64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let kib: f64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn status_mib(pid: u32, key: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Renders rows as the Markdown table of `report.md`.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| measure | median | spread (min–max) | baseline | ratio | target | met |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let baseline = r.baseline.map_or("–".to_owned(), |b| format!("{b:.1} {}", r.unit));
        let ratio = r
            .baseline
            .filter(|b| *b > 0.0)
            .map_or("–".to_owned(), |b| format!("{:.2}×", r.value / b));
        let _ = writeln!(
            out,
            "| {} | {:.1} {} | {:.1}–{:.1} | {baseline} | {ratio} | {} | {} |",
            r.name,
            r.value,
            r.unit,
            r.spread.0,
            r.spread.1,
            r.target,
            if r.met { "yes" } else { "**no**" }
        );
    }
    out
}

/// Renders rows as JSON (no dependency needed for this flat shape).
pub fn json(rows: &[Row]) -> String {
    let items: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{{\"name\":{:?},\"median\":{},\"min\":{},\"max\":{},\"unit\":{:?},\"baseline\":{},\"target\":{:?},\"met\":{}}}",
                r.name,
                r.value,
                r.spread.0,
                r.spread.1,
                r.unit,
                r.baseline.map_or("null".to_owned(), |b| b.to_string()),
                r.target,
                r.met
            )
        })
        .collect();
    format!("[\n  {}\n]\n", items.join(",\n  "))
}

/// Times `reps` runs of `work`, in milliseconds.
pub async fn time_ms<F, Fut>(reps: usize, mut work: F) -> Vec<f64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Duration>,
{
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        samples.push(ms(work().await));
    }
    samples
}

/// Milliseconds of a duration.
pub fn millis(d: Duration) -> f64 {
    ms(d)
}
