//! `ebs-csi-helper`: the privileged node helper (runs as root).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use ebs_csi_helper::device::IdentityPolicy;
use ebs_csi_helper::handler::Handler;
use ebs_csi_helper::path::AllowedRoots;
use ebs_csi_helper::server::{self, ServerConfig};

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
    /// Accept loop devices whose backing file's name contains the volume id
    /// in place of EBS NVMe devices. For demos and tests only.
    #[arg(long)]
    allow_loop_devices: bool,
    /// Connections served at once; more are answered "busy".
    #[arg(long, default_value_t = 16)]
    max_connections: usize,
    /// Seconds a peer has to send its request and to read the answer.
    #[arg(long, default_value_t = 5)]
    io_timeout_seconds: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let roots = AllowedRoots::open(&args.allowed_roots).context("opening the allowed roots")?;
    let listener = match ebs_csi_helper::listener_from_systemd() {
        Some(listener) => listener,
        None => bind(&args.socket, args.socket_group)?,
    };
    let handler = Arc::new(Handler::new(
        roots,
        IdentityPolicy {
            allow_loop_devices: args.allow_loop_devices,
        },
    ));
    let config = ServerConfig {
        allowed_uids: args.allowed_uids,
        max_connections: args.max_connections,
        io_timeout: Duration::from_secs(args.io_timeout_seconds),
    };
    tracing::info!(socket = %args.socket.display(), allowed_uids = ?config.allowed_uids, allowed_roots = ?args.allowed_roots, allow_loop_devices = args.allow_loop_devices, "serving");
    server::serve(&listener, handler, &config).context("serving")
}

/// Binds the socket, replacing a stale one, owned by root and `group`.
fn bind(socket: &Path, group: Option<u32>) -> anyhow::Result<UnixListener> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", socket.display()));
        }
        _ => {}
    }
    let listener = UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))?;
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::os::unix::fs::chown(socket, Some(0), group).context("setting the socket's owner")?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(mode)).context("setting the socket's mode")?;
    Ok(listener)
}
