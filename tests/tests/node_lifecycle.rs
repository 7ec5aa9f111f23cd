//! The real agent (as uid 65534) and helper (as root), driven over CSI
//! with loop devices standing in for EBS volumes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ebs_csi_helper::error::OTHER_VOLUMES_HASH;
use ebs_csi_proto::v1::node_client::NodeClient;
use ebs_csi_proto::v1::volume_capability::access_mode::Mode;
use ebs_csi_proto::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use ebs_csi_proto::v1::*;
use ebs_csi_tests::nomad::{self, NomadClient};
use ebs_csi_tests::otlp::{OtlpCollector, SPAN_KIND_CLIENT, SPAN_KIND_SERVER, TRACEPARENT};
use ebs_csi_tests::{AGENT_UID, Agent, Helper, LoopVolume, Sandbox, is_mounted, mounts_under, require_root};
use tonic::Code;
use tonic::transport::Channel;

/// One volume on one node: sandbox, helper, agent, device, paths.
struct Node {
    sandbox: Sandbox,
    _helper: Helper,
    agent: Agent,
    client: NodeClient<Channel>,
    staging: PathBuf,
    target: PathBuf,
}

impl Node {
    /// A node laid out as a kubelet's, with kubelet's staging and target
    /// paths of `volume_id` (its record of the volume beside each).
    async fn start(volume_id: &str) -> Self {
        Self::start_with(volume_id, &[], &[]).await
    }

    /// [`Node::start`] with `extra` arguments and the environment `env`
    /// for the agent.
    async fn start_with(volume_id: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let sandbox = Sandbox::new();
        let helper = Helper::start(&sandbox, &[]);
        let staging = sandbox.staging(volume_id);
        let target = sandbox.target("pod-1", "pv-1", volume_id);
        let args = [&Agent::NODE_FLAGS[..], &["--device-wait-seconds", "10"], extra].concat();
        let agent = Agent::spawn(&sandbox, &helper, &args, env);
        Self::with_paths(sandbox, helper, agent, staging, target).await
    }

    /// A Nomad client running the node job of deploy/nomad (see
    /// `ebs_csi_tests::nomad`): Nomad's directories and modes, the task's
    /// own command line, staging and target paths built on its
    /// `stage_publish_base_dir`, the helper's allowed root.
    async fn start_nomad(volume_id: &str) -> Self {
        let sandbox = Sandbox::new();
        let nomad = NomadClient::new(sandbox.path());
        let plugin_dir = nomad.plugin_dir.clone();
        let helper = Helper::start(
            &sandbox,
            &[
                "--allowed-root",
                plugin_dir.to_str().unwrap(),
                "--allowed-layout",
                "nomad",
            ],
        );
        let args = [&Agent::NODE_FLAGS[..], &["--device-wait-seconds", "10"]].concat();
        let agent = nomad.start_node_task(sandbox.path(), &helper, &args);
        let usage = "rw-file-system-single-node-writer";
        // Nomad makes the staging directory (MkdirAll, 0700) before
        // NodeStageVolume; the plugin makes the target.
        let staging = plugin_dir.join(format!("staging/default/{volume_id}/{usage}"));
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o700)).unwrap();
        let target = plugin_dir.join(format!("per-alloc/{}/{volume_id}/{usage}", nomad::NODE_ALLOC_ID));
        Self::with_paths(sandbox, helper, agent, staging, target).await
    }

    /// A node of `agent` and `helper`; stages at `staging`, publishes at `target`.
    async fn with_paths(sandbox: Sandbox, helper: Helper, agent: Agent, staging: PathBuf, target: PathBuf) -> Self {
        let client = agent.node().await;
        Self {
            sandbox,
            _helper: helper,
            agent,
            client,
            staging,
            target,
        }
    }

    fn volume(&self, volume_id: &str, size_mib: u64) -> LoopVolume {
        let volume = LoopVolume::create(self.sandbox.path(), volume_id, size_mib);
        self.sandbox.link_ebs_device(&volume);
        volume
    }

    async fn stage(&mut self, volume_id: &str, capability: VolumeCapability) -> Result<(), tonic::Status> {
        let request = NodeStageVolumeRequest {
            volume_id: volume_id.into(),
            staging_target_path: path(&self.staging),
            volume_capability: Some(capability),
            publish_context: [("devicePath".to_owned(), "/dev/xvdba".to_owned())].into(),
            ..Default::default()
        };
        self.client.node_stage_volume(request).await.map(drop)
    }

    async fn unstage(&mut self, volume_id: &str) -> Result<(), tonic::Status> {
        let request = NodeUnstageVolumeRequest {
            volume_id: volume_id.into(),
            staging_target_path: path(&self.staging),
        };
        self.client.node_unstage_volume(request).await.map(drop)
    }

    async fn publish(
        &mut self,
        volume_id: &str,
        capability: VolumeCapability,
        readonly: bool,
    ) -> Result<(), tonic::Status> {
        let request = NodePublishVolumeRequest {
            volume_id: volume_id.into(),
            staging_target_path: path(&self.staging),
            target_path: path(&self.target),
            volume_capability: Some(capability),
            readonly,
            ..Default::default()
        };
        self.client.node_publish_volume(request).await.map(drop)
    }

    async fn unpublish(&mut self, volume_id: &str) -> Result<(), tonic::Status> {
        let request = NodeUnpublishVolumeRequest {
            volume_id: volume_id.into(),
            target_path: path(&self.target),
        };
        self.client.node_unpublish_volume(request).await.map(drop)
    }
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn mount(fs_type: &str, mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            mount_flags: vec!["noatime".into()],
            ..Default::default()
        })),
    }
}

fn block() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn stage_publish_write_and_restage_keeps_data() {
    require_root();
    for (volume_id, fs_type, size_mib) in [
        ("vol-0aaaaaaaaaaaaaaa1", "ext4", 64),
        ("vol-0bbbbbbbbbbbbbbb2", "xfs", 320),
    ] {
        let mut node = Node::start(volume_id).await;
        let volume = node.volume(volume_id, size_mib);
        let cap = mount(fs_type, Mode::SingleNodeWriter);
        for _ in 0..2 {
            node.stage(volume_id, cap.clone()).await.unwrap();
            assert!(is_mounted(&node.staging));
        }
        // Each mutating RPC that succeeds is logged once at info.
        let log = node.agent.process.log();
        let done = log
            .lines()
            .filter(|l| l.contains("INFO") && l.contains(r#"rpc="NodeStageVolume""#) && l.contains(" done "))
            .count();
        assert_eq!(done, 2, "two stages, two info lines:\n{log}");
        assert!(
            volume.signature().contains(&format!("TYPE={fs_type}")),
            "{}",
            volume.signature()
        );
        for _ in 0..2 {
            node.publish(volume_id, cap.clone(), false).await.unwrap();
            assert!(is_mounted(&node.target));
        }
        std::fs::write(node.target.join("hello.txt"), "kept across restage").unwrap();
        for _ in 0..2 {
            node.unpublish(volume_id).await.unwrap();
            assert!(!node.target.exists(), "the target is removed");
        }
        for _ in 0..2 {
            node.unstage(volume_id).await.unwrap();
            assert!(!is_mounted(&node.staging));
        }
        node.stage(volume_id, cap.clone()).await.unwrap();
        node.publish(volume_id, cap.clone(), false).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(node.target.join("hello.txt")).unwrap(),
            "kept across restage"
        );
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = mountinfo.lines().find(|l| l.contains(&path(&node.target))).unwrap();
        assert!(
            line.contains("nosuid") && line.contains("nodev") && line.contains("noatime"),
            "{line}"
        );
        node.unpublish(volume_id).await.unwrap();
        node.unstage(volume_id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn nomad_paths_are_staged_and_published_beneath_the_plugin_directory() {
    require_root();
    let volume_id = "vol-0ccccccccccccccc3";
    let mut node = Node::start_nomad(volume_id).await;
    // Root made the socket in Nomad's root-only directory; on the first
    // connection systemd-socket-activate became setpriv, then the agent.
    nomad::assert_handed_over(node.agent.process.pid(), "ebs-csi-agent", AGENT_UID);
    let _volume = node.volume(volume_id, 64);
    let cap = mount("ext4", Mode::SingleNodeWriter);
    node.stage(volume_id, cap.clone()).await.unwrap();
    node.publish(volume_id, cap.clone(), false).await.unwrap();
    assert!(is_mounted(&node.staging) && is_mounted(&node.target));
    std::fs::write(node.target.join("hello.txt"), "from an allocation").unwrap();
    node.unpublish(volume_id).await.unwrap();
    node.unstage(volume_id).await.unwrap();
    assert!(!is_mounted(&node.staging) && !node.target.exists());
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn readonly_publish_refuses_writes() {
    require_root();
    let volume_id = "vol-0ccccccccccccccc3";
    let mut node = Node::start(volume_id).await;
    let _volume = node.volume(volume_id, 64);
    node.stage(volume_id, mount("ext4", Mode::SingleNodeWriter))
        .await
        .unwrap();
    node.publish(volume_id, mount("ext4", Mode::SingleNodeReaderOnly), true)
        .await
        .unwrap();
    let err = std::fs::write(node.target.join("x"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(30), "EROFS expected, got {err}");
    node.publish(volume_id, mount("ext4", Mode::SingleNodeReaderOnly), true)
        .await
        .unwrap();
    let incompatible = node
        .publish(volume_id, mount("ext4", Mode::SingleNodeWriter), false)
        .await
        .unwrap_err();
    assert_eq!(incompatible.code(), Code::AlreadyExists, "{incompatible:?}");
    node.unpublish(volume_id).await.unwrap();
    node.unstage(volume_id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn raw_block_publish_exposes_the_device() {
    require_root();
    let volume_id = "vol-0ddddddddddddddd4";
    let mut node = Node::start(volume_id).await;
    let volume = node.volume(volume_id, 16);
    node.target = node.sandbox.block_target("pod-1", "pv-1", volume_id);
    node.stage(volume_id, block()).await.unwrap();
    assert!(!is_mounted(&node.staging), "block volumes are not staged");
    for _ in 0..2 {
        node.publish(volume_id, block(), false).await.unwrap();
    }
    let meta = std::fs::metadata(&node.target).unwrap();
    assert!(meta.file_type().is_block_device());
    let mut device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&node.target)
        .unwrap();
    device.write_all(b"raw bytes").unwrap();
    device.seek(SeekFrom::Start(0)).unwrap();
    let mut back = [0u8; 9];
    device.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"raw bytes");
    // As a pod's database would: a close writes a block device's cache
    // back only when it is the last one open (block/bdev.c), and another
    // process may have the device open at that moment (seen once in a
    // cold make test, its tests side by side: the backing file still zero).
    device.sync_all().unwrap();
    drop(device);
    let stats = node
        .client
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: volume_id.into(),
            volume_path: path(&node.target),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(u64::try_from(stats.usage[0].total).unwrap(), volume.size_bytes());
    assert!(!stats.volume_condition.unwrap().abnormal);
    // kubelet maps the device into the pod with a bind at
    // volumeDevices/<pv>/dev/<pod uid> (`MapBlockVolume`), and names that
    // map in its NodeGetVolumeStats (seen from a real kubelet).
    let map = node
        .sandbox
        .kubelet()
        .join("plugins/kubernetes.io/csi/volumeDevices/pv-1/dev/pod-1");
    std::fs::create_dir_all(map.parent().unwrap()).unwrap();
    std::fs::File::create(&map).unwrap();
    rustix::mount::mount_bind(node.target.as_path(), map.as_path()).unwrap();
    let mapped = node
        .client
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: volume_id.into(),
            volume_path: path(&map),
            staging_target_path: String::new(),
        })
        .await;
    rustix::mount::unmount(map.as_path(), rustix::mount::UnmountFlags::empty()).unwrap();
    let mapped = mapped.unwrap().into_inner();
    assert_eq!(u64::try_from(mapped.usage[0].total).unwrap(), volume.size_bytes());
    let mut backing = std::fs::File::open(&volume.file).unwrap();
    backing.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"raw bytes", "the bytes reached the volume");
    node.unpublish(volume_id).await.unwrap();
    assert!(!node.target.exists());
    assert_eq!(volume.signature(), "", "a block volume is never formatted");
}

/// Online ext4 growth needs CAP_SYS_RESOURCE (ext4_resize_begin); some
/// sandboxes withhold it even from root. There the call must fail with the
/// kernel's refusal of EXT4_IOC_RESIZE_FS (the systemd VMs grow ext4 for
/// real).
fn ext4_growth_withheld(err: &tonic::Status) {
    assert!(
        err.message().contains("growing the filesystem at") && err.message().contains("Operation not permitted"),
        "{err:?}"
    );
    eprintln!("skipped ext4 growth: this machine withholds CAP_SYS_RESOURCE from root");
}

/// A volume restored from a snapshot (or cloned) into a larger size holds a
/// filesystem smaller than its device: NodeStage grows it, like the Go
/// driver, even when its root is unreadable to others; a grow that fails
/// leaves nothing mounted, so a retry grows it.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn a_filesystem_smaller_than_its_volume_is_grown_at_stage() {
    require_root();
    for (volume_id, fs_type, size_mib) in [
        ("vol-0eeeeeeeeeeeeeee7", "ext4", 64),
        ("vol-0fffffffffffffff8", "xfs", 320),
    ] {
        let mut node = Node::start(volume_id).await;
        let volume = node.volume(volume_id, size_mib);
        let cap = mount(fs_type, Mode::SingleNodeWriter);
        node.stage(volume_id, cap.clone()).await.unwrap();
        let before = rustix::fs::statvfs(&node.staging).unwrap();
        give_root_away(&node.staging);
        node.unstage(volume_id).await.unwrap();
        volume.grow(size_mib * 2);
        if fs_type == "ext4" && !ebs_csi_tests::has_cap_sys_resource() {
            ext4_growth_withheld(&node.stage(volume_id, cap.clone()).await.unwrap_err());
            assert!(!is_mounted(&node.staging), "a failed grow left the mount");
            continue;
        }
        node.stage(volume_id, cap.clone()).await.unwrap();
        let after = rustix::fs::statvfs(&node.staging).unwrap();
        assert!(
            after.f_blocks * after.f_frsize > before.f_blocks * before.f_frsize * 3 / 2,
            "{fs_type} was not grown at stage"
        );
        node.unstage(volume_id).await.unwrap();
    }
}

/// Makes a mounted filesystem's root what an application may make it:
/// owned by another user, mode 0700. Growth opens that root (the helper's
/// grower thread for ext4, xfsprogs growfs): only the helper's
/// CAP_DAC_READ_SEARCH lets them.
fn give_root_away(root: &Path) {
    std::os::unix::fs::chown(root, Some(4242), Some(4242)).unwrap();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).unwrap();
}

/// NodeExpandVolume grows a published filesystem online, even when its
/// root is unreadable to others.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn expand_grows_the_filesystem_online() {
    require_root();
    for (volume_id, fs_type, size_mib) in [
        ("vol-0eeeeeeeeeeeeeee5", "ext4", 64),
        ("vol-0fffffffffffffff6", "xfs", 320),
    ] {
        let mut node = Node::start(volume_id).await;
        let volume = node.volume(volume_id, size_mib);
        let cap = mount(fs_type, Mode::SingleNodeWriter);
        node.stage(volume_id, cap.clone()).await.unwrap();
        node.publish(volume_id, cap.clone(), false).await.unwrap();
        let before = rustix::fs::statvfs(&node.target).unwrap();
        give_root_away(&node.staging);
        volume.grow(size_mib * 2);
        let request = NodeExpandVolumeRequest {
            volume_id: volume_id.into(),
            volume_path: path(&node.target),
            staging_target_path: path(&node.staging),
            volume_capability: Some(cap),
            ..Default::default()
        };
        if fs_type == "ext4" && !ebs_csi_tests::has_cap_sys_resource() {
            ext4_growth_withheld(&node.client.node_expand_volume(request).await.unwrap_err());
            continue;
        }
        let response = node
            .client
            .node_expand_volume(request.clone())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(u64::try_from(response.capacity_bytes).unwrap(), volume.size_bytes());
        let after = rustix::fs::statvfs(&node.target).unwrap();
        assert!(
            after.f_blocks * after.f_frsize > before.f_blocks * before.f_frsize * 3 / 2,
            "{fs_type} did not grow"
        );
        node.client.node_expand_volume(request).await.unwrap();
        let df = ebs_csi_tests::run("df", &["-B1", "--output=size", &path(&node.target)]);
        let df_size: u64 = df.lines().nth(1).unwrap().trim().parse().unwrap();
        assert!(df_size > (size_mib << 20) * 3 / 2, "df shows {df_size}");
        node.unpublish(volume_id).await.unwrap();
        node.unstage(volume_id).await.unwrap();
    }
}

/// The Go driver's `partition` volume attribute (a static PV of a
/// partitioned volume): Stage and Publish act on that partition of the
/// volume, Expand and VolumeStats find it mounted; a value that is not a
/// partition number is refused before anything happens.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn the_partition_attribute_stages_and_publishes_that_partition() {
    require_root();
    let volume_id = "vol-0aaaaaaaaaaaaaac9";
    let mut node = Node::start(volume_id).await;
    let (volume, partitions) = LoopVolume::partitioned(node.sandbox.path(), volume_id, 64, &[32]);
    node.sandbox.link_ebs_device(&volume);
    let cap = mount("ext4", Mode::SingleNodeWriter);
    let context = |partition: &str| HashMap::from([("partition".to_owned(), partition.to_owned())]);
    let stage = |partition: &str| NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: path(&node.staging),
        volume_capability: Some(cap.clone()),
        volume_context: context(partition),
        ..Default::default()
    };
    let mounts = mounts_under(node.sandbox.path());
    let refused = node.client.node_stage_volume(stage("first")).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(
        refused.message(),
        "volume attribute partition=first: not a partition number (1, 2, …; 0 is the whole volume)"
    );
    assert_eq!(mounts_under(node.sandbox.path()), mounts);
    node.client.node_stage_volume(stage("1")).await.unwrap();
    let partition = ebs_csi_tests::guest::device_number(&partitions[0]);
    assert_eq!(ebs_csi_tests::guest::mounted_device(&node.staging), partition);
    assert_eq!(volume.signature(), "PTTYPE=gpt");
    let publish = NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: path(&node.staging),
        target_path: path(&node.target),
        volume_capability: Some(cap.clone()),
        volume_context: context("1"),
        ..Default::default()
    };
    node.client.node_publish_volume(publish).await.unwrap();
    assert_eq!(ebs_csi_tests::guest::mounted_device(&node.target), partition);
    let expand = NodeExpandVolumeRequest {
        volume_id: volume_id.into(),
        volume_path: path(&node.target),
        staging_target_path: path(&node.staging),
        volume_capability: Some(cap),
        ..Default::default()
    };
    let expanded = node.client.node_expand_volume(expand).await.unwrap().into_inner();
    assert_eq!(expanded.capacity_bytes, 32 << 20);
    let stats = NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: path(&node.target),
        staging_target_path: path(&node.staging),
    };
    let usage = node
        .client
        .node_get_volume_stats(stats)
        .await
        .unwrap()
        .into_inner()
        .usage;
    let bytes = usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .unwrap();
    assert!((24 << 20..=32 << 20).contains(&bytes.total), "{bytes:?}");
    node.unpublish(volume_id).await.unwrap();
    node.unstage(volume_id).await.unwrap();
}

/// Nomad calls NodeStageVolume with its own deadline and, on a timeout,
/// calls again with the same request; ABORTED it takes as final and fails
/// the allocation (DESIGN.md §6). So the same request waits for the one in
/// flight; a different call for the volume is still ABORTED.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn an_identical_call_waits_for_the_first_and_a_different_one_is_aborted() {
    require_root();
    let volume_id = "vol-0123456789abcdef7";
    let mut node = Node::start_nomad(volume_id).await;
    let request = NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: path(&node.staging),
        volume_capability: Some(mount("ext4", Mode::SingleNodeWriter)),
        publish_context: [("devicePath".to_owned(), "/dev/xvdba".to_owned())].into(),
        ..Default::default()
    };
    let client = node.client.clone();
    let stage = |request: NodeStageVolumeRequest| {
        let mut client = client.clone();
        tokio::spawn(async move { client.node_stage_volume(request).await })
    };
    let first = stage(request.clone());
    // The first call is now waiting for a device that does not exist yet.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let retry = stage(request.clone());
    let other_staging = node.staging.with_file_name("ro-file-system-single-node-reader-only");
    let different = NodeStageVolumeRequest {
        staging_target_path: path(&other_staging),
        ..request.clone()
    };
    let aborted = node.client.node_stage_volume(different).await.unwrap_err();
    assert_eq!(aborted.code(), Code::Aborted, "{aborted:?}");
    let unstage = node.unstage(volume_id).await.unwrap_err();
    assert_eq!(unstage.code(), Code::Aborted);
    assert!(!retry.is_finished(), "the retry waits for the first call");
    // Attach: the first call notices the device and stages it; the retry
    // then finds it staged.
    let _volume = node.volume(volume_id, 64);
    first.await.unwrap().unwrap();
    retry.await.unwrap().unwrap();
    assert_eq!(mounts_under(&node.staging).len(), 1, "staged once");
    node.unstage(volume_id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn stage_times_out_with_unavailable_naming_the_volume() {
    require_root();
    let mut node = Node::start("vol-0999999999999999a").await;
    let started = std::time::Instant::now();
    let err = node
        .stage("vol-0999999999999999a", mount("ext4", Mode::SingleNodeWriter))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("vol-0999999999999999a"), "{err:?}");
    assert!(started.elapsed() >= std::time::Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn volume_stats_report_usage_and_condition() {
    require_root();
    let volume_id = "vol-0aaaaaaaaaaaaaab8";
    let mut node = Node::start(volume_id).await;
    let _volume = node.volume(volume_id, 64);
    let cap = mount("ext4", Mode::SingleNodeWriter);
    node.stage(volume_id, cap.clone()).await.unwrap();
    node.publish(volume_id, cap, false).await.unwrap();
    let request = NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: path(&node.target),
        staging_target_path: path(&node.staging),
    };
    let stats = node
        .client
        .node_get_volume_stats(request.clone())
        .await
        .unwrap()
        .into_inner();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .unwrap();
    let inodes = stats
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Inodes as i32)
        .unwrap();
    assert!(
        bytes.total > 50 << 20 && bytes.available > 0 && bytes.used > 0,
        "{bytes:?}"
    );
    assert!(inodes.total > 0 && inodes.used > 0, "{inodes:?}");
    assert!(!stats.volume_condition.unwrap().abnormal);
    // The staging mount disappears (a crashed node, a manual umount).
    rustix::mount::unmount(node.staging.as_path(), rustix::mount::UnmountFlags::empty()).unwrap();
    let stats = node.client.node_get_volume_stats(request).await.unwrap().into_inner();
    let condition = stats.volume_condition.unwrap();
    assert!(
        condition.abnormal && condition.message.contains("staging"),
        "{condition:?}"
    );
    let missing = NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: path(&node.sandbox.target("pod-nope", "pv-nope", volume_id)),
        staging_target_path: String::new(),
    };
    assert_eq!(
        node.client.node_get_volume_stats(missing).await.unwrap_err().code(),
        Code::NotFound
    );
    node.unpublish(volume_id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn invalid_requests_change_nothing() {
    require_root();
    let volume_id = "vol-0aaaaaaaaaaaaaab9";
    let mut node = Node::start(volume_id).await;
    let volume = node.volume(volume_id, 64);
    let good = mount("ext4", Mode::SingleNodeWriter);
    let staging = path(&node.staging);
    let cases: Vec<(NodeStageVolumeRequest, Code)> = vec![
        (
            NodeStageVolumeRequest {
                staging_target_path: staging.clone(),
                volume_capability: Some(good.clone()),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            NodeStageVolumeRequest {
                volume_id: "vol-bad".into(),
                staging_target_path: staging.clone(),
                volume_capability: Some(good.clone()),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            NodeStageVolumeRequest {
                volume_id: volume_id.into(),
                volume_capability: Some(good.clone()),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            NodeStageVolumeRequest {
                volume_id: volume_id.into(),
                staging_target_path: staging.clone(),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            NodeStageVolumeRequest {
                volume_id: volume_id.into(),
                staging_target_path: staging.clone(),
                volume_capability: Some(mount("btrfs", Mode::SingleNodeWriter)),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            NodeStageVolumeRequest {
                volume_id: volume_id.into(),
                staging_target_path: staging.clone(),
                volume_capability: Some(mount("ext4", Mode::MultiNodeMultiWriter)),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            NodeStageVolumeRequest {
                volume_id: volume_id.into(),
                staging_target_path: staging.clone(),
                volume_capability: Some(good.clone()),
                volume_context: HashMap::from([("blockSize".into(), "huge".into())]),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            NodeStageVolumeRequest {
                volume_id: volume_id.into(),
                staging_target_path: staging.clone(),
                volume_capability: Some(good.clone()),
                volume_context: HashMap::from([("blockSize".into(), "3000".into())]),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            NodeStageVolumeRequest {
                volume_id: volume_id.into(),
                staging_target_path: "/etc".into(),
                volume_capability: Some(good.clone()),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
    ];
    let bad_flags = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            mount_flags: vec!["suid".into()],
            ..Default::default()
        })),
        ..good.clone()
    };
    let cases = cases.into_iter().chain([(
        NodeStageVolumeRequest {
            volume_id: volume_id.into(),
            staging_target_path: staging.clone(),
            volume_capability: Some(bad_flags),
            ..Default::default()
        },
        Code::InvalidArgument,
    )]);
    for (request, code) in cases {
        let err = node.client.node_stage_volume(request.clone()).await.unwrap_err();
        assert_eq!(err.code(), code, "{:?}: {err:?}", request.volume_id);
        assert!(!is_mounted(&node.staging));
        assert_eq!(volume.signature(), "", "the device was touched");
    }
    let publish = NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: path(&node.target),
        volume_capability: Some(good.clone()),
        ..Default::default()
    };
    assert_eq!(
        node.client
            .node_publish_volume(publish.clone())
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument,
        "staging path required"
    );
    let not_staged = NodePublishVolumeRequest {
        staging_target_path: staging,
        ..publish
    };
    assert_eq!(
        node.client.node_publish_volume(not_staged).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    assert!(!node.target.exists() || !is_mounted(&node.target));
}

/// A volume id that names no EBS volume names no volume: NOT_FOUND from the
/// RPCs about a volume that must exist here (CSI spec, their "Errors"
/// tables); an empty one is still INVALID_ARGUMENT, and so is a request
/// missing its path, whatever its volume id (csi-sanity v5.3/v5.4,
/// "should fail when no target path is provided" and its kin: a missing
/// required field is judged before the volume).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn volumes_that_cannot_exist_are_not_found() {
    require_root();
    let mut node = Node::start("vol-0aaaaaaaaaaaaaab7").await;
    let (real_staging, real_target) = (path(&node.staging), path(&node.target));
    for (volume_id, staging, target, code) in [
        ("fake-vol-id", real_staging.clone(), real_target.clone(), Code::NotFound),
        ("", real_staging.clone(), real_target.clone(), Code::InvalidArgument),
        ("fake-vol-id", String::new(), String::new(), Code::InvalidArgument),
    ] {
        let codes = [
            node.client
                .node_unstage_volume(NodeUnstageVolumeRequest {
                    volume_id: volume_id.into(),
                    staging_target_path: staging.clone(),
                })
                .await
                .map(drop),
            node.client
                .node_unpublish_volume(NodeUnpublishVolumeRequest {
                    volume_id: volume_id.into(),
                    target_path: target.clone(),
                })
                .await
                .map(drop),
            node.client
                .node_get_volume_stats(NodeGetVolumeStatsRequest {
                    volume_id: volume_id.into(),
                    volume_path: staging.clone(),
                    ..Default::default()
                })
                .await
                .map(drop),
            node.client
                .node_expand_volume(NodeExpandVolumeRequest {
                    volume_id: volume_id.into(),
                    volume_path: staging.clone(),
                    ..Default::default()
                })
                .await
                .map(drop),
        ]
        .map(|result| result.unwrap_err().code());
        assert_eq!(
            codes, [code; 4],
            "volume id {volume_id:?}, paths {staging:?} {target:?}"
        );
    }
    // Every failure is logged at warn with its code and cause.
    let log = node.agent.process.log();
    let line = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains(r#"rpc="NodeUnstageVolume""#) && l.contains("fake-vol-id"))
        .unwrap_or_else(|| panic!("no warn line for the failed NodeUnstageVolume:\n{log}"));
    assert!(line.contains("code=NotFound") && line.contains("latency_ms="), "{line}");
    assert!(!log.contains('\u{1b}'), "terminal colours in a log file");
    // The same as JSON, one object per line.
    let json_dir = node.sandbox.mkdir("json");
    let agent = Agent::spawn_in(
        &json_dir,
        &node._helper.socket,
        // With flags of the Go driver's manifests: accepted, warned about.
        &[
            &Agent::NODE_FLAGS[..],
            &[
                "--logging-format",
                "json",
                "--logtostderr",
                "--csi-mount-point-prefix",
                "/var/lib/kubelet",
                "--v=4",
            ],
        ]
        .concat(),
        &[],
    );
    let mut client = agent.node().await;
    client.node_get_info(NodeGetInfoRequest {}).await.unwrap();
    let unstage = NodeUnstageVolumeRequest {
        volume_id: "fake-vol-id".into(),
        staging_target_path: real_staging,
    };
    assert_eq!(
        client.node_unstage_volume(unstage).await.unwrap_err().code(),
        Code::NotFound
    );
    let log = agent.process.log();
    let line = log
        .lines()
        .find(|l| l.contains(r#""rpc":"NodeUnstageVolume""#))
        .unwrap_or_else(|| panic!("no JSON line for the failed NodeUnstageVolume:\n{log}"));
    assert!(
        line.starts_with('{') && line.ends_with('}') && line.contains(r#""code":"NotFound""#),
        "{line}"
    );
    let object: serde_json::Value = serde_json::from_str(line).unwrap();
    assert!(
        object["fields"]["latency_ms"].is_f64(),
        "the latency is not a number: {line}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains(r#""level":"WARN""#) && l.contains(r#""flag":"--logtostderr=true""#)),
        "no warning for --logtostderr:\n{log}"
    );
    // At -v 4, as the Go driver at V(4): a line for every RPC, and the
    // HTTP/2 stack's own debugging stays out.
    assert!(
        log.lines()
            .any(|l| l.contains(r#""level":"DEBUG""#) && l.contains(r#""rpc":"NodeGetInfo""#)),
        "no line for NodeGetInfo at -v 4:\n{log}"
    );
    let foreign: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(r#""level":"DEBUG""#) && !l.contains(r#""target":"ebs_csi_"#))
        .collect();
    assert!(foreign.is_empty(), "other crates' debug lines: {foreign:#?}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn identity_and_node_info() {
    require_root();
    let node = Node::start("vol-0aaaaaaaaaaaaaab6").await;
    let channel = ebs_csi_tests::channel(&node.agent.socket).await;
    let mut identity = identity_client::IdentityClient::new(channel);
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "ebs.csi.aws.com");
    assert!(!info.vendor_version.is_empty());
    assert_eq!(
        identity.probe(ProbeRequest {}).await.unwrap().into_inner().ready,
        Some(true)
    );
    let services: Vec<i32> = identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| match c.r#type {
            Some(plugin_capability::Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    let like_the_go_driver = [
        plugin_capability::service::Type::ControllerService as i32,
        plugin_capability::service::Type::VolumeAccessibilityConstraints as i32,
    ];
    assert_eq!(services, like_the_go_driver, "the node's plugin capabilities");
    let mut client = node.client.clone();
    let info = client.node_get_info(NodeGetInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.node_id, "i-0123456789abcdef0");
    assert_eq!(info.max_volumes_per_node, 26);
    let segments = info.accessible_topology.unwrap().segments;
    let expected = [
        ("topology.ebs.csi.aws.com/zone", "us-east-1a"),
        ("topology.kubernetes.io/zone", "us-east-1a"),
        ("kubernetes.io/os", "linux"),
    ];
    assert_eq!(
        segments,
        expected.map(|(k, v)| (k.to_owned(), v.to_owned())).into(),
        "the Go driver's segments"
    );
    let caps = client
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps.len(), 4);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn stage_honours_format_options_and_refuses_another_device_at_the_path() {
    require_root();
    let (first, second) = ("vol-0aaaaaaaaaaaaaac0", "vol-0aaaaaaaaaaaaaac1");
    let mut node = Node::start(first).await;
    let volume = node.volume(first, 64);
    let other = node.volume(second, 64);
    let request = NodeStageVolumeRequest {
        volume_id: first.into(),
        staging_target_path: path(&node.staging),
        volume_capability: Some(mount("ext4", Mode::SingleNodeWriter)),
        volume_context: HashMap::from([
            ("blockSize".into(), "1024".into()),
            ("inodeSize".into(), "512".into()),
            ("ext4EncryptionSupport".into(), "true".into()),
        ]),
        ..Default::default()
    };
    node.client.node_stage_volume(request).await.unwrap();
    let superblock = ebs_csi_tests::run("tune2fs", &["-l", &path(&volume.device)]);
    assert!(
        superblock
            .lines()
            .any(|l| l.starts_with("Block size:") && l.ends_with(" 1024")),
        "{superblock}"
    );
    assert!(
        superblock
            .lines()
            .any(|l| l.starts_with("Inode size:") && l.ends_with(" 512")),
        "{superblock}"
    );
    assert!(
        superblock
            .lines()
            .any(|l| l.starts_with("Filesystem features:") && l.split_whitespace().any(|f| f == "encrypt")),
        "{superblock}"
    );
    let err = node
        .stage(second, mount("ext4", Mode::SingleNodeWriter))
        .await
        .unwrap_err();
    // The first volume's staging path, named by its hash (audit 3, A2).
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains(OTHER_VOLUMES_HASH), "{err:?}");
    assert_eq!(other.signature(), "", "the second device was not formatted");
    node.unstage(first).await.unwrap();
}

/// The Go driver's `--legacy-xfs=true`, as its chart passes it: the agent
/// starts, and formats XFS without the features kernels up to 5.4 cannot
/// mount (read back from the superblock mkfs.xfs wrote).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn legacy_xfs_formats_xfs_that_old_kernels_mount() {
    require_root();
    let volume_id = "vol-0aaaaaaaaaaaaaac2";
    let mut node = Node::start_with(volume_id, &["--legacy-xfs=true"], &[]).await;
    let volume = node.volume(volume_id, 320);
    node.stage(volume_id, mount("xfs", Mode::SingleNodeWriter))
        .await
        .unwrap();
    node.unstage(volume_id).await.unwrap();
    let features = ebs_csi_tests::run("xfs_db", &["-r", "-c", "version", &path(&volume.device)]);
    assert!(features.contains("V5,"), "{features}");
    for feature in ["BIGTIME", "INOBTCNT", "REFLINK"] {
        assert!(!features.contains(feature), "{features}");
    }
}

/// `--enable-otel-tracing` on the agent (the Go chart's `node.otelTracing`
/// sets it with `OTEL_SERVICE_NAME` and `OTEL_EXPORTER_OTLP_ENDPOINT`):
/// NodeStageVolume is a server span, the child of the caller's W3C Trace
/// Context (kubelet's, with its tracing on), and the request it makes of
/// the helper a client span beneath it. They reach the collector by the
/// time the agent has stopped (SIGTERM).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn stage_and_its_helper_request_are_spans_at_the_otlp_collector() {
    require_root();
    let collector = OtlpCollector::start().await;
    let volume_id = "vol-0aaaaaaaaaaaaaac3";
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
        ("OTEL_SERVICE_NAME", "ebs-csi-node"),
    ];
    let mut node = Node::start_with(volume_id, &["--enable-otel-tracing"], &env).await;
    let _volume = node.volume(volume_id, 64);
    let mut traced = tonic::Request::new(NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: path(&node.staging),
        volume_capability: Some(mount("ext4", Mode::SingleNodeWriter)),
        ..Default::default()
    });
    traced
        .metadata_mut()
        .insert("traceparent", TRACEPARENT.parse().unwrap());
    node.client.node_stage_volume(traced).await.unwrap();
    node.unstage(volume_id).await.unwrap();
    drop(node.agent);

    let rpc = collector.span("csi.v1.Node/NodeStageVolume");
    assert_eq!(
        (rpc.trace_id.as_str(), rpc.parent_span_id.as_str(), rpc.kind),
        ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", SPAN_KIND_SERVER),
        "the caller's trace: {rpc:#?}"
    );
    assert_eq!(
        (
            rpc.service_name.as_str(),
            rpc.attributes.get("rpc.grpc.status_code").map(String::as_str)
        ),
        ("ebs-csi-node", Some("0")),
        "{rpc:#?}"
    );
    let stage = collector.span("helper.Stage");
    assert_eq!(
        (stage.trace_id.as_str(), stage.parent_span_id.as_str(), stage.kind),
        (rpc.trace_id.as_str(), rpc.span_id.as_str(), SPAN_KIND_CLIENT),
        "beneath the RPC: {stage:#?}"
    );
    assert_eq!(
        stage.attributes.get("rpc.system").map(String::as_str),
        Some("ebs-csi-helper")
    );
    let unstage = collector.span("helper.Unstage");
    assert_ne!(
        unstage.trace_id, rpc.trace_id,
        "NodeUnstageVolume came without Trace Context"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn probe_reports_not_ready_without_the_helper() {
    require_root();
    let node = Node::start("vol-0aaaaaaaaaaaaaab5").await;
    let Node {
        _helper: helper, agent, ..
    } = node;
    drop(helper);
    let channel = ebs_csi_tests::channel(&agent.socket).await;
    let mut identity = identity_client::IdentityClient::new(channel);
    assert_eq!(
        identity.probe(ProbeRequest {}).await.unwrap().into_inner().ready,
        Some(false)
    );
}
