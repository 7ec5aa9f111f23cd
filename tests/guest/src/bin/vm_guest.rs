//! `ebs-csi-vm-guest`: the NVMe scenarios, run inside the test VM of
//! `tests/tests/nvme_vm.rs` (started by the VM's `/init`, as root).
//!
//! The VM boots with three emulated NVMe disks whose serials are EBS-style
//! (`BOOT_VOLUMES`); more are hot-plugged on request. The guest talks to
//! the host over its console: it prints `@@PLUG <id> <serial> [data|ext4-half|ext4-eio|mbr-overlap]` and
//! `@@UNPLUG <id>` for the host to act on through QMP, and one
//! `@@SCENARIO <n> ok: …` line per scenario. Any failure panics, which
//! `/init` reports as a non-zero `@@EXIT`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test driver: a failed step fails the suite"
)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ebs_csi_helper_client::{ClientError, HelperClient};
use ebs_csi_helper_proto::{
    ExpandRequest, FsType, HelperError, PerformanceStatisticsRequest, PublishRequest, PublishSource, Request, VolumeId,
};
use ebs_csi_linux::nvme::identify_controller;
use ebs_csi_proto::v1::node_client::NodeClient;
use ebs_csi_proto::v1::{NodeGetInfoRequest, NodeStageVolumeRequest, NodeUnstageVolumeRequest};
use ebs_csi_test_guest::children::descendants_named;
use ebs_csi_test_guest::exec_gate::{ExecGate, MKFS};
use ebs_csi_test_guest::guest::{
    INSTANCE_ID, INSTANCE_TYPE, device_number, find_controller, mount_capability, mount_type, mounted_device, report,
    serial, volume_stats, wait_for_disk,
};
use ebs_csi_test_guest::{AGENT_UID, channel, publish_device, run_as, stage_request};
use tonic::transport::Channel;

/// The disks QEMU starts with (`tests/tests/nvme_vm.rs` passes the same).
const BOOT_VOLUMES: [&str; 3] = [
    "vol-0aaaaaaaaaaaaaaa1",
    "vol-0bbbbbbbbbbbbbbb2",
    "vol-0ccccccccccccccc3",
];
const HELPER_SOCKET: &str = "/run/ebs-csi/helper.sock";
const CSI_SOCKET: &str = "/run/csi/csi.sock";
const KUBELET: &str = "/var/lib/kubelet";
const METRICS_ADDRESS: &str = "127.0.0.1:3302";

#[tokio::main]
async fn main() {
    let mut helper = start_helper(
        HELPER_SOCKET,
        &["--nvme-model", "QEMU NVMe Ctrl", "--nvme-vendor-id", "0x1b36"],
        Stdio::inherit(),
    );
    let mut agent = start_agent();
    let mut node = NodeClient::new(channel(Path::new(CSI_SOCKET)).await);
    identify_and_map(&mut node).await;
    unprivileged_identify(&mut node).await;
    let staged = hot_plug_during_stage(&mut node, helper.id()).await;
    hot_unplug_while_staged(&mut node, &staged).await;
    refuses_other_devices();
    a_disk_replaced_while_its_format_waits();
    an_unreadable_disk_is_never_blank();
    a_disk_whose_partition_is_held_is_in_use();
    node_identity_from_dmi(&mut node).await;
    no_performance_statistics_page();
    a_partition_of_the_volume_is_staged(&mut node).await;
    partitions_that_share_sectors_are_refused();
    for child in [&mut agent, &mut helper] {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// 1. Identify Controller on controller and namespace nodes returns the
///    serial QEMU was given; the agent stages the right disk among several
///    and never takes one whose serial differs.
async fn identify_and_map(node: &mut NodeClient<Channel>) {
    for volume in BOOT_VOLUMES {
        let (controller, namespace) = wait_for_disk(&serial(volume), Duration::from_secs(10)).unwrap();
        for path in [&controller, &namespace] {
            let id = identify_controller(std::fs::File::open(path).unwrap()).unwrap();
            assert_eq!(id.serial, serial(volume), "{}", path.display());
            assert_eq!((id.vendor_id, id.model.as_str()), (0x1b36, "QEMU NVMe Ctrl"));
        }
    }
    let volume = BOOT_VOLUMES[1];
    let (_, namespace) = wait_for_disk(&serial(volume), Duration::ZERO).unwrap();
    let started = Instant::now();
    let staging = stage(node, volume, "ext4").await.unwrap();
    let took = started.elapsed();
    let wrong = "the mount is not the volume's disk";
    assert_eq!(mounted_device(&staging), device_number(&namespace), "{wrong}");
    unstage(node, volume, &staging).await;
    let missing = stage(node, "vol-0eeeeeeeeeeeeeee9", "ext4").await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unavailable, "{missing}");
    let on = namespace.display();
    report(1, &format!("3 disks identified; {volume} staged on {on} in {took:?}"));
}

/// 2. The agent runs as uid 65534, to whom this kernel refuses Identify;
///    it finds the volume through sysfs, and the helper's own Identify as
///    root passes.
async fn unprivileged_identify(node: &mut NodeClient<Channel>) {
    let volume = BOOT_VOLUMES[0];
    let (controller, _) = wait_for_disk(&serial(volume), Duration::ZERO).unwrap();
    rustix::fs::chmod(&controller, rustix::fs::Mode::from_raw_mode(0o644)).unwrap();
    let refused = run_as(AGENT_UID, move || {
        identify_controller(std::fs::File::open(controller).unwrap())
    });
    let error = refused.expect_err("this kernel allows Identify without CAP_SYS_ADMIN");
    let started = Instant::now();
    let staging = stage(node, volume, "xfs").await.unwrap();
    let took = started.elapsed();
    unstage(node, volume, &staging).await;
    report(
        2,
        &format!("Identify as uid {AGENT_UID}: {error}; staged through sysfs in {took:?}"),
    );
}

/// 3. NodeStage starts before the disk exists; the disk is hot-plugged and
///    staged (ext4, then xfs). The delay measured is from the namespace
///    appearing to the helper (`helper_pid`) starting `mkfs`: the agent
///    noticing the disk, asking the helper, and the helper's checks and
///    probe. Returns the staged volumes and their paths.
async fn hot_plug_during_stage(node: &mut NodeClient<Channel>, helper_pid: u32) -> Vec<(String, PathBuf)> {
    let mut staged = Vec::new();
    for (id, volume, fs) in [
        ("hp1", "vol-0ddddddddddddddd4", "ext4"),
        ("hp2", "vol-0fffffffffffffff6", "xfs"),
    ] {
        let mut client = node.clone();
        let stage_call = tokio::spawn(async move { stage(&mut client, volume, fs).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !stage_call.is_finished(),
            "NodeStage of {volume} returned before its disk existed"
        );
        let plugged = Instant::now();
        println!("@@PLUG {id} {}", serial(volume));
        let watch = tokio::task::spawn_blocking(move || watch_appearance(volume, helper_pid));
        let staging = stage_call.await.unwrap().unwrap();
        let (controller_at, namespace_at, window, mkfs_at) = watch.await.unwrap();
        let done = plugged.elapsed();
        assert_eq!(mount_type(&staging), fs);
        let noticed = mkfs_at.saturating_sub(namespace_at);
        report(
            3,
            &format!(
                "{volume} ({fs}): controller after {controller_at:?}, namespace after {namespace_at:?} \
                 (controller without namespace seen: {window}), staged after {done:?}; \
                 mkfs started {noticed:?} after the namespace appeared"
            ),
        );
        staged.push((volume.to_owned(), staging));
    }
    staged
}

/// 4. A staged disk is hot-unplugged: NodeGetVolumeStats reports an
///    abnormal condition, and NodeUnstage still succeeds and leaves no mount.
async fn hot_unplug_while_staged(node: &mut NodeClient<Channel>, staged: &[(String, PathBuf)]) {
    let (volume, staging) = &staged[0];
    println!("@@UNPLUG hp1");
    let deadline = Instant::now() + Duration::from_secs(10);
    while find_controller(&serial(volume)).is_some() {
        assert!(Instant::now() < deadline, "{volume} was not unplugged");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = volume_stats(node, volume, staging).await;
    let condition = stats.volume_condition.unwrap();
    assert!(condition.abnormal, "{condition:?}");
    unstage(node, volume, staging).await;
    report(4, &format!("{volume} unplugged: \"{}\"; unstaged", condition.message));
    for (volume, staging) in &staged[1..] {
        unstage(node, volume, staging).await;
    }
}

/// 5. The helper refuses a hot-plugged disk whose serial is not the
///    requested volume's, and devices that are not NVMe namespaces; a helper
///    with the default (EBS) identity refuses QEMU's disks even when the
///    serial matches.
fn refuses_other_devices() {
    let other = "vol-0999999999999999a";
    println!("@@PLUG hp3 {}", serial(other));
    let (controller, namespace) = wait_for_disk(&serial(other), Duration::from_secs(10)).unwrap();
    let devices = [
        namespace,
        controller,
        PathBuf::from("/dev/mem"),
        PathBuf::from("/dev/console"),
    ];
    for device in &devices {
        assert_device_refused(HELPER_SOCKET, BOOT_VOLUMES[2], device);
    }
    let ebs_only_socket = "/run/ebs-csi/ebs-only.sock";
    let mut ebs_only = start_helper(ebs_only_socket, &[], Stdio::inherit());
    let (_, own_disk) = wait_for_disk(&serial(other), Duration::ZERO).unwrap();
    assert_device_refused(ebs_only_socket, other, &own_disk);
    let _ = ebs_only.kill();
    let _ = ebs_only.wait();
    report(
        5,
        "a disk of another volume, its controller, /dev/mem and /dev/console refused; \
         QEMU's disk refused by a helper expecting EBS's identity",
    );
}

/// 6. One formatter, busy with a stopped `mkfs`; a Stage of volume X waits
///    for it. Meanwhile X's disk is hot-unplugged and the disk of volume Y,
///    holding data, hot-plugged. When X's format gets its turn the helper
///    verifies the device again and refuses it; Y is untouched. The report
///    says whether the kernel gave Y X's name (it cannot while the helper
///    holds X's namespace open).
fn a_disk_replaced_while_its_format_waits() {
    let socket = "/run/ebs-csi/one-formatter.sock";
    let qemu = ["--nvme-model", "QEMU NVMe Ctrl", "--nvme-vendor-id", "0x1b36"];
    // Its log says when a Stage's format waits for the formatter.
    let log = "/run/ebs-csi/one-formatter.log";
    let stderr = Stdio::from(std::fs::File::create(log).unwrap());
    let mut helper = start_helper(socket, &[&qemu[..], &["--max-parallel-formats", "1"]].concat(), stderr);
    let (blocker, x, y) = (
        "vol-04444444444444444",
        "vol-05555555555555555",
        "vol-06666666666666666",
    );
    println!("@@PLUG hp4 {}", serial(blocker));
    println!("@@PLUG hp5 {}", serial(x));
    let (_, blocker_device) = wait_for_disk(&serial(blocker), Duration::from_secs(10)).unwrap();
    let (_, x_device) = wait_for_disk(&serial(x), Duration::from_secs(10)).unwrap();
    let call = |request| {
        let socket = PathBuf::from(socket);
        std::thread::spawn(move || {
            run_as(AGENT_UID, || {
                HelperClient::new(socket, Duration::from_secs(120)).call(request)
            })
        })
    };
    let gate = ExecGate::watch(helper.id(), &MKFS);
    let first = call(stage_request(
        blocker,
        &blocker_device,
        &make_staging(blocker),
        FsType::Ext4,
        &[],
    ));
    let mkfs = gate.caught(Duration::from_secs(20));
    let mkfs = rustix::process::Pid::from_raw(i32::try_from(mkfs).unwrap()).unwrap();
    let queued = call(stage_request(x, &x_device, &make_staging(x), FsType::Ext4, &[]));
    let probe = Request::Expand(ExpandRequest {
        volume_id: VolumeId::parse(x).unwrap(),
        device: x_device.display().to_string(),
        volume_path: make_staging(x).display().to_string(),
    });
    // X's probe runs with its device claimed, and its format, after it,
    // waits for the formatter: X is refused to others (InProgress) from
    // the start, and its format is queued once the helper logs it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let format = format!("format volume_id={x}");
    while !std::fs::read_to_string(log).unwrap_or_default().contains(&format) {
        assert!(
            Instant::now() < deadline,
            "the format of {x} never queued: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        matches!(
            call(probe).join().unwrap(),
            Err(ClientError::Helper(HelperError::InProgress { .. }))
        ),
        "{x} is not claimed while its format waits"
    );
    println!("@@UNPLUG hp5");
    while find_controller(&serial(x)).is_some() {
        assert!(Instant::now() < deadline, "{x} was not unplugged");
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("@@PLUG hp6 {} data", serial(y));
    let (_, y_device) = wait_for_disk(&serial(y), Duration::from_secs(10)).unwrap();
    let y_before = first_mib(&y_device);
    rustix::process::kill_process(mkfs, rustix::process::Signal::CONT).unwrap();
    let refused = queued.join().unwrap();
    assert_eq!(first.join().unwrap().unwrap(), ebs_csi_helper_proto::Reply::Done);
    let expected = HelperError::DeviceRefused {
        device: x_device.display().to_string(),
        volume_id: x.to_owned(),
        reason: ebs_csi_helper::device::Refusal::Changed.to_string(),
    };
    assert!(
        matches!(&refused, Err(ClientError::Helper(e)) if *e == expected),
        "{refused:?}"
    );
    assert!(first_mib(&y_device) == y_before, "{y} was written to");
    assert_eq!(mounted_device(&make_staging(x)), None);
    let _ = helper.kill();
    let _ = helper.wait();
    let reused = if y_device == x_device { "reused" } else { "not reused" };
    report(
        6,
        &format!(
            "{x} unplugged while its format waited, {y} (data) plugged as {} ({} {reused}): the format refused, {y} untouched",
            y_device.display(),
            x_device.display()
        ),
    );
}

/// 7. A disk holding ext4 whose reads of its first sectors fail (EIO,
///    injected by QEMU): blkid cannot see the filesystem, so it must not
///    count as blank. The Stage is refused, nothing is mounted, and the
///    host checks afterwards that the filesystem is still the same.
fn an_unreadable_disk_is_never_blank() {
    let volume = "vol-07777777777777777";
    println!("@@PLUG hp7 {} ext4-eio", serial(volume));
    let (_, device) = wait_for_disk(&serial(volume), Duration::from_secs(10)).unwrap();
    let staging = make_staging(volume);
    let request = stage_request(volume, &device, &staging, FsType::Ext4, &[]);
    let answer = run_as(AGENT_UID, || {
        HelperClient::new(PathBuf::from(HELPER_SOCKET), Duration::from_secs(120)).call(request)
    });
    // blkid would answer "nothing found" for what it cannot read; the
    // helper's own read of where libblkid looks, before any blkid, refuses.
    let expected = HelperError::System {
        operation: format!("proving volume {volume} blank"),
        detail: format!("{}: reading byte 0: Input/output error (os error 5)", device.display()),
    };
    assert!(
        matches!(&answer, Err(ClientError::Helper(e)) if *e == expected),
        "{answer:?}"
    );
    assert_eq!(mounted_device(&staging), None);
    report(7, &format!("{volume} with sector 0 unreadable: {expected}"));
}

/// 8. A partition of a volume's disk held by device-mapper (as LVM or
///    dm-crypt hold theirs): the disk is in use by the host, so it is
///    neither published raw nor staged.
fn a_disk_whose_partition_is_held_is_in_use() {
    let volume = "vol-08888888888888888";
    println!("@@PLUG hp8 {}", serial(volume));
    let (_, device) = wait_for_disk(&serial(volume), Duration::from_secs(10)).unwrap();
    let mut sfdisk = Command::new("/usr/sbin/sfdisk")
        .arg("-q")
        .arg(&device)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut sfdisk.stdin.take().unwrap(), b"label: gpt\n,\n").unwrap();
    assert!(sfdisk.wait().unwrap().success());
    let name = device.file_name().unwrap().to_string_lossy().into_owned();
    let sectors_file = format!("/sys/class/block/{name}p1/size");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !Path::new(&sectors_file).exists() {
        assert!(Instant::now() < deadline, "{name}p1 never appeared");
        std::thread::sleep(Duration::from_millis(10));
    }
    let sectors = std::fs::read_to_string(&sectors_file).unwrap();
    let table = format!("0 {} linear /dev/{name}p1 0", sectors.trim());
    let created = Command::new("/usr/sbin/dmsetup")
        .args(["--noudevsync", "create", "held", "--table", &table])
        .status()
        .unwrap();
    assert!(created.success(), "dmsetup create");
    let held = HelperError::DeviceRefused {
        device: device.display().to_string(),
        volume_id: volume.to_owned(),
        reason: ebs_csi_helper::device::Refusal::Held.to_string(),
    };
    let target = ebs_csi_test_guest::kubelet_block_target(Path::new(KUBELET), "held", "pv-held", volume);
    let publish = Request::Publish(PublishRequest {
        target_path: target.display().to_string(),
        readonly: false,
        source: PublishSource::Device {
            volume_id: VolumeId::parse(volume).unwrap(),
            device: device.display().to_string(),
        },
    });
    let stage = stage_request(volume, &device, &make_staging(volume), FsType::Ext4, &[]);
    for request in [publish, stage] {
        let answer = run_as(AGENT_UID, || {
            HelperClient::new(PathBuf::from(HELPER_SOCKET), Duration::from_secs(30)).call(request)
        });
        assert!(
            matches!(&answer, Err(ClientError::Helper(e)) if *e == held),
            "{answer:?}"
        );
    }
    assert!(!target.exists());
    assert_eq!(mounted_device(&make_staging(volume)), None);
    let removed = Command::new("/usr/sbin/dmsetup")
        .args(["--noudevsync", "remove", "held"])
        .status()
        .unwrap();
    assert!(removed.success(), "dmsetup remove");
    report(8, &format!("{volume}: its partition held by device-mapper: {held}"));
}

/// 9. The agent (uid 65534, `--metadata-sources dmi`) took the node's id
///    and type from the kernel's SMBIOS attributes, which QEMU fills as
///    EC2 fills a Nitro instance's.
async fn node_identity_from_dmi(node: &mut NodeClient<Channel>) {
    let info = node.node_get_info(NodeGetInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.node_id, INSTANCE_ID);
    // m5.large: 27 shared attachments, one interface, the root reserved.
    assert_eq!(info.max_volumes_per_node, 26);
    let segments = info.accessible_topology.unwrap().segments;
    assert_eq!(
        segments.get("topology.kubernetes.io/zone").map(String::as_str),
        Some("us-east-1a")
    );
    report(9, &format!("node {} ({INSTANCE_TYPE}) from DMI", info.node_id));
}

/// 10. QEMU's controller has no EBS statistics log page (0xD0): the
///     helper's read-only request says so exactly, and the agent's
///     `/metrics` (fetched with busybox wget) has no per-volume series and
///     counts no error.
fn no_performance_statistics_page() {
    let volume = BOOT_VOLUMES[2];
    let (_, namespace) = wait_for_disk(&serial(volume), Duration::ZERO).unwrap();
    let device = namespace.display().to_string();
    let request = Request::PerformanceStatistics(PerformanceStatisticsRequest {
        volume_id: VolumeId::parse(volume).unwrap(),
        device: device.clone(),
    });
    let reply = run_as(AGENT_UID, || {
        HelperClient::new(PathBuf::from(HELPER_SOCKET), Duration::from_secs(10)).call(request)
    });
    match reply {
        Err(ClientError::Helper(HelperError::StatisticsUnavailable {
            device: d,
            status: 0x4002,
        })) if d == device => {}
        other => panic!("PerformanceStatistics on {device}: {other:?}"),
    }
    let output = Command::new("wget")
        .args(["-q", "-O", "-", &format!("http://{METRICS_ADDRESS}/metrics")])
        .output()
        .unwrap();
    let metrics = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "wget: {output:?}");
    let instance = format!("{{instance_id=\"{INSTANCE_ID}\"}}");
    for line in [
        format!("aws_ebs_csi_nvme_collector_scrapes_total{instance} 1"),
        format!("aws_ebs_csi_nvme_collector_errors_total{instance} 0"),
    ] {
        assert!(metrics.lines().any(|l| l == line), "no {line:?} in\n{metrics}");
    }
    assert!(!metrics.contains("aws_ebs_csi_read_ops_total"), "{metrics}");
    report(
        10,
        &format!("{device}: no log page 0xD0 (NVMe status 0x4002); /metrics without volume series"),
    );
}

/// 11. The Go driver's `partition` volume attribute: the agent stages
///     partition 1 of scenario 8's disk (its device-mapper hold gone), and
///     the helper proves it by Identify Controller read through the
///     partition's own descriptor, which reaches its disk's controller.
async fn a_partition_of_the_volume_is_staged(node: &mut NodeClient<Channel>) {
    let volume = "vol-08888888888888888";
    let (_, disk) = wait_for_disk(&serial(volume), Duration::ZERO).unwrap();
    let partition = PathBuf::from(format!("{}p1", disk.display()));
    let staging = make_staging(volume);
    node.node_stage_volume(NodeStageVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: mount_capability("ext4"),
        volume_context: [("partition".to_owned(), "1".to_owned())].into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(mounted_device(&staging), device_number(&partition));
    unstage(node, volume, &staging).await;
    report(11, &format!("{volume}: partition 1 staged as {}", partition.display()));
}

/// 12. A disk whose table makes two partitions share sectors (the host
///     wrote the MBR byte by byte; this guest's kernel parses it at the
///     hot-plug, where tools and `BLKPG` would refuse it): each partition
///     is refused for a stage and a raw publish before anything is written.
fn partitions_that_share_sectors_are_refused() {
    let volume = "vol-01212121212121212";
    println!("@@PLUG hp12 {} mbr-overlap", serial(volume));
    let (_, disk) = wait_for_disk(&serial(volume), Duration::from_secs(10)).unwrap();
    let target = ebs_csi_test_guest::kubelet_block_target(Path::new(KUBELET), "overlap", "pv-overlap", volume);
    for n in [1, 2] {
        let partition = PathBuf::from(format!("{}p{n}", disk.display()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !partition.exists() {
            assert!(Instant::now() < deadline, "{} never appeared", partition.display());
            std::thread::sleep(Duration::from_millis(10));
        }
        let overlapping = HelperError::DeviceRefused {
            device: partition.display().to_string(),
            volume_id: volume.to_owned(),
            reason: ebs_csi_helper::device::Refusal::Overlapping.to_string(),
        };
        let stage = stage_request(volume, &partition, &make_staging(volume), FsType::Ext4, &[]);
        for request in [stage, publish_device(volume, &partition, &target)] {
            let answer = run_as(AGENT_UID, || {
                HelperClient::new(PathBuf::from(HELPER_SOCKET), Duration::from_secs(30)).call(request)
            });
            assert!(
                matches!(&answer, Err(ClientError::Helper(e)) if *e == overlapping),
                "{answer:?}"
            );
        }
        assert_eq!(
            first_mib(&partition),
            vec![0u8; 1 << 20],
            "{} was written",
            partition.display()
        );
    }
    assert!(!target.exists());
    assert_eq!(mounted_device(&make_staging(volume)), None);
    report(
        12,
        &format!("{volume}: partitions sharing sectors refused: {}", disk.display()),
    );
}

fn first_mib(device: &Path) -> Vec<u8> {
    use std::io::Read;
    let mut bytes = vec![0u8; 1 << 20];
    std::fs::File::open(device).unwrap().read_exact(&mut bytes).unwrap();
    bytes
}

/// Asks the helper at `socket` (as the agent's uid) to stage `device` as
/// `volume_id`; it must answer DeviceRefused and mount nothing.
fn assert_device_refused(socket: &str, volume_id: &str, device: &Path) {
    let staging = make_staging(volume_id);
    let request = stage_request(volume_id, device, &staging, FsType::Ext4, &[]);
    let socket = PathBuf::from(socket);
    let answer = run_as(AGENT_UID, || {
        HelperClient::new(socket, Duration::from_secs(30)).call(request)
    });
    assert!(
        matches!(answer, Err(ClientError::Helper(HelperError::DeviceRefused { .. }))),
        "{}: {answer:?}",
        device.display()
    );
    assert_eq!(mounted_device(&staging), None);
}

/// Starts a helper on `socket` for the agent's uid, with `identity`
/// flags (`--nvme-model`, `--nvme-vendor-id`; none: EBS's), its log to
/// `stderr`.
fn start_helper(socket: &str, identity: &[&str], stderr: Stdio) -> Child {
    std::fs::create_dir_all("/run/ebs-csi").unwrap();
    std::fs::create_dir_all(KUBELET).unwrap();
    let uid = AGENT_UID.to_string();
    let child = Command::new("/usr/bin/ebs-csi-helper")
        .args([
            "--socket",
            socket,
            "--socket-group",
            &uid,
            "--allowed-uid",
            &uid,
            "--allowed-root",
            KUBELET,
        ])
        .args(identity)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    wait_for_socket(Path::new(socket), child.id());
    child
}

fn start_agent() -> Child {
    std::fs::create_dir_all("/run/csi").unwrap();
    let id = rustix::process::Uid::from_raw(AGENT_UID);
    rustix::fs::chown("/run/csi", Some(id), None).unwrap();
    let child = Command::new("/usr/bin/ebs-csi-agent")
        .args([
            "--endpoint",
            &format!("unix://{CSI_SOCKET}"),
            "--helper-socket",
            HELPER_SOCKET,
        ])
        .args(["--metadata-sources", "dmi", "--availability-zone", "us-east-1a"])
        .args(["--device-wait-seconds", "5", "--http-endpoint", METRICS_ADDRESS])
        .stdout(Stdio::null())
        .uid(AGENT_UID)
        .gid(AGENT_UID)
        .spawn()
        .unwrap();
    wait_for_socket(Path::new(CSI_SOCKET), child.id());
    child
}

/// Waits until `server` listens on the socket at `path` (not merely that
/// the file exists: see [`ebs_csi_test_guest::is_ready`]).
fn wait_for_socket(path: &Path, server: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ebs_csi_test_guest::is_ready(path, server) {
        assert!(Instant::now() < deadline, "{} never listened", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// kubelet's staging path of `volume_id`, made as kubelet makes it.
fn make_staging(volume_id: &str) -> PathBuf {
    ebs_csi_test_guest::kubelet_staging(Path::new(KUBELET), volume_id)
}

async fn stage(node: &mut NodeClient<Channel>, volume_id: &str, fs: &str) -> Result<PathBuf, tonic::Status> {
    let staging = make_staging(volume_id);
    node.node_stage_volume(NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: mount_capability(fs),
        ..Default::default()
    })
    .await?;
    Ok(staging)
}

async fn unstage(node: &mut NodeClient<Channel>, volume_id: &str, staging: &Path) {
    node.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    assert_eq!(mounted_device(staging), None, "{} is still mounted", staging.display());
}

/// Polls every millisecond for the hot-plugged disk of `volume_id`: when
/// its controller and its namespace appeared, whether the controller was
/// seen without a namespace (the window the agent must wait through), and
/// when `helper` started `mkfs` for it.
fn watch_appearance(volume_id: &str, helper: u32) -> (Duration, Duration, bool, Duration) {
    let start = Instant::now();
    let (mut controller_at, mut namespace_at, mut window) = (None, None, false);
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{volume_id} was never formatted"
        );
        if let Some(sys) = find_controller(&serial(volume_id)) {
            let at = *controller_at.get_or_insert(start.elapsed());
            let name = sys.file_name().unwrap().to_str().unwrap().to_owned();
            if Path::new(&format!("/dev/{name}n1")).exists() {
                namespace_at.get_or_insert(start.elapsed());
            } else {
                window = true;
            }
            if let Some(namespace_at) = namespace_at
                && !descendants_named(helper, "mkfs").is_empty()
            {
                return (at, namespace_at, window, start.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
