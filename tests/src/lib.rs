//! Test support: real helper and agent processes, loop devices standing in
//! for EBS volumes, and a CSI client over the agent's unix socket.
//!
//! Most of it needs root (loop devices, mounts). A test that does is
//! reported ignored, with the reason, when built by another user
//! (`tests/build.rs`), and fails through [`require_root`] if it runs as
//! another user anyway: it never passes without having run.
#![allow(
    clippy::expect_used,
    reason = "test support: a failed set-up step should stop the test"
)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ebs_csi_helper_client::{ClientError, HelperClient};
use ebs_csi_helper_proto::{HelperError, Reply, Request};
use ebs_csi_proto::v1::node_client::NodeClient;
use tonic::transport::Channel;

pub mod attach_sim;
pub mod bench;
pub mod changed_blocks;
pub mod chaos;
pub mod http_proxy;
pub mod kube;
pub mod kube_api;
pub mod lifecycle;
pub mod loopdev;
pub mod moto;
pub mod nomad;
pub mod otlp;
pub mod qemu;
pub mod stall;
pub mod trace;
pub mod unreadable;

pub use ebs_csi_test_guest::{
    AGENT_UID, channel, children, exec_gate, guest, is_ready, kubelet_block_target, kubelet_staging,
    kubelet_staging_hash, kubelet_target, make_dir, publish_device, publish_staged, run, run_as, sha256_hex,
    stage_request, wait_until, write_kubelet_record,
};
pub use loopdev::LoopVolume;

/// The first line of a test that needs root, which is marked
/// `#[cfg_attr(not_root, ignore = "needs root: …")]`: `tests/build.rs` sets
/// `not_root` when the tests are built by another user, who then sees the
/// test ignored with its reason. Built as root and run by another user, the
/// test fails here: it never passes without having run.
///
/// # Panics
/// When the process is not root.
pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root (loop devices, mounts, the helper) and was built by root: run it as root"
    );
}

/// The repository's root.
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A program of the virtual environment `make test` installs (moto,
/// grpcio, cryptography): `.venv/bin/<name>`.
pub fn venv_program(name: &str) -> PathBuf {
    let path = repository().join(".venv/bin").join(name);
    assert!(path.exists(), "{} is missing: run `make test`", path.display());
    path
}

/// Path of a binary of this workspace: in the directory `EBS_CSI_BINARIES`
/// names when set (`make bench` measures the static binaries the images
/// ship), else built next to the running executable (a test in
/// `target/<profile>/deps`, or the demo in `target/<profile>`; `make test`
/// builds every binary first).
pub fn binary(name: &str) -> PathBuf {
    let dir = std::env::var_os("EBS_CSI_BINARIES").map_or_else(profile_dir, PathBuf::from);
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace --bins`",
        path.display()
    );
    path
}

/// `<target dir>/<profile>` of the running executable: a test runs in its
/// `deps`, the demo and the benchmark in it.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe dir");
    if dir.ends_with("deps") {
        dir.parent().expect("target dir").to_owned()
    } else {
        dir.to_owned()
    }
}

/// The Go program `name` of `make go-tools` (tests/go's, tests/grpc-go's)
/// or `make kube-tools`, in `<target dir>/go/bin`.
pub fn go_tool(name: &str) -> PathBuf {
    let path = profile_dir().parent().expect("target dir").join("go/bin").join(name);
    assert!(path.exists(), "{} is not built: run `make go-tools`", path.display());
    path
}

/// A scratch tree: the helper's allowed root, sockets, backing files.
///
/// As root, the tree is a shared mount of its own (bound onto itself,
/// `MS_SHARED`), as `/` is on a host that systemd runs. A mount namespace
/// made while one of its volumes is mounted (a test's `unshare --mount`,
/// here or in another test running beside it) holds a copy of that mount,
/// and with it the volume's filesystem: made private, it keeps the copy
/// after the test unmounts the volume, and the helper then rightly refuses
/// to stage it again (`Refusal::HeldUnseen` of `ebs_csi_helper::device`);
/// made a slave of a shared mount, the unmount reaches the copy too (the
/// kernel's `Documentation/filesystems/sharedsubtree.rst`). Tests
/// therefore make their namespaces slaves ([`SLAVE_NAMESPACE`]).
pub struct Sandbox {
    dir: tempfile::TempDir,
}

/// `unshare`'s arguments for a new mount namespace whose copies of the
/// sandboxes' mounts follow the host's (see [`Sandbox`]).
pub const SLAVE_NAMESPACE: [&str; 3] = ["--mount", "--propagation", "slave"];

/// The start of every sandbox's name in the temporary directory:
/// `ebs-csi-test-` and the run's mark (`EBS_CSI_TEST_RUN`, six hex digits,
/// which make test exports) where there is one, so that what one run left
/// behind is told from what another beside it has (tests/leftovers.py). Four
/// random characters follow: a unix socket's path has at most 107 bytes
/// (`sun_path`, `<sys/un.h>`), and Nomad's plugin socket beneath a sandbox
/// (`nomad/data/client/csi/plugins/<allocation id>/csi.sock`) takes 76 of them.
pub fn sandbox_prefix() -> String {
    format!("ebs-csi-test-{}", std::env::var("EBS_CSI_TEST_RUN").unwrap_or_default())
}

impl Sandbox {
    /// A new world-traversable temporary directory ([`sandbox_prefix`]),
    /// as root a shared mount of its own.
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&sandbox_prefix())
            .rand_bytes(4)
            .tempdir()
            .expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        if rustix::process::geteuid().is_root() {
            rustix::mount::mount_bind(dir.path(), dir.path()).expect("binding the sandbox onto itself");
            rustix::mount::mount_change(dir.path(), rustix::mount::MountPropagationFlags::SHARED)
                .expect("making the sandbox a shared mount");
        }
        Self { dir }
    }

    /// The root directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Mount points beneath the root: what the test mounted, not the
    /// sandbox's own mount.
    pub fn mounts(&self) -> Vec<String> {
        let root = format!("{}/", self.path().to_string_lossy());
        ebs_csi_mounts().into_iter().filter(|m| m.starts_with(&root)).collect()
    }

    /// The allowed root handed to the helper (`<sandbox>/kubelet`): root's,
    /// mode 0750, as kubelet makes its directories, so the unprivileged
    /// agent cannot look beneath it.
    pub fn kubelet(&self) -> PathBuf {
        let kubelet = self.mkdir("kubelet");
        std::fs::set_permissions(&kubelet, std::fs::Permissions::from_mode(0o750)).expect("chmod");
        kubelet
    }

    /// kubelet's staging path of the volume `volume_id` beneath
    /// [`Sandbox::kubelet`], made as kubelet makes it: empty, with
    /// kubelet's record of the volume beside it ([`kubelet_staging`]).
    pub fn staging(&self, volume_id: &str) -> PathBuf {
        kubelet_staging(&self.kubelet(), volume_id)
    }

    /// kubelet's target path of the volume `volume_id` as the PV `pv` in pod
    /// `pod` beneath [`Sandbox::kubelet`]:
    /// `pods/<pod>/volumes/kubernetes.io~csi/<pv>/mount` (`csi_mounter.go`),
    /// its parent made with kubelet's record of the volume in it, itself
    /// not (the plugin creates it).
    pub fn target(&self, pod: &str, pv: &str, volume_id: &str) -> PathBuf {
        kubelet_target(&self.kubelet(), pod, pv, volume_id)
    }

    /// kubelet's raw block target of the volume `volume_id` as the PV `pv`
    /// in pod `pod`: `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod>`
    /// (`csi_block.go`), its parent made and kubelet's record of the volume
    /// in `volumeDevices/<pv>/data`, itself not.
    pub fn block_target(&self, pod: &str, pv: &str, volume_id: &str) -> PathBuf {
        kubelet_block_target(&self.kubelet(), pod, pv, volume_id)
    }

    /// The device tree the agent is pointed at (`--dev-dir`).
    pub fn dev_dir(&self) -> PathBuf {
        self.mkdir("dev")
    }

    /// Links `dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol…` to the
    /// loop device of `volume`, as udev does for an attached EBS volume.
    pub fn link_ebs_device(&self, volume: &LoopVolume) {
        link_ebs_device(self.path(), volume);
    }

    /// Creates `<sandbox>/<rel>` (and parents), mode 0755.
    pub fn mkdir(&self, rel: &str) -> PathBuf {
        make_dir(&self.path().join(rel))
    }
}

/// Links `<dir>/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol…` to the
/// loop device of `volume`, as udev does for an attached EBS volume.
pub fn link_ebs_device(dir: &Path, volume: &LoopVolume) {
    let by_id = make_dir(&dir.join("dev/disk/by-id"));
    let serial = volume.volume_id.replacen('-', "", 1);
    std::os::unix::fs::symlink(
        &volume.device,
        by_id.join(format!("nvme-Amazon_Elastic_Block_Store_{serial}")),
    )
    .expect("link");
}

/// Whether this process may grow ext4 online (`CAP_SYS_RESOURCE`, which
/// `ext4_resize_begin` requires; some sandboxes withhold it even from root).
pub fn has_cap_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap_or("0")
        .trim();
    u64::from_str_radix(effective, 16).unwrap_or(0) & (1 << CAP_SYS_RESOURCE) != 0
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Unmount whatever a failed test left behind, deepest first, then
        // the sandbox's own mount, so the temporary directory can be removed.
        let root = self.path().to_string_lossy().into_owned();
        let mut mounts: Vec<String> = ebs_csi_mounts().into_iter().filter(|m| m.starts_with(&root)).collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in mounts {
            let _ = rustix::mount::unmount(mount.as_str(), rustix::mount::UnmountFlags::DETACH);
        }
        loopdev::detach_under(self.path());
    }
}

/// Mount points of this process's mount namespace.
pub fn ebs_csi_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .collect()
}

/// Whether the mount point `mount_point` is the host's own: outside every
/// test sandbox and the directories the real cluster keeps outside its own
/// ([`kube::OUTSIDE`]), whose mounts change as tests run beside them.
pub fn is_the_hosts(mount_point: &str) -> bool {
    !mount_point.starts_with("/tmp/ebs-csi-test-") && !kube::OUTSIDE.iter().any(|dir| mount_point.starts_with(dir))
}

/// Mount points at or beneath `root` (tests run in parallel, so each looks
/// only at its own sandbox).
pub fn mounts_under(root: &Path) -> Vec<String> {
    let root = root.to_string_lossy();
    ebs_csi_mounts().into_iter().filter(|m| m.starts_with(&*root)).collect()
}

/// Whether `path` is a mount point.
pub fn is_mounted(path: &Path) -> bool {
    let path = path.to_string_lossy();
    ebs_csi_mounts().iter().any(|m| *m == path)
}

/// A running process, killed on drop.
pub struct Process {
    child: Child,
    name: &'static str,
    log: PathBuf,
}

impl Process {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, as the kernel's OOM killer or a node's power failure
    /// ends a process: no chance to clean up. Waits until it is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `timeout` for the process to exit: its status, or `None`
    /// while it still runs.
    pub fn exit_within(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => return None,
            }
        }
    }
}

impl Drop for Process {
    /// SIGTERM first, so a process can clean up (the attach simulator
    /// detaches its loop devices), SIGKILL after 5 s.
    fn drop(&mut self) {
        // Not once it has exited and been reaped: its pid may be another's.
        let running = matches!(self.child.try_wait(), Ok(None));
        if let Some(pid) = rustix::process::Pid::from_raw(i32::try_from(self.child.id()).unwrap_or_default())
            && running
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- {} log ---\n{}", self.name, self.log());
        }
    }
}

/// `len` bytes of a fixed, non-repeating pattern: data a test writes to a
/// volume and later checks, which no filesystem tool would write.
pub fn data_pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            u32::try_from(i)
                .unwrap_or(u32::MAX)
                .wrapping_mul(2_654_435_761)
                .to_be_bytes()[0]
        })
        .collect()
}

/// Starts `command` with stderr to `log` and waits until `ready` is ready
/// ([`is_ready`]: its socket listens, or a file it writes exists).
pub fn spawn(name: &'static str, mut command: Command, log: PathBuf, ready: &Path) -> Process {
    let file = std::fs::File::create(&log).expect("log file");
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("spawn");
    let mut process = Process { child, name, log };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !is_ready(ready, process.child.id()) {
        if let Ok(Some(status)) = process.child.try_wait() {
            panic!("{name} exited ({status}) before it was ready:\n{}", process.log());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {name} ({})\n{}",
            ready.display(),
            process.log()
        );
        // A fine poll: `make bench` times the start to the first Probe.
        std::thread::sleep(Duration::from_millis(1));
    }
    process
}

/// The helper of a test: the real `ebs-csi-helper` binary, as root.
pub struct Helper {
    /// Its socket.
    pub socket: PathBuf,
    /// The process.
    pub process: Process,
}

impl Helper {
    /// Starts the helper with `--allow-loop-devices`, allowing the agent
    /// uid and the sandbox's kubelet directory, plus `extra` arguments.
    pub fn start(sandbox: &Sandbox, extra: &[&str]) -> Self {
        Self::start_in(sandbox.path(), extra)
    }

    /// [`Helper::start`] for the sandbox at `dir`.
    pub fn start_in(dir: &Path, extra: &[&str]) -> Self {
        Self::start_program(&binary("ebs-csi-helper"), dir, extra)
    }

    /// [`Helper::start_in`] with another build of the helper, `program`.
    pub fn start_program(program: &Path, dir: &Path, extra: &[&str]) -> Self {
        let socket = dir.join("helper/helper.sock");
        let mut command = Command::new(program);
        command.args(Self::args(dir, &socket)).args(extra);
        let process = spawn("helper", command, dir.join("helper.log"), &socket);
        Self { socket, process }
    }

    /// The real helper, in a mount namespace of its own where `script` is
    /// bind-mounted over `/usr/sbin/blkid` (nothing outside changes): the
    /// stand-in for a tool a hostile image took over.
    pub fn with_blkid(sandbox: &Sandbox, script: &str) -> Self {
        let fake = sandbox.path().join("fake-blkid");
        std::fs::write(&fake, script).expect("writing the stand-in tool");
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("making the stand-in tool executable");
        let socket = sandbox.path().join("helper/helper.sock");
        let mut command = Command::new("unshare");
        command
            .args(SLAVE_NAMESPACE)
            .args([
                "sh",
                "-c",
                "mount --bind \"$1\" /usr/sbin/blkid && shift && exec \"$@\"",
            ])
            .args(["sh", &fake.to_string_lossy()])
            .arg(binary("ebs-csi-helper"))
            .args(Self::args(sandbox.path(), &socket));
        Self {
            process: spawn("helper", command, sandbox.path().join("helper.log"), &socket),
            socket,
        }
    }

    /// Sends `request`, a Stage the stand-in `blkid` of
    /// [`Helper::with_blkid`] probes for, and asserts that it fails with
    /// that tool's `detail` (`exit status: N: <what it wrote on stderr>`).
    pub fn assert_blkid_failed(&self, request: Request, detail: &str) {
        let answer = self.call(request);
        let expected = HelperError::ToolFailed {
            tool: "/usr/sbin/blkid".into(),
            detail: detail.into(),
        };
        assert!(
            matches!(&answer, Err(ClientError::Helper(e)) if *e == expected),
            "{answer:?}"
        );
    }

    /// The command that runs the helper (with [`Helper::args`] and `extra`)
    /// as PID 1 of a new PID namespace, as a container's first process
    /// (`unshare --pid --fork`), printing the namespace's link on stderr
    /// first. The helper needs `--nested-pid-namespace` there to start.
    /// `unshare` blocks SIGTERM while it waits for its child, so
    /// [`Process`]'s drop ends it with SIGKILL, and the helper would live
    /// on without it: `--kill-child` kills the helper (and with it the
    /// namespace) when `unshare` dies.
    pub fn in_own_pid_namespace(dir: &Path, socket: &Path, extra: &[&str]) -> Command {
        let mut command = Command::new("unshare");
        command
            .args([
                "--pid",
                "--fork",
                "--kill-child",
                "sh",
                "-c",
                "readlink /proc/self/ns/pid >&2 && exec \"$0\" \"$@\"",
            ])
            .arg(binary("ebs-csi-helper"))
            .args(Self::args(dir, socket))
            .args(extra);
        command
    }

    /// The test helper's arguments: listen on `socket`, allow the agent
    /// uid and the sandbox's kubelet directory, accept loop devices.
    pub fn args(dir: &Path, socket: &Path) -> Vec<std::ffi::OsString> {
        let uid = AGENT_UID.to_string();
        let mut args: Vec<std::ffi::OsString> = vec!["--socket".into(), socket.into()];
        args.extend(["--socket-group", &uid, "--allowed-uid", &uid, "--allowed-root"].map(Into::into));
        args.push(make_dir(&dir.join("kubelet")).into());
        args.push("--allow-loop-devices".into());
        args
    }

    /// Sends one request as the agent's uid would, from a child process
    /// running as that uid (the helper refuses root unless allowed).
    pub fn call_as(&self, uid: u32, request: Request) -> Result<Reply, ClientError> {
        let socket = self.socket.clone();
        run_as(uid, move || {
            HelperClient::new(socket, Duration::from_secs(60)).call(request)
        })
    }

    /// Sends one request as the agent's uid.
    pub fn call(&self, request: Request) -> Result<Reply, ClientError> {
        self.call_as(AGENT_UID, request)
    }

    /// [`Helper::call`] from another thread, as the agent would while the
    /// test goes on (stops a tool, sends a signal, asks again).
    pub fn call_in_background(&self, request: Request) -> std::thread::JoinHandle<Result<Reply, ClientError>> {
        let socket = self.socket.clone();
        std::thread::spawn(move || {
            run_as(AGENT_UID, move || {
                HelperClient::new(socket, Duration::from_secs(60)).call(request)
            })
        })
    }
}

/// The agent of a test: the real `ebs-csi-agent` binary, as uid 65534.
pub struct Agent {
    /// Its CSI socket.
    pub socket: PathBuf,
    /// The process.
    pub process: Process,
}

impl Agent {
    /// Node metadata flags for tests that do not exercise IMDS.
    pub const NODE_FLAGS: [&'static str; 6] = [
        "--node-id",
        "i-0123456789abcdef0",
        "--availability-zone",
        "us-east-1a",
        "--instance-type",
        "m5.large",
    ];

    /// Starts the agent with [`Agent::NODE_FLAGS`] and a short device wait.
    pub fn start(sandbox: &Sandbox, helper: &Helper) -> Self {
        Self::spawn(
            sandbox,
            helper,
            &[&Self::NODE_FLAGS[..], &["--device-wait-seconds", "10"]].concat(),
            &[],
        )
    }

    /// Starts the agent as [`AGENT_UID`] against `helper`, with `--dev-dir`
    /// pointing at the sandbox's device tree, `args` and environment `env`.
    pub fn spawn(sandbox: &Sandbox, helper: &Helper, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_in(sandbox.path(), &helper.socket, args, env)
    }

    /// [`Agent::spawn`] for the sandbox at `dir` and the helper at `helper_socket`.
    pub fn spawn_in(dir: &Path, helper_socket: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let run = make_dir(&dir.join("agent"));
        std::os::unix::fs::chown(&run, Some(AGENT_UID), Some(AGENT_UID)).expect("chown");
        let socket = run.join("csi.sock");
        let mut command = Command::new(binary("ebs-csi-agent"));
        command
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .arg("--helper-socket")
            .arg(helper_socket)
            .arg("--dev-dir")
            .arg(make_dir(&dir.join("dev")))
            .args(args)
            .envs(env.iter().copied())
            .uid(AGENT_UID)
            .gid(AGENT_UID);
        let process = spawn("agent", command, dir.join("agent.log"), &socket);
        Self { socket, process }
    }

    /// A CSI Node client connected to the agent's socket.
    pub async fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(channel(&self.socket).await)
    }
}

#[cfg(test)]
mod tests {
    /// The helper accepts kubelet's staging paths of one driver, by name;
    /// it links no gRPC code, so it keeps its own copy of the name.
    #[test]
    fn the_helper_and_the_agent_name_the_same_driver() {
        assert_eq!(ebs_csi_helper::layout::DRIVER_NAME, ebs_csi_proto::DRIVER_NAME);
    }
}
