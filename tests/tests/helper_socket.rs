//! The helper's socket: one it binds itself appears with its owner and
//! mode, and one handed over by systemd socket activation (`LISTEN_FDS`,
//! here from `systemd-socket-activate`) is served.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use ebs_csi_helper_client::HelperClient;
use ebs_csi_helper_proto::{PROTOCOL_VERSION, Reply, Request};
use ebs_csi_tests::{AGENT_UID, Helper, Sandbox, binary, require_root, run_as, wait_until};
use rustix::fs::inotify;

/// The socket's name appears only by a rename, with its owner and mode
/// already set: a peer that finds it can connect (before, an agent
/// connecting between `bind(2)` and `chmod(2)` got `EACCES`).
#[test]
#[cfg_attr(not_root, ignore = "needs root: the helper")]
fn the_socket_appears_with_its_owner_and_mode() {
    require_root();
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("helper");
    std::fs::create_dir_all(&dir).unwrap();
    let watch = inotify::init(inotify::CreateFlags::CLOEXEC).unwrap();
    inotify::add_watch(
        &watch,
        &dir,
        inotify::WatchFlags::CREATE | inotify::WatchFlags::MOVED_TO,
    )
    .unwrap();
    let helper = Helper::start(&sandbox, &[]);
    let mut buffer = [std::mem::MaybeUninit::uninit(); 4096];
    let mut events = inotify::Reader::new(&watch, &mut buffer);
    let mut seen = Vec::new();
    while let Ok(event) = events.next() {
        let name = event.file_name().map(|n| n.to_string_lossy().into_owned());
        seen.push((name.clone(), event.events()));
        if name.as_deref() == Some("helper.sock") {
            break;
        }
    }
    assert_eq!(
        seen,
        [
            (Some("helper.binding".to_owned()), inotify::ReadFlags::CREATE),
            (Some("helper.sock".to_owned()), inotify::ReadFlags::MOVED_TO),
        ]
    );
    let metadata = std::fs::symlink_metadata(&helper.socket).unwrap();
    assert_eq!(
        (metadata.uid(), metadata.gid(), metadata.permissions().mode() & 0o777),
        (0, AGENT_UID, 0o660)
    );
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn serves_a_systemd_activated_socket() {
    require_root();
    assert!(
        Command::new("systemd-socket-activate").arg("--help").output().is_ok(),
        "systemd-socket-activate is not installed (make deps installs it)"
    );
    let sandbox = Sandbox::new();
    let socket = sandbox.path().join("activated.sock");
    let mut activator = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&socket)
        .arg(binary("ebs-csi-helper"))
        .args([
            "--socket",
            "/nonexistent/unused.sock",
            "--allowed-uid",
            &AGENT_UID.to_string(),
            "--allowed-root",
        ])
        .arg(sandbox.kubelet())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the activation socket", Duration::from_secs(10), || {
        ebs_csi_tests::is_ready(&socket, activator.id())
    });
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let reply = run_as(AGENT_UID, {
        let socket = socket.clone();
        move || HelperClient::new(socket, Duration::from_secs(10)).call(Request::Ping)
    });
    let _ = activator.kill();
    let _ = activator.wait();
    assert_eq!(
        reply.unwrap(),
        Reply::Pong {
            version: PROTOCOL_VERSION
        }
    );
    assert!(
        !std::path::Path::new("/nonexistent/unused.sock").exists(),
        "the helper bound its own socket"
    );
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn the_helper_runs_with_least_privilege() {
    require_root();
    let sandbox = Sandbox::new();
    let helper = ebs_csi_tests::Helper::start(&sandbox, &[]);
    // The socket listens before the helper drops its privileges (binding
    // needs them); the first reply comes after, so wait for one.
    assert_eq!(
        helper.call(Request::Ping).unwrap(),
        Reply::Pong {
            version: PROTOCOL_VERSION
        }
    );
    let pid = helper.process.pid();
    let (admin, resource, read_search): (u64, u64, u64) = (1 << 21, 1 << 24, 1 << 2);
    // CAP_DAC_OVERRIDE, CAP_KILL, CAP_SETGID, CAP_SETUID
    // (include/uapi/linux/capability.h: 1, 5, 6, 7).
    let (write, kill, set_ids): (u64, u64, u64) = (1 << 1, 1 << 5, (1 << 6) | (1 << 7));
    let (mut executors, mut growers) = (0, 0);
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        // The Ping's connection thread ends right after its answer: a
        // thread gone meanwhile has nothing left to check.
        let (Ok(status), Ok(name)) = (
            std::fs::read_to_string(task.join("status")),
            std::fs::read_to_string(task.join("comm")),
        ) else {
            continue;
        };
        let name = name.trim().to_owned();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap()
                .trim()
                .to_owned()
        };
        let bits = |set: &str| u64::from_str_radix(&field(set), 16).unwrap();
        // The executor threads run the tools outside the filter, kill a
        // tool's group (CAP_KILL) and keep the tools' capabilities and the
        // switch to their uid permitted, not effective; the
        // grower thread, outside the filter too, keeps CAP_SYS_RESOURCE
        // (where the machine grants it) and CAP_DAC_READ_SEARCH permitted,
        // effective only while it grows ext4; every other thread serves
        // requests: the filter and CAP_SYS_ADMIN only.
        let executor = name == "tools" || name == "formatter";
        let grower = name == "grower";
        executors += usize::from(executor);
        growers += usize::from(grower);
        let (effective, permitted) = match (executor, grower) {
            (true, _) => (admin | kill, admin | kill | read_search | write | set_ids),
            (_, true) => (0, resource | read_search),
            _ => (admin, admin),
        };
        if executor || grower {
            assert_ne!(bits("CapPrm:") & read_search, 0, "{name} lost CAP_DAC_READ_SEARCH");
        }
        for (set, allowed) in [("CapEff:", effective), ("CapPrm:", permitted)] {
            assert_eq!(
                bits(set) & !allowed,
                0,
                "{name}: {set} {:x} holds more than it needs",
                bits(set)
            );
            assert_eq!(bits(set) & admin, allowed & admin, "{name}: {set} CAP_SYS_ADMIN");
        }
        assert_eq!(
            bits("CapBnd:") & !(admin | resource | read_search | write | kill | set_ids),
            0,
            "{name}: bounding set"
        );
        assert_eq!(bits("CapInh:"), 0);
        assert_eq!(bits("CapAmb:"), 0);
        assert_eq!(field("NoNewPrivs:"), "1");
        let filtered = if executor || grower { "0" } else { "2" };
        assert_eq!(field("Seccomp:"), filtered, "{name}: seccomp mode");
    }
    assert_eq!(
        (executors, growers),
        (3, 1),
        "one tools thread, two formatter threads, one grower"
    );
    // stdin, stdout, stderr, the allowed root, PID 1's mountinfo and the
    // listening socket. The helper closes a connection right after its
    // answer, so the Ping's may still be open when the answer arrives: wait
    // for it to go (a descriptor that stays is a leak, and fails here).
    let descriptors = || -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
            .map(|target| target.display().to_string())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut open = descriptors();
    while open.len() > 6 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
        open = descriptors();
    }
    assert!(open.len() <= 6, "unexpected descriptors: {open:?}");
}
