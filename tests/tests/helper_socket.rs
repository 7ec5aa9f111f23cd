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
    let kept = admin | resource | read_search | write | kill | set_ids;
    // Every thread of the serving process: the filter and CAP_SYS_ADMIN
    // alone, not even permitted more.
    for (name, task) in threads(pid) {
        assert_eq!((task.bits("CapEff:"), task.bits("CapPrm:")), (admin, admin), "{name}");
        assert_eq!(task.bits("CapBnd:") & !kept, 0, "{name}: bounding set");
        assert_eq!((task.bits("CapInh:"), task.bits("CapAmb:")), (0, 0), "{name}");
        assert_eq!(task.field("NoNewPrivs:"), "1", "{name}");
        assert_eq!(task.field("Seccomp:"), "2", "{name}: seccomp mode");
    }
    // The runner, a process of its own: the tools' capabilities and the
    // switch to their uid (CAP_SYS_RESOURCE where the machine grants it),
    // outside the filter, which binds the helper and not its tools.
    // It names itself and starts its threads (each names itself) while
    // the helper serves already: wait for one tools thread and two
    // formatter threads.
    let (mut runner, mut tasks) = (0, Vec::new());
    wait_until("the runner's threads", Duration::from_secs(5), || {
        runner = *ebs_csi_tests::children::descendants_named(pid, "ebs-csi-runner")
            .first()
            .unwrap_or(&0);
        tasks = if runner == 0 { Vec::new() } else { threads(runner) };
        let mut names: Vec<&str> = tasks.iter().map(|(name, _)| name.as_str()).collect();
        names.sort_unstable();
        names == ["ebs-csi-runner", "formatter", "formatter", "tools"]
    });
    for (name, task) in &tasks {
        let effective = task.bits("CapEff:");
        assert_eq!(task.bits("CapPrm:"), effective, "{name}");
        assert_eq!(
            effective & !kept,
            0,
            "{name}: {effective:x} holds more than the tools need"
        );
        assert_eq!(effective | resource, kept, "{name}: {effective:x}");
        assert_eq!((task.bits("CapInh:"), task.bits("CapAmb:")), (0, 0), "{name}");
        assert_eq!(task.field("NoNewPrivs:"), "1", "{name}");
        assert_eq!(task.field("Seccomp:"), "0", "{name}: seccomp mode");
    }
    // The runner holds stdio and its socket to the helper, nothing of the
    // helper's (listening socket, roots, mount table).
    let runner_descriptors: Vec<String> = std::fs::read_dir(format!("/proc/{runner}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
        .map(|target| target.display().to_string())
        .collect();
    assert_eq!(runner_descriptors.len(), 4, "{runner_descriptors:?}");
    assert!(runner_descriptors[3].starts_with("socket:"), "{runner_descriptors:?}");
    // stdin, stdout, stderr, the allowed root, PID 1's mountinfo, the
    // listening socket and the runner's. The helper closes a connection right after its
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
    while open.len() > 7 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
        open = descriptors();
    }
    assert!(open.len() <= 7, "unexpected descriptors: {open:?}");
}

/// A helper whose runner is gone cannot run a tool: it exits (status 1,
/// said in its log) for the service manager to start both again, rather
/// than serve without them; and a runner outlives no helper.
#[test]
#[cfg_attr(not_root, ignore = "needs root: the helper")]
fn the_helper_and_its_runner_end_together() {
    require_root();
    let sandbox = Sandbox::new();
    let mut helper = ebs_csi_tests::Helper::start(&sandbox, &[]);
    let runner = runner_of(&helper);
    let kill = |pid: u32| {
        let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    };
    kill(runner);
    let status = helper.process.exit_within(Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{}", helper.process.log());
    assert!(helper.process.log().contains("the runner process has ended; exiting"));
    let mut helper = ebs_csi_tests::Helper::start(&sandbox, &[]);
    let runner = runner_of(&helper);
    helper.process.kill();
    wait_until("the runner ends with its helper", Duration::from_secs(10), || {
        ebs_csi_tests::children::exited(runner)
    });
}

/// The pid of `helper`'s runner, once it has named itself.
fn runner_of(helper: &ebs_csi_tests::Helper) -> u32 {
    let mut runner = Vec::new();
    wait_until("the helper's runner", Duration::from_secs(5), || {
        runner = ebs_csi_tests::children::descendants_named(helper.process.pid(), "ebs-csi-runner");
        !runner.is_empty()
    });
    runner[0]
}

/// One thread's `/proc/<pid>/task/<tid>/status`.
struct TaskStatus(String);

impl TaskStatus {
    fn field(&self, name: &str) -> String {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .trim()
            .to_owned()
    }

    fn bits(&self, set: &str) -> u64 {
        u64::from_str_radix(&self.field(set), 16).unwrap()
    }
}

/// The threads of `pid`, by name, with their status. A thread gone meanwhile
/// (a connection's, which ends right after its answer) has nothing left to
/// check.
fn threads(pid: u32) -> Vec<(String, TaskStatus)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| {
            let task = task.ok()?.path();
            let status = std::fs::read_to_string(task.join("status")).ok()?;
            let name = std::fs::read_to_string(task.join("comm")).ok()?;
            Some((name.trim().to_owned(), TaskStatus(status)))
        })
        .collect()
}
