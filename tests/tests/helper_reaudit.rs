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

use ebs_csi_helper::mounts::MountTablesError;
use ebs_csi_helper_proto::{ClientError, FsType, HelperError, PROTOCOL_VERSION, Reply, Request};
use ebs_csi_tests::unreadable::UnreadableVolume;
use ebs_csi_tests::{Helper, LoopVolume, Sandbox, binary, is_mounted, require_root, spawn, stage_request};

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
    let staging = sandbox.mkdir(&format!("kubelet/staging/{volume_id}"));
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
fn a_volume_whose_reads_fail_past_its_first_mib_is_never_formatted() {
    if !require_root() {
        return;
    }
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
fn a_blank_volume_whose_reads_fail_where_probers_look_is_never_formatted() {
    if !require_root() {
        return;
    }
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
fn data_no_prober_recognises_is_never_formatted() {
    if !require_root() {
        return;
    }
    const VOLUME: &str = "vol-0e1e1e1e1e1e1e1e2";
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let volume = LoopVolume::create(sandbox.path(), VOLUME, 64);
    let data = ebs_csi_tests::data_pattern(4096);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&volume.device)
        .and_then(|f| f.write_all_at(&data, 3 << 20).and_then(|()| f.sync_all()))
        .unwrap();
    assert_eq!(volume.signature(), "", "blkid must find nothing");
    let first = (3 << 20) + data.iter().position(|b| *b != 0).unwrap() as u64;
    let staging = sandbox.mkdir("kubelet/staging/data");
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
    let staging = sandbox.mkdir("kubelet/staging/blank");
    let request = stage_request(&blank.volume_id, &blank.device, &staging, FsType::Xfs, &[]);
    assert_eq!(helper.call(request).unwrap(), Reply::Done);
    assert_eq!(blank.signature(), "TYPE=xfs");
}

/// `unshare --pid --fork`, printing the new PID namespace's link before it
/// runs the helper with `args` in it.
fn helper_in_own_pid_namespace(sandbox: &Sandbox, socket: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new("unshare");
    command
        .args([
            "--pid",
            "--fork",
            "sh",
            "-c",
            "readlink /proc/self/ns/pid >&2 && exec \"$0\" \"$@\"",
        ])
        .arg(binary("ebs-csi-helper"))
        .args(Helper::args(sandbox.path(), socket))
        .args(extra);
    command
}

/// F9 residual (E4): a helper in a PID namespace of its own (a pod without
/// `hostPID`) reads its own container's table as PID 1's, so a disk
/// mounted only on the host looked unused. It now refuses to start, saying
/// why, before it makes its socket.
#[test]
fn a_helper_in_a_pid_namespace_of_its_own_refuses_to_start() {
    if !require_root() {
        return;
    }
    let sandbox = Sandbox::new();
    let socket = sandbox.path().join("helper/helper.sock");
    let output = helper_in_own_pid_namespace(&sandbox, &socket, &[]).output().unwrap();
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
fn a_peer_in_a_pid_namespace_the_helper_cannot_see_is_judged_by_its_uid() {
    if !require_root() {
        return;
    }
    let sandbox = Sandbox::new();
    let socket = sandbox.path().join("helper/helper.sock");
    let command = helper_in_own_pid_namespace(&sandbox, &socket, &["--nested-pid-namespace"]);
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
