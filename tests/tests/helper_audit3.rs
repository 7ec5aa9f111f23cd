//! The findings of the helper's third audit (`shared/reviews/helper-audit-3.md`)
//! that only the real binary shows, each built like the audit's experiment,
//! over loop devices: the exact answer, and nothing changed afterwards. (A2,
//! A3 and A10 are the handler's unit tests, `helper/src/handler/tests/binding.rs`;
//! A4 and A5 are with the other devices in use, in `helper_audit.rs`; A7 is
//! `helper_reaudit.rs`'s `a_process_a_tool_leaves_behind_ends_with_it`.)
//! A12 is here, on a disk of the test's own FUSE filesystem.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::ops::Range;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::process::Command;
use std::time::Duration;

use ebs_csi_helper_client::ClientError;
use ebs_csi_helper_proto::{FsType, HelperError, Reply};
use ebs_csi_tests::children::Killed;
use ebs_csi_tests::stall::StalledFile;
use ebs_csi_tests::{Helper, LoopVolume, Sandbox, is_mounted, require_root, stage_request, wait_until};

/// A1 and A8 (E-L, E-S): a `blkid` taken over by a hostile image is root
/// without capabilities, and Landlock alone did not stop it from making a
/// root file set-uid, connecting to a root-only unix socket, stopping or
/// limiting another root process, or reading `/etc/shadow` back to the
/// agent; and it ran with SIGTERM and SIGINT blocked. A stand-in (Python,
/// bind-mounted over the real one in the helper's own mount namespace)
/// tries each during a Stage of a volume that holds an image
/// ([`LoopVolume::hold_hostile_image`]) and reports what happened: every attempt is
/// refused (EACCES from Landlock, EPERM from the tools' seccomp filter), it
/// runs as the tools' uid and gid (991, no other group) with
/// `CAP_DAC_READ_SEARCH` alone, no signal is blocked, and nothing it aimed
/// at changed.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn a_taken_over_tool_changes_nothing_outside_its_volume() {
    require_root();
    let sandbox = Sandbox::new();
    let canary = sandbox.path().join("canary");
    std::fs::write(&canary, b"canary").unwrap();
    std::fs::set_permissions(&canary, std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = std::fs::metadata(&canary).unwrap();
    let socket_path = sandbox.path().join("root.sock");
    let socket = UnixListener::bind(&socket_path).unwrap();
    std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    socket.set_nonblocking(true).unwrap();
    let victim = Killed(Command::new("sleep").arg("120").spawn().unwrap());
    let limits = || std::fs::read_to_string(format!("/proc/{}/limits", victim.0.id())).unwrap();
    let victim_limits = limits();
    let script = format!(
        r#"#!/usr/bin/python3 -I
import errno, os, resource, signal, socket, sys
def attempt(name, action):
    try:
        action()
        return name + ":done"
    except OSError as e:
        return name + ":" + errno.errorcode[e.errno]
tried = [
    attempt("shadow", lambda: open("/etc/shadow", "rb").read()),
    attempt("chmod", lambda: os.chmod("{canary}", 0o4777)),
    attempt("utime", lambda: os.utime("{canary}", (0, 0))),
    attempt("setxattr", lambda: os.setxattr("{canary}", "user.audit3", b"x")),
    attempt("unix-socket", lambda: socket.socket(socket.AF_UNIX).connect("{socket}")),
    attempt("tcp", lambda: socket.create_connection(("127.0.0.1", 9))),
    attempt("stop", lambda: os.kill({victim}, signal.SIGSTOP)),
    attempt("prlimit", lambda: resource.prlimit({victim}, resource.RLIMIT_NOFILE, (4, 4))),
    attempt("signal-helper", lambda: os.kill(os.getppid(), 0)),
]
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
ids = "ids:%d:%d:%s" % (os.getuid(), os.getgid(), ",".join(map(str, os.getgroups())) or "-")
print(" ".join(tried), ids, "caps:" + status["CapEff"].strip(), "blocked:" + status["SigBlk"].strip(), file=sys.stderr)
sys.exit(4)
"#,
        canary = canary.display(),
        socket = socket_path.display(),
        victim = victim.0.id(),
    );
    let helper = Helper::with_blkid(&sandbox, &script);
    let volume = LoopVolume::create(sandbox.path(), "vol-0a1a1a1a1a1a1a1a1", 64);
    volume.hold_hostile_image();
    let staging = sandbox.staging(&volume.volume_id);
    helper.assert_blkid_failed(
        stage_request(&volume.volume_id, &volume.device, &staging, FsType::Ext4, &[]),
        "exit status: 4: shadow:EACCES chmod:EPERM utime:EPERM setxattr:EPERM unix-socket:EPERM tcp:EPERM \
         stop:EPERM prlimit:EPERM signal-helper:EPERM ids:991:991:- caps:0000000000000004 \
         blocked:0000000000000000",
    );
    let after = std::fs::metadata(&canary).unwrap();
    assert_eq!(
        (after.mode(), after.mtime(), after.mtime_nsec()),
        (before.mode(), before.mtime(), before.mtime_nsec())
    );
    let xattr = rustix::fs::getxattr(&canary, "user.audit3", &mut [0u8; 16]);
    assert_eq!(xattr, Err(rustix::io::Errno::NODATA));
    assert_eq!(
        socket.accept().map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock)
    );
    let state = std::fs::read_to_string(format!("/proc/{}/stat", victim.0.id())).unwrap();
    assert!(state.contains(") S "), "{state}");
    assert_eq!(limits(), victim_limits);
    assert!(!is_mounted(&staging));
    assert_eq!(volume.signature(), String::new());
}

/// A1 (fix 4): `--require-landlock` refuses to start where the kernel does
/// not enforce Landlock (here a seccomp filter, put in place by Python's
/// ctypes before it execs the helper, answers `landlock_create_ruleset`
/// ENOSYS, as a kernel without Landlock does), before it binds its socket;
/// where the kernel enforces it, the helper starts and says the tools are
/// confined.
#[test]
#[cfg_attr(not_root, ignore = "needs root: the helper")]
fn require_landlock_refuses_a_kernel_without_it() {
    require_root();
    let sandbox = Sandbox::new();
    let socket = sandbox.path().join("helper/helper.sock");
    // ld [nr]; jeq 444 (x86_64's landlock_create_ruleset), else allow;
    // SECCOMP_RET_ERRNO | ENOSYS.
    let without_landlock = r#"
import ctypes, os, struct, sys
code = [(0x20, 0, 0, 0), (0x15, 0, 1, 444), (0x06, 0, 0, 0x00050000 | 38), (0x06, 0, 0, 0x7fff0000)]
program = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in code))
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(code), ctypes.addressof(program))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
os.execv(sys.argv[1], sys.argv[1:])
"#;
    let refused = Command::new("/usr/bin/python3")
        .args(["-I", "-c", without_landlock])
        .arg(ebs_csi_tests::binary("ebs-csi-helper"))
        .args(Helper::args(sandbox.path(), &socket))
        .arg("--require-landlock")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.ends_with("Error: the kernel does not enforce Landlock (--require-landlock)\n"),
        "{stderr}"
    );
    assert!(!socket.exists());
    let helper = Helper::start(&sandbox, &["--require-landlock"]);
    // Logged after the socket is bound, which Helper::start waits for.
    wait_until("the helper's word on Landlock", Duration::from_secs(10), || {
        helper.process.log().contains("tools confined by Landlock")
    });
}

/// A1 (fix 1): the tools' uid is neither root nor the agent's, and a
/// helper that cannot switch to it does not start: each refused before
/// the socket is bound, with its reason. (That the tools run as it is
/// `a_taken_over_tool_changes_nothing_outside_its_volume`'s and
/// `helper_formats.rs`'s.)
#[test]
#[cfg_attr(not_root, ignore = "needs root: the helper")]
fn the_tools_uid_is_neither_root_nor_the_agents_and_is_required() {
    require_root();
    let sandbox = Sandbox::new();
    let socket = sandbox.path().join("helper/helper.sock");
    let agent = ebs_csi_tests::AGENT_UID.to_string();
    let agents = format!("Error: --tool-uid {agent} is an --allowed-uid: the tools run as a uid of their own\n");
    let refusals = [
        (
            vec![],
            &["--tool-uid", "0"][..],
            2,
            "error: invalid value '0' for '--tool-uid <UID>': 0 is not in 1..4294967295\n\n\
             For more information, try '--help'.\n",
        ),
        (vec![], &["--tool-uid", &agent][..], 1, agents.as_str()),
        (
            vec!["--bounding-set=-setgid", "--"],
            &[][..],
            1,
            "Error: CAP_SETGID is not permitted: every tool runs as --tool-uid and --tool-gid\n",
        ),
    ];
    for (setpriv, extra, code, message) in refusals {
        let mut command = Command::new(if setpriv.is_empty() { "env" } else { "setpriv" });
        let output = command
            .args(&setpriv)
            .arg(ebs_csi_tests::binary("ebs-csi-helper"))
            .args(Helper::args(sandbox.path(), &socket))
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{extra:?}: {stderr}");
        assert!(stderr.ends_with(message), "{extra:?}: {stderr}");
        assert!(!socket.exists(), "{extra:?}");
    }
}

/// F7 with a read that hangs: blkid, asked about a disk whose first bytes
/// are not zero, and whose read at 4 MiB (a prober's) never answers, is
/// killed at `--tool-timeout-seconds` and the Stage
/// answered, naming the tool, though the stalled read leaves a page of the
/// disk locked and the disk's last close waits for it, holding the disk's
/// open mutex (the helper closes it on a thread of its own); the disk is
/// busy, and not opened, until then; every other volume is served.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, FUSE, the helper")]
fn a_tool_whose_read_stalls_is_answered_for_at_the_time_limit() {
    let stalled = (4 << 20)..(5 << 20);
    let seen = assert_tool_killed_on_a_stalling_disk(FsType::Ext4, 64, &stalled, b"data", "blkid");
    assert_only_stalled_reads(&seen, &stalled);
}

/// F7 with a write that hangs: `mkfs.xfs`, whose direct write of the
/// second allocation group's headers (at 128 MiB of 512) never answers,
/// waits where a kill cannot end it. The Stage is answered at the kill;
/// the tool is reaped when its write ends; the disk is busy until then;
/// every other volume is served.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, FUSE, the helper")]
fn a_tool_a_kill_cannot_end_is_answered_for_and_reaped_later() {
    let seen = assert_tool_killed_on_a_stalling_disk(FsType::Xfs, 512, &((128 << 20)..(129 << 20)), b"", "mkfs.xfs");
    assert!(seen.contains("stalled write 134217728\n"), "{seen}");
}

/// [`stage_on_a_stalling_disk`], whose Stage fails as `tool` (in
/// `/usr/sbin`) is killed at the time limit and its retry as the disk is
/// busy, until the helper has settled the tool; returns what the disk saw.
fn assert_tool_killed_on_a_stalling_disk(
    fs_type: FsType,
    size_mib: u64,
    stalled: &Range<u64>,
    head: &[u8],
    tool: &str,
) -> String {
    let (device, first, retry, seen) = stage_on_a_stalling_disk(fs_type, size_mib, stalled, head, Some(SETTLED));
    let tool = format!("/usr/sbin/{tool}");
    let detail = "still running after 2 s; killed".to_owned();
    assert_eq!(first, HelperError::ToolFailed { tool, detail });
    assert_eq!(retry, HelperError::InProgress { device });
    seen
}

/// A12: the blank proof, whose reads from 7 to 8 MiB never answer (blkid
/// reads nothing there), holds the Stage no longer than
/// `--tool-timeout-seconds`: it fails naming the volume and the limit; the
/// disk is busy until the read ends; every other volume is served.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, FUSE, the helper")]
fn a_blank_proof_whose_reads_stall_ends_at_the_time_limit() {
    let stalled = (7 << 20)..(8 << 20);
    let (device, first, retry, seen) = stage_on_a_stalling_disk(FsType::Ext4, 64, &stalled, b"", None);
    let expected = HelperError::System {
        operation: format!("proving volume {STALLS} blank"),
        detail: format!("{device}: the reads did not end within 2 s"),
    };
    assert_eq!(first, expected);
    assert_eq!(retry, HelperError::InProgress { device });
    assert_only_stalled_reads(&seen, &stalled);
}

/// A probe runs outside the helper's lock, its device claimed: while one
/// volume's blank proof waits on reads that do not answer (a 30 s tool
/// limit), another volume is staged at once, and a second Stage of the
/// first is answered at once that its device is in use; the first is then
/// answered at its limit. Before, each Stage waited for the lock behind the
/// stalled proof, as 32 volumes staged at once waited for each other's.
#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, FUSE, the helper")]
fn a_stalled_probe_holds_no_other_volumes_stage() {
    require_root();
    const SERVED: &str = "vol-0c12c12c12c12c12c";
    let sandbox = Sandbox::new();
    let stalling;
    let helper = Helper::start(&sandbox, &["--tool-timeout-seconds", "30"]);
    let stalled = (7 << 20)..(8 << 20);
    let disk = StalledFile::mount(
        &sandbox.path().join("fuse"),
        &format!("{STALLS}.img"),
        64 << 20,
        stalled,
        b"",
    );
    stalling = LoopVolume::attach_file(STALLS, disk.file());
    let staging = sandbox.staging(STALLS);
    let first = helper.call_in_background(stage_request(STALLS, &stalling.device, &staging, FsType::Ext4, &[]));
    wait_until("the proof's stalled read", Duration::from_secs(20), || {
        disk.seen().contains("stalled read")
    });
    let started = std::time::Instant::now();
    let served = LoopVolume::create(sandbox.path(), SERVED, 64);
    let served_staging = sandbox.staging(SERVED);
    let request = stage_request(SERVED, &served.device, &served_staging, FsType::Ext4, &[]);
    assert_eq!(helper.call(request).unwrap(), Reply::Done);
    assert!(is_mounted(&served_staging));
    let again = helper.call(stage_request(STALLS, &stalling.device, &staging, FsType::Ext4, &[]));
    let device = stalling.device.display().to_string();
    assert!(
        matches!(again, Err(ClientError::Helper(HelperError::InProgress { device: ref d })) if *d == device),
        "{again:?}"
    );
    assert!(!first.is_finished(), "the stalled Stage ended early");
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    drop(disk);
    assert!(first.join().unwrap().is_err());
    assert!(!is_mounted(&staging));
}

/// The volume on the disk that stalls.
const STALLS: &str = "vol-0a12a12a12a12a12a";
/// What the helper logs when a tool it killed past its time limit has
/// ended and it has closed its device (the last close, which waits for a
/// stalled page).
const SETTLED: &str = "a tool killed past its time limit has ended";

/// Stages [`STALLS`] as `fs_type` on a loop device over a file of
/// `size_mib` MiB of the test's FUSE filesystem, zeros but for `head` at
/// its start, whose reads and writes reaching into `stalled` never answer, with a 2 s tool time limit, then
/// again; checks that nothing is mounted and that another volume's Stage
/// is served meanwhile; then stops the disk's server (the stalled reads and
/// writes fail) and waits for the helper to log `settled`, when given.
/// Returns the device, both Stages' errors and what the disk saw
/// ([`StalledFile::seen`]).
fn stage_on_a_stalling_disk(
    fs_type: FsType,
    size_mib: u64,
    stalled: &Range<u64>,
    head: &[u8],
    settled: Option<&str>,
) -> (String, HelperError, HelperError, String) {
    require_root();
    const SERVED: &str = "vol-0b12b12b12b12b12b";
    let sandbox = Sandbox::new();
    // Dropped in this order's reverse: the disk's server stops first, which
    // ends the stalled reads, so that the helper can exit and the loop
    // device be detached.
    let stalling;
    let helper = Helper::start(&sandbox, &["--tool-timeout-seconds", "2"]);
    let name = format!("{STALLS}.img");
    let disk = StalledFile::mount(
        &sandbox.path().join("fuse"),
        &name,
        size_mib << 20,
        stalled.clone(),
        head,
    );
    stalling = LoopVolume::attach_file(STALLS, disk.file());
    let staging = sandbox.staging(STALLS);
    let stage = || match helper.call(stage_request(STALLS, &stalling.device, &staging, fs_type, &[])) {
        Err(ClientError::Helper(e)) => e,
        other => panic!("{other:?}"),
    };
    let (first, retry) = (stage(), stage());
    assert!(!is_mounted(&staging));
    let served = LoopVolume::create(sandbox.path(), SERVED, 64);
    let served_staging = sandbox.staging(SERVED);
    let request = stage_request(SERVED, &served.device, &served_staging, FsType::Ext4, &[]);
    assert_eq!(helper.call(request).unwrap(), Reply::Done);
    assert!(is_mounted(&served_staging));
    let seen = disk.seen();
    drop(disk);
    if let Some(line) = settled {
        let log = || helper.process.log();
        wait_until(line, Duration::from_secs(20), || log().contains(line));
    }
    (stalling.device.display().to_string(), first, retry, seen)
}

/// That the disk saw reads stall in `stalled` and nothing else: no write.
fn assert_only_stalled_reads(seen: &str, stalled: &Range<u64>) {
    let offsets: Vec<u64> = seen
        .lines()
        .filter_map(|l| l.strip_prefix("stalled read ")?.parse().ok())
        .collect();
    assert!(!offsets.is_empty() && offsets.len() == seen.lines().count(), "{seen}");
    assert!(offsets.iter().all(|o| *o < stalled.end), "{seen}");
}
