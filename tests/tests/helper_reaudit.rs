//! The confirmed findings of the helper's second audit
//! (`shared/reviews/helper-reaudit.md`), each built like the audit's
//! experiment, against the real helper over loop devices: the exact answer,
//! and nothing changed afterwards. (N6 is in `helper_mount_options.rs`.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use ebs_csi_helper::error::{NOT_EMPTY, NOT_ITS_SHAPE};
use ebs_csi_helper::mounts::MountTablesError;
use ebs_csi_helper_client::ClientError;
use ebs_csi_helper_proto::{FsType, HelperError, PROTOCOL_VERSION, Reply, Request};
use ebs_csi_tests::unreadable::UnreadableVolume;
use ebs_csi_tests::{
    Helper, LoopVolume, Sandbox, is_mounted, publish_device, publish_staged, require_root, spawn, stage_request,
};

/// What a read of `device` at `offset` answers: `None` when 4 KiB read.
fn read_error(device: &Path, offset: u64) -> Option<std::io::Error> {
    let file = std::fs::File::open(device).unwrap();
    file.read_exact_at(&mut [0u8; 4096], offset).err()
}

/// The offset of the first byte of `device` that is not zero, in its
/// first MiB.
fn first_non_zero(device: &Path) -> u64 {
    let mut head = vec![0u8; 1 << 20];
    std::fs::File::open(device)
        .unwrap()
        .read_exact_at(&mut head, 0)
        .unwrap();
    head.iter().position(|b| *b != 0).expect("a non-zero byte") as u64
}

/// Builds E1's volume (`filesystem`: ext4 with data, else blank), checks
/// the audit's preconditions (both ends read, the window does not, blkid
/// finds nothing) and sends a Stage for ext4 as the agent. Returns the
/// answer, the read error of the window, and the volume's ends before.
fn stage_unreadable(
    sandbox: &Sandbox,
    helper: &Helper,
    volume_id: &str,
    filesystem: bool,
) -> (UnreadableVolume, Result<Reply, ClientError>, String, Vec<u8>) {
    let unreadable = UnreadableVolume::create(sandbox.path(), volume_id, 16, 6, filesystem);
    let device = unreadable.volume.device.clone();
    let window = unreadable.window();
    assert_eq!(window, 1804 << 10..2060 << 10);
    let size = unreadable.volume.size_bytes();
    assert!(read_error(&device, 0).is_none() && read_error(&device, size - 4096).is_none());
    let failure = read_error(&device, window.start)
        .expect("the window must not read")
        .to_string();
    assert_eq!(unreadable.volume.signature(), "", "blkid must find nothing");
    let ends = unreadable.volume.ends();
    let staging = sandbox.staging(volume_id);
    let answer = helper.call(stage_request(volume_id, &device, &staging, FsType::Ext4, &[]));
    assert!(!is_mounted(&staging));
    assert!(unreadable.volume.ends() == ends, "the volume's ends changed");
    (unreadable, answer, failure, ends)
}

/// N1 (E1): an ext4 volume holding data whose reads fail between 1.76 and
/// 2.01 MiB, where libblkid's LUKS prober reads before the ext4 prober
/// runs, while its first and last MiB read fine. blkid answers "nothing
/// found" (exit 2, nothing printed), which the helper took for blank, and
/// reformatted the volume. Now the helper's own read finds the filesystem's
/// bytes that blkid never looked at: `FilesystemMismatch` naming the first,
/// and the filesystem, its data and the mount table are unchanged.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_volume_whose_reads_fail_past_its_first_mib_is_never_formatted() {
    require_root();
    const VOLUME: &str = "vol-0e1e1e1e1e1e1e1e1";
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let (unreadable, answer, _, _) = stage_unreadable(&sandbox, &helper, VOLUME, true);
    let device = &unreadable.volume.device;
    let expected = HelperError::FilesystemMismatch {
        device: device.display().to_string(),
        found: format!(
            "data no prober recognises (byte {} is not zero)",
            first_non_zero(device)
        ),
        requested: "ext4".into(),
    };
    assert!(
        matches!(&answer, Err(ClientError::Helper(e)) if *e == expected),
        "{answer:?}"
    );
    assert_eq!(unreadable.marker(), UnreadableVolume::MARKER, "the data is gone");
    assert_eq!(unreadable.uuid(), UnreadableVolume::UUID, "the volume was reformatted");
    let log = helper.process.log();
    assert!(!log.contains("mkfs"), "mkfs ran:\n{log}");
}

/// N1, a read error alone: the same window failing on a volume that is
/// zero everywhere it can be read. blkid finds nothing; the helper's own
/// read of where libblkid looks fails in the window, and the Stage is
/// refused naming the volume, the device and the offset.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_blank_volume_whose_reads_fail_where_probers_look_is_never_formatted() {
    require_root();
    const VOLUME: &str = "vol-0e1e1e1e1e1e1e1e4";
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let (unreadable, answer, failure, _) = stage_unreadable(&sandbox, &helper, VOLUME, false);
    let device = &unreadable.volume.device;
    let Err(ClientError::Helper(HelperError::System { operation, detail })) = &answer else {
        panic!("expected the blank proof to fail, got {answer:?}");
    };
    assert_eq!(operation, &format!("proving volume {VOLUME} blank"));
    // The first read that fails is the 4 KiB page at the window's start,
    // or one before it in the same read-ahead.
    let prefix = format!("{}: reading byte ", device.display());
    let offset: u64 = detail
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(&format!(": {failure}")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{detail:?} is not {prefix}<offset>: {failure}"));
    assert!(
        (1 << 20..unreadable.window().end).contains(&offset) && offset.is_multiple_of(4096),
        "{offset} is not a page of the failing read"
    );
    assert_eq!(unreadable.volume.signature(), "");
    let log = helper.process.log();
    assert!(!log.contains("mkfs"), "mkfs ran:\n{log}");
}

/// N1, the second half of the fix: bytes where libblkid looks that no
/// prober recognises (data a raw block volume's pod wrote at 3 MiB, say)
/// are data, never formatted: `FilesystemMismatch` naming the first byte
/// that is not zero. Zeros there (a new EBS volume) format as before.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn data_no_prober_recognises_is_never_formatted() {
    require_root();
    const VOLUME: &str = "vol-0e1e1e1e1e1e1e1e2";
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 64);
    let data = ebs_csi_tests::data_pattern(4096);
    volume.write_at(&data, 3 << 20);
    assert_eq!(volume.signature(), "", "blkid must find nothing");
    let first = (3 << 20) + data.iter().position(|b| *b != 0).unwrap() as u64;
    let staging = sandbox.staging(VOLUME);
    let answer = helper.call(stage_request(VOLUME, &volume.device, &staging, FsType::Xfs, &[]));
    let expected = HelperError::FilesystemMismatch {
        device: volume.device.display().to_string(),
        found: format!("data no prober recognises (byte {first} is not zero)"),
        requested: "xfs".into(),
    };
    assert!(
        matches!(&answer, Err(ClientError::Helper(e)) if *e == expected),
        "{answer:?}"
    );
    assert!(!is_mounted(&staging));
    let mut read = vec![0u8; data.len()];
    std::fs::File::open(&volume.device)
        .and_then(|f| f.read_exact_at(&mut read, 3 << 20))
        .unwrap();
    assert!(read == data, "the data changed");
    assert_eq!(volume.signature(), "");

    let blank = LoopVolume::create(sandbox.path(), "vol-0e1e1e1e1e1e1e1e3", 300);
    let staging = sandbox.staging(&blank.volume_id);
    let request = stage_request(&blank.volume_id, &blank.device, &staging, FsType::Xfs, &[]);
    assert_eq!(helper.call(request).unwrap(), Reply::Done);
    assert_eq!(blank.signature(), "TYPE=xfs");
}

/// F9 residual (E4): a helper in a PID namespace of its own (a pod without
/// `hostPID`) reads its own container's table as PID 1's, so a disk
/// mounted only on the host looked unused. It now refuses to start, saying
/// why, before it makes its socket.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_helper_in_a_pid_namespace_of_its_own_refuses_to_start() {
    require_root();
    let sandbox = Sandbox::new();
    let socket = sandbox.path().join("helper/helper.sock");
    let output = Helper::in_own_pid_namespace(sandbox.path(), &socket, &[])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let (namespace, log) = stderr.split_once('\n').unwrap();
    assert_ne!(namespace, ebs_csi_helper::mounts::INITIAL_PID_NAMESPACE);
    let expected = format!(
        "Error: opening the node's mount table\n\nCaused by:\n    {}\n",
        MountTablesError::OwnPidNamespace(namespace.to_owned())
    );
    assert!(log.ends_with(&expected), "{stderr}");
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!socket.exists());
}

/// N10: a peer whose process the helper cannot see (the agent's container
/// beside a helper in a PID namespace of its own) is reported by
/// `SO_PEERCRED` with pid 0; the helper read that into a non-zero type and
/// refused every such peer. Now it admits the agent's uid and refuses any
/// other, whatever the pid (here with `--nested-pid-namespace`, a node that
/// is itself a container).
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_peer_in_a_pid_namespace_the_helper_cannot_see_is_judged_by_its_uid() {
    require_root();
    let sandbox = Sandbox::new();
    let socket = sandbox.path().join("helper/helper.sock");
    let command = Helper::in_own_pid_namespace(sandbox.path(), &socket, &["--nested-pid-namespace"]);
    let helper = Helper {
        process: spawn("helper", command, sandbox.path().join("helper.log"), &socket),
        socket,
    };
    assert_eq!(
        helper.call(Request::Ping).unwrap(),
        Reply::Pong {
            version: PROTOCOL_VERSION
        }
    );
    // Root can connect to the socket (mode 0660), but is not allowed.
    let other = helper.call_as(0, Request::Ping);
    assert!(matches!(other, Err(ClientError::Frame(_))), "{other:?}");
    let log = helper.process.log();
    assert!(
        log.contains("--nested-pid-namespace: PID 1 is taken to be the node's init"),
        "{log}"
    );
    assert!(log.contains("refused peer peer_uid=0 peer_pid=0"), "{log}");
}

/// N5 (E8, E8b): a Stage or Publish onto another pod's configMap
/// directory, its `etc-hosts` file, or kubelet's `pods/` itself mounted the
/// agent's filesystem (or device node) over what was there. Only kubelet's
/// shapes of a CSI volume's staging and target paths are accepted now
/// (`NOT_ITS_SHAPE`), and even there a directory with an entry or a file
/// with a byte is never mounted over (`NOT_EMPTY`); each refused path and
/// the mount table stay as they were.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn only_empty_paths_of_kubelets_csi_shapes_are_mounted_over() {
    require_root();
    const X: &str = "vol-0e8e8e8e8e8e8e8e8";
    const Y: &str = "vol-0e8e8e8e8e8e8e8e9";
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let x = LoopVolume::create(sandbox.path(), X, 64);
    let y = LoopVolume::create(sandbox.path(), Y, 64);
    let kubelet = sandbox.kubelet();
    let victim = kubelet.join("pods/victim-uid");
    let config = ebs_csi_tests::make_dir(&victim.join("volumes/kubernetes.io~configmap/cfg"));
    std::fs::write(config.join("app.conf"), "mode=safe\n").unwrap();
    let hosts = victim.join("etc-hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
    let refused = |path: &Path, reason: &str| HelperError::PathRefused {
        path: path.display().to_string(),
        reason: reason.into(),
    };
    let expect = |request: Request, expected: HelperError| {
        let answer = helper.call(request.clone());
        assert!(
            matches!(&answer, Err(ClientError::Helper(e)) if *e == expected),
            "{request:?}: {answer:?}"
        );
    };
    let staging = sandbox.staging(X);
    assert_eq!(
        helper
            .call(stage_request(X, &x.device, &staging, FsType::Ext4, &[]))
            .unwrap(),
        Reply::Done
    );
    let before = ebs_csi_tests::mounts_under(sandbox.path());

    // Not where kubelet puts a CSI volume.
    expect(
        stage_request(Y, &y.device, &config, FsType::Ext4, &[]),
        refused(&config, NOT_ITS_SHAPE),
    );
    for target in [&config, &kubelet.join("pods")] {
        expect(
            publish_staged(X, &x.device, &staging, target),
            refused(target, NOT_ITS_SHAPE),
        );
    }
    expect(publish_device(Y, &y.device, &hosts), refused(&hosts, NOT_ITS_SHAPE));
    // Where kubelet puts one, but holding something.
    let full_staging = sandbox.staging(Y);
    std::fs::write(full_staging.join("left-behind"), "data").unwrap();
    expect(
        stage_request(Y, &y.device, &full_staging, FsType::Ext4, &[]),
        refused(&full_staging, NOT_EMPTY),
    );
    let full_target = ebs_csi_tests::make_dir(&sandbox.target("p-full", "pv", X));
    std::fs::write(full_target.join("app.conf"), "mode=safe\n").unwrap();
    expect(
        publish_staged(X, &x.device, &staging, &full_target),
        refused(&full_target, NOT_EMPTY),
    );
    let full_block = sandbox.block_target("p-full", "pv-block", Y);
    std::fs::write(&full_block, "data").unwrap();
    expect(
        publish_device(Y, &y.device, &full_block),
        refused(&full_block, NOT_EMPTY),
    );

    assert_eq!(ebs_csi_tests::mounts_under(sandbox.path()), before);
    assert_eq!(y.signature(), "", "refused before the probe: nothing formatted");
    assert_eq!(std::fs::read_to_string(config.join("app.conf")).unwrap(), "mode=safe\n");
    assert_eq!(std::fs::read_to_string(&hosts).unwrap(), "127.0.0.1 localhost\n");
    assert_eq!(
        std::fs::read_to_string(full_target.join("app.conf")).unwrap(),
        "mode=safe\n"
    );
    assert_eq!(std::fs::read_to_string(&full_block).unwrap(), "data");

    // Empty ones of those shapes are mounted over as before.
    let target = sandbox.target("p", "pv", X);
    assert_eq!(
        helper.call(publish_staged(X, &x.device, &staging, &target)).unwrap(),
        Reply::Done
    );
    let block = sandbox.block_target("p", "pv-block", Y);
    assert_eq!(helper.call(publish_device(Y, &y.device, &block)).unwrap(), Reply::Done);
}

/// N3, the helper's own process: a tool holding the capabilities of a
/// serving thread and more (`xfs_growfs`: `CAP_SYS_ADMIN` and
/// `CAP_DAC_READ_SEARCH`, as uid 0) passed the ptrace access check on the
/// helper's main thread (same uid, capabilities a superset) and could open
/// its memory. The helper is not dumpable now, so only `CAP_SYS_PTRACE`
/// would pass (ptrace(2), "Ptrace access mode checking").
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_process_with_a_tools_capabilities_cannot_open_the_helpers_memory() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let output = Command::new("setpriv")
        .args([
            "--bounding-set=-all,+sys_admin,+dac_read_search",
            "--inh-caps=-all",
            "--",
        ])
        .args(["dd", "count=0", "status=none"])
        .arg(format!("if=/proc/{}/mem", helper.process.pid()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("Permission denied"),
        "{:?} {stderr}",
        output.status
    );
}

/// N3, grow-at-stage: every Stage of an existing filesystem ran a grower on
/// it, whoever wrote the image. ext filesystems now grow in the kernel (no
/// tool), and `xfs_growfs` runs only when the XFS superblock, read by the
/// helper itself, says the filesystem is smaller than its device.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn no_tool_grows_a_filesystem_that_fills_its_device() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    for (volume_id, fs_type, mkfs) in [
        ("vol-0e3e3e3e3e3e3e3e1", FsType::Xfs, "mkfs.xfs"),
        ("vol-0e3e3e3e3e3e3e3e2", FsType::Ext4, "mkfs.ext4"),
    ] {
        let volume = LoopVolume::create(sandbox.path(), volume_id, 320);
        ebs_csi_tests::run(mkfs, &["-q", &volume.device.to_string_lossy()]);
        let staging = sandbox.staging(volume_id);
        let request = stage_request(volume_id, &volume.device, &staging, fs_type, &[]);
        assert_eq!(helper.call(request).unwrap(), Reply::Done);
        assert!(is_mounted(&staging));
    }
    let log = helper.process.log();
    for tool in ["xfs_growfs", "resize2fs", "mkfs"] {
        assert!(
            !log.contains(&format!("exec tool=/usr/sbin/{tool}")),
            "{tool} ran:\n{log}"
        );
    }
}

/// N3 (E6): a tool runs as uid 0, and a capability-less uid 0 may still
/// write root-owned files and open root-owned disks. A stand-in for a
/// `blkid` taken over by a hostile image (bind-mounted over the real one in
/// a mount namespace of the helper's own; nothing outside changes) tries
/// to open `/etc/passwd` for writing and another disk read-write, and reads
/// its own volume, which holds the image
/// ([`LoopVolume::hold_hostile_image`]): under the tool's Landlock ruleset only the last works.
/// The Stage fails with the stand-in's report, and nothing is formatted.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_tool_opens_nothing_but_the_system_files_and_its_volume() {
    require_root();
    let sandbox = Sandbox::new();
    let volume = LoopVolume::create(sandbox.path(), "vol-0e6e6e6e6e6e6e6e6", 64);
    volume.hold_hostile_image();
    let other = LoopVolume::create(sandbox.path(), "vol-0e6e6e6e6e6e6e6e7", 64);
    let report = |what: &str, open: &str| {
        format!("if ({open}) 2>/dev/null; then r=\"$r {what}:opened\"; else r=\"$r {what}:denied\"; fi\n")
    };
    let script = [
        "#!/bin/sh\nr=\"\"\n".to_owned(),
        report("passwd", ": >> /etc/passwd"),
        report("other-disk", &format!("exec 4<> {}", other.device.display())),
        report("own-volume", "exec 4< /proc/self/fd/3"),
        "echo \"$r\" >&2\nexit 4\n".to_owned(),
    ]
    .concat();
    let helper = Helper::with_blkid(&sandbox, &script);
    let staging = sandbox.staging(&volume.volume_id);
    helper.assert_blkid_failed(
        stage_request(&volume.volume_id, &volume.device, &staging, FsType::Ext4, &[]),
        "exit status: 4: passwd:denied other-disk:denied own-volume:opened",
    );
    assert!(!is_mounted(&staging));
    assert_eq!((volume.signature(), other.signature()), (String::new(), String::new()));
    assert!(helper.process.log().contains("tools confined by Landlock"));
}

/// F7 residual (N7), and the third audit's A7: after a tool exits, the
/// executor read its output to the end, so a process the tool left behind
/// holding the pipe open held the one `tools` executor, and with it every
/// later Stage and Expand; and such a process lived on as root. A stand-in
/// `blkid` (of a volume that holds an image, [`LoopVolume::hold_hostile_image`])
/// leaves such a process (120 s) and exits 4: the process is killed
/// with the tool's process group when the tool exits, and the Stage is
/// answered, twice.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_process_a_tool_leaves_behind_ends_with_it() {
    require_root();
    let sandbox = Sandbox::new();
    let marker = sandbox.path().join("left-behind");
    let script = format!("#!/bin/bash\nexec -a {} sleep 120 >&2 &\nexit 4\n", marker.display());
    let helper = Helper::with_blkid(&sandbox, &script);
    let volume = LoopVolume::create(sandbox.path(), "vol-0e7e7e7e7e7e7e7e7", 64);
    volume.hold_hostile_image();
    let staging = sandbox.staging(&volume.volume_id);
    let stage = stage_request(&volume.volume_id, &volume.device, &staging, FsType::Ext4, &[]);
    let left_behind = || {
        let pgrep = Command::new("pgrep")
            .args(["-f", &marker.to_string_lossy()])
            .output()
            .unwrap();
        !pgrep.stdout.is_empty()
    };
    for _ in 0..2 {
        helper.assert_blkid_failed(stage.clone(), "exit status: 4: ");
        // SIGKILL is sent before the answer; the process ends as the
        // kernel delivers it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while left_behind() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(!left_behind(), "the process the tool left behind still runs");
    }
    assert!(
        !helper.process.log().contains("holds its output open"),
        "{}",
        helper.process.log()
    );
}
