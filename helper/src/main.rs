//! `ebs-csi-helper`: the privileged node helper (runs as root).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use ebs_csi_helper::claim::Claims;
use ebs_csi_helper::device::IdentityPolicy;
use ebs_csi_helper::exec::{Executor, ToolIds};
use ebs_csi_helper::handler::Handler;
use ebs_csi_helper::harden;
use ebs_csi_helper::kernel::Linux;
use ebs_csi_helper::layout::Layout;
use ebs_csi_helper::mounts::MountTables;
use ebs_csi_helper::path::AllowedRoots;
use ebs_csi_helper::runner::{Runner, RunnerConfig};
use ebs_csi_helper::server::{self, ServerConfig};
use ebs_csi_helper::stop::StopSignals;
use ebs_csi_linux::nvme::{EBS_MODEL, EBS_VENDOR_ID};

/// Formats, mounts, unmounts and grows filesystems on EBS volumes for the
/// unprivileged ebs-csi-agent, after verifying every request.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Unix socket to listen on (ignored under systemd socket activation,
    /// where the socket comes from LISTEN_FDS).
    #[arg(long, default_value = "/run/ebs-csi/helper.sock")]
    socket: PathBuf,
    /// Group that may connect to the socket (mode 0660, owner root); without
    /// it the socket is mode 0600. The peer's uid is checked as well.
    #[arg(long, value_name = "GID")]
    socket_group: Option<u32>,
    /// A uid allowed to send requests (SO_PEERCRED); repeatable. Every
    /// other peer is disconnected before anything is read.
    #[arg(long = "allowed-uid", value_name = "UID", required = true)]
    allowed_uids: Vec<u32>,
    /// A directory beneath which staging and target paths may lie;
    /// repeatable.
    #[arg(long = "allowed-root", value_name = "DIR", default_value = "/var/lib/kubelet")]
    allowed_roots: Vec<PathBuf>,
    /// Whose paths the roots hold: kubelet's (its root directory) or
    /// Nomad's (the plugin's stage_publish_base_dir); csi-sanity's for
    /// tests only. Only the shapes that orchestrator gives a CSI volume's
    /// staging and target paths are mounted on.
    #[arg(long, value_enum, default_value_t = Layout::Kubelet)]
    allowed_layout: Layout,
    /// Accept loop devices whose backing file's name contains the volume id
    /// in place of EBS NVMe devices. For demos and tests only.
    #[arg(long)]
    allow_loop_devices: bool,
    /// Filesystems created at once (mkfs processes); more stage requests
    /// for blank volumes wait their turn.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    max_parallel_formats: u16,
    /// The NVMe model number a volume's controller must report. For tests
    /// on emulated controllers only (QEMU reports "QEMU NVMe Ctrl"); the
    /// serial check is unchanged.
    #[arg(long, default_value = EBS_MODEL, hide_short_help = true)]
    nvme_model: String,
    /// The PCI vendor id (e.g. 0x1d0f) a volume's controller must report.
    /// For tests on emulated controllers only (QEMU's is 0x1b36).
    #[arg(long, default_value = "0x1d0f", value_parser = parse_vendor_id, hide_short_help = true)]
    nvme_vendor_id: u16,
    /// Connections served at once; more are answered "busy".
    #[arg(long, default_value_t = 16)]
    max_connections: usize,
    /// Seconds a peer has to send its whole request, and to read the answer.
    #[arg(long, default_value_t = 5)]
    io_timeout_seconds: u64,
    /// Start although the helper's PID namespace is not the node's initial
    /// one: only on a node that is itself a container (kind), where PID 1 of
    /// this namespace is the node's init and its mount table the node's.
    /// Never in a pod without hostPID, where PID 1 is the pod's own.
    #[arg(long)]
    nested_pid_namespace: bool,
    /// Seconds a tool (blkid, mkfs, xfs_growfs) may run before
    /// it is killed with its process group. The default leaves room for
    /// formatting and growing a 16 TiB volume.
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..))]
    tool_timeout_seconds: u64,
    /// Seconds requests in flight (a format, a growth) may go on after
    /// SIGTERM or SIGINT before the helper exits anyway. Keep it below the
    /// time the service manager gives (kubelet's grace period, 30 s by
    /// default; systemd's TimeoutStopSec).
    #[arg(long, default_value_t = 25)]
    stop_timeout_seconds: u64,
    /// Mount points beneath the allowed roots that may hold volumes (this
    /// driver's and other CSI drivers' staging and target paths); a Stage
    /// or Publish that would mount past it is refused (RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    max_mounts: u32,
    /// Refuse to start where the kernel does not enforce Landlock (not
    /// built in, or not in `lsm=`), instead of starting with a warning:
    /// without it a tool (blkid, mkfs) may open any file root owns.
    #[arg(long)]
    require_landlock: bool,
    /// The uid every tool (blkid, mkfs, xfs_growfs) runs as: not 0 and
    /// not an --allowed-uid. The packages reserve 991 for it
    /// (ebs-csi-tools).
    #[arg(long, value_name = "UID", default_value_t = 991, value_parser = clap::value_parser!(u32).range(1..4_294_967_295))]
    tool_uid: u32,
    /// The gid every tool runs as, its only group: not 0.
    #[arg(long, value_name = "GID", default_value_t = 991, value_parser = clap::value_parser!(u32).range(1..4_294_967_295))]
    tool_gid: u32,
}

/// Start-up, in the order of `docs/helper.md`.
fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // 0. Block SIGTERM and SIGINT in every thread to come (see
    //    ebs_csi_helper::stop); one thread takes them once serving.
    let stop_signals = StopSignals::block().context("blocking SIGTERM and SIGINT")?;
    // 1. Take the systemd socket, if any; close every other inherited fd.
    let activated = ebs_csi_linux::activation::listener_from_systemd().context("taking the socket from systemd")?;
    ebs_csi_helper::close_inherited_fds(activated.is_some()).context("closing inherited descriptors")?;
    // 2. Clear the environment (nothing below reads it).
    ebs_csi_helper::clear_environment();
    //    Refuse a tools' uid that is root's or the agent's, or that the
    //    helper could not switch to (capabilities it was not given).
    anyhow::ensure!(
        !args.allowed_uids.contains(&args.tool_uid),
        "--tool-uid {} is an --allowed-uid: the tools run as a uid of their own",
        args.tool_uid
    );
    harden::require_capabilities()?;
    // 3. The audit log: structured lines on stderr, no terminal colours;
    //    request strings are logged escaped (Debug), so none can start a line.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    // 4. Open the allowed roots; every path is resolved beneath these fds.
    //    Keep PID 1's mount table open (a helper in a container sees the
    //    host's mounts through it); refuse to start where PID 1 is not the
    //    node's init.
    let roots = AllowedRoots::open(&args.allowed_roots, args.allowed_layout).context("opening the allowed roots")?;
    let mounts = MountTables::open(args.nested_pid_namespace).context("opening the node's mount table")?;
    //    Whether the kernel enforces Landlock for the tools (asked now: the
    //    serving filter does not allow the question).
    let landlock = ebs_csi_helper::confine::available();
    anyhow::ensure!(
        landlock || !args.require_landlock,
        "the kernel does not enforce Landlock (--require-landlock)"
    );
    // 5. Bind the socket (owner root, the agent's group, mode 0660).
    let listener = match activated {
        Some(listener) => listener,
        None => bind(&args.socket, args.socket_group)?,
    };
    // 6. Keep only the capabilities of harden::KEPT (refusing to start
    //    without those the tools' uid needs); no new privileges.
    harden::reduce_capabilities().context("reducing capabilities")?;
    harden::forbid_new_privileges().context("setting no_new_privs")?;
    // 7. Fork the runner while this is the only thread: it keeps KEPT and
    //    runs the tools, as the tools' uid, each with the tools' seccomp
    //    denylist; it closes every descriptor of the helper's. The serving
    //    process keeps CAP_SYS_ADMIN alone, in every thread to come, and
    //    the allowlist; it exits when the runner is gone.
    let filters = harden::seccomp_filters().context("compiling the seccomp policy")?;
    ebs_csi_helper::options::check_policy()
        .map_err(anyhow::Error::msg)
        .context("reading the mount-option policy")?;
    ebs_csi_helper::confine::check_policy()
        .map_err(anyhow::Error::msg)
        .context("reading the Landlock policy")?;
    let tool_timeout = Duration::from_secs(args.tool_timeout_seconds);
    let policy = IdentityPolicy {
        nvme_vendor_id: args.nvme_vendor_id,
        nvme_model: args.nvme_model,
        allow_loop_devices: args.allow_loop_devices,
    };
    let runner = Runner::start(RunnerConfig {
        ids: ToolIds {
            uid: args.tool_uid,
            gid: args.tool_gid,
        },
        timeout: tool_timeout,
        formats: args.max_parallel_formats.into(),
        tool_filter: filters.tools,
        policy: policy.clone(),
    })
    .context("starting the runner")?;
    harden::keep_only_serving().context("reducing the serving process's capabilities")?;
    if landlock {
        tracing::info!("tools confined by Landlock");
    } else {
        tracing::warn!("the kernel has no Landlock: tools may open any file root owns");
    }
    harden::install_seccomp(&filters.serving).context("installing the seccomp filter")?;
    runner.exit_with_it().context("watching the runner")?;
    if args.allowed_layout == Layout::CsiSanity {
        tracing::warn!("test mode: mounting at csi-sanity's paths, bound to no volume");
    }
    if policy.nvme_vendor_id != EBS_VENDOR_ID || policy.nvme_model != EBS_MODEL {
        tracing::warn!(vendor_id = policy.nvme_vendor_id, model = %policy.nvme_model, "test mode: accepting NVMe controllers that are not EBS volumes");
    }
    let tools = Executor::new(runner.clone(), tool_timeout, Claims::default());
    let kernel = Linux::new(mounts, policy, tools, runner);
    let handler = Arc::new(Handler::new(roots, args.max_mounts, Box::new(kernel)));
    let config = ServerConfig {
        allowed_uids: args.allowed_uids,
        max_connections: args.max_connections,
        io_timeout: Duration::from_secs(args.io_timeout_seconds),
        stop_timeout: Duration::from_secs(args.stop_timeout_seconds),
    };
    tracing::info!(socket = %args.socket.display(), allowed_uids = ?config.allowed_uids, allowed_roots = ?args.allowed_roots, allowed_layout = ?args.allowed_layout, allow_loop_devices = args.allow_loop_devices, max_parallel_formats = args.max_parallel_formats, max_mounts = args.max_mounts, tool_uid = args.tool_uid, tool_gid = args.tool_gid, "serving");
    // 8. Serve until SIGTERM or SIGINT, then let requests in flight finish.
    let stopping = Arc::new(AtomicBool::new(false));
    stop_signals
        .on_signal(Arc::clone(&stopping))
        .context("starting the signal thread")?;
    server::serve(&listener, handler, &config, &stopping).context("serving")
}

/// A PCI vendor id in hex (`0x1d0f`).
fn parse_vendor_id(text: &str) -> Result<u16, String> {
    let digits = text.strip_prefix("0x").ok_or("expected hex, e.g. 0x1d0f")?;
    u16::from_str_radix(digits, 16).map_err(|e| e.to_string())
}

/// Binds the socket, owned by root and `group`: bound at a name of its own
/// beside it, given its owner and mode, then renamed over the path
/// (replacing a stale socket), so that no peer ever finds it there before
/// it has them.
fn bind(socket: &Path, group: Option<u32>) -> anyhow::Result<UnixListener> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let bound = socket.with_extension("binding");
    match std::fs::remove_file(&bound) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", bound.display()));
        }
        _ => {}
    }
    let listener = UnixListener::bind(&bound).with_context(|| format!("binding {}", bound.display()))?;
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::os::unix::fs::chown(&bound, Some(0), group).context("setting the socket's owner")?;
    std::fs::set_permissions(&bound, std::fs::Permissions::from_mode(mode)).context("setting the socket's mode")?;
    std::fs::rename(&bound, socket).with_context(|| format!("renaming the socket to {}", socket.display()))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hex_vendor_ids_only() {
        assert_eq!(parse_vendor_id("0x1d0f"), Ok(0x1d0f));
        assert_eq!(parse_vendor_id("0x1B36"), Ok(0x1b36));
        assert!(parse_vendor_id("7439").is_err());
        assert!(parse_vendor_id("0x10000").is_err());
    }
}
