//! Least privilege, applied at start-up (`docs/helper.md`, steps 1–7).

use std::collections::HashMap;
use std::io;

use rustix::io::Errno;
use rustix::thread::{CapabilitySet, CapabilitySets};
use seccompiler::{BpfProgram, TargetArch, sock_filter};

/// The capabilities the helper keeps, and why:
/// - `CAP_SYS_ADMIN`: `mount(2)`, `umount2(2)`, the NVMe admin ioctl, and
///   `xfs_growfs` and `mkfs.xfs` (see [`crate::exec::Tool::capabilities`]);
/// - `CAP_SYS_RESOURCE`: online ext4 growth (`EXT4_IOC_RESIZE_FS`;
///   `ext4_resize_begin` checks it);
/// - `CAP_DAC_READ_SEARCH`: the growth of either filesystem opens its
///   mounted root directory, which its owner may have made unreadable to
///   others, and `blkid` reads a root-owned device node as another uid;
/// - `CAP_DAC_OVERRIDE`: mkfs writes one;
/// - `CAP_SETUID`, `CAP_SETGID`: each tool runs as `--tool-uid` and
///   `--tool-gid`, and `CAP_KILL`: its process group is killed when it ends
///   ([`crate::exec`]).
///
/// The runner process ([`crate::runner`]) keeps them all, permitted and
/// effective (each tool child sets its own to what it needs before it
/// execs, and `no_new_privs` keeps the exec from adding any); the serving
/// process keeps [`SERVING`] alone ([`keep_only_serving`], in `main` after
/// the runner is forked and before any thread starts).
pub const KEPT: CapabilitySet = CapabilitySet::SYS_ADMIN
    .union(CapabilitySet::SYS_RESOURCE)
    .union(CapabilitySet::DAC_READ_SEARCH)
    .union(CapabilitySet::DAC_OVERRIDE)
    .union(CapabilitySet::SETUID)
    .union(CapabilitySet::SETGID)
    .union(CapabilitySet::KILL);

/// What the helper refuses to start without, with their names
/// (capabilities(7)): the tools' uid and gid.
pub const REQUIRED: [(CapabilitySet, &str); 2] = [
    (CapabilitySet::SETUID, "CAP_SETUID"),
    (CapabilitySet::SETGID, "CAP_SETGID"),
];

/// What the serving process keeps: mount, umount and the NVMe admin ioctl
/// need `CAP_SYS_ADMIN`, nothing there needs more.
pub const SERVING: CapabilitySet = CapabilitySet::SYS_ADMIN;

/// Why hardening failed; the helper refuses to start then.
#[derive(Debug, thiserror::Error)]
pub enum HardenError {
    /// A capability set could not be read or changed.
    #[error("capabilities: {0}")]
    Capabilities(#[from] Errno),
    /// The helper was started without a capability it cannot run tools
    /// without ([`REQUIRED`]), named.
    #[error("{0} is not permitted: every tool runs as --tool-uid and --tool-gid")]
    Missing(&'static str),
    /// `PR_SET_NO_NEW_PRIVS` or `PR_SET_DUMPABLE` failed.
    #[error("no_new_privs or dumpable: {0}")]
    NoNewPrivs(io::Error),
    /// The seccomp policy did not compile or install.
    #[error("seccomp: {0}")]
    Seccomp(String),
}

/// Whether the helper holds every capability of [`REQUIRED`] permitted;
/// asked before anything changes.
///
/// # Errors
/// [`HardenError::Missing`] naming the first it does not hold,
/// [`HardenError::Capabilities`] when the sets cannot be read.
pub fn require_capabilities() -> Result<(), HardenError> {
    let permitted = rustix::thread::capabilities(None)?.permitted;
    match REQUIRED.into_iter().find(|(c, _)| !permitted.contains(*c)) {
        Some((_, name)) => Err(HardenError::Missing(name)),
        None => Ok(()),
    }
}

/// Drops every capability but [`KEPT`] from the bounding set, clears the
/// inheritable and ambient sets, and sets permitted and effective to what
/// remains of [`KEPT`].
///
/// # Errors
/// [`HardenError::Capabilities`].
pub fn reduce_capabilities() -> Result<(), HardenError> {
    for capability in CapabilitySet::all().difference(KEPT).iter() {
        // A capability newer than the kernel (EINVAL) is in no set.
        match rustix::thread::capability_is_in_bounding_set(capability) {
            Ok(true) => rustix::thread::remove_capability_from_bounding_set(capability)?,
            Ok(false) | Err(Errno::INVAL) => {}
            Err(e) => return Err(e.into()),
        }
    }
    rustix::thread::clear_ambient_capability_set()?;
    keep_only(KEPT)
}

/// Keeps only [`SERVING`] in the calling thread's effective and permitted
/// sets. Capabilities are per thread: call it after the runner is forked
/// (it keeps [`KEPT`] for the tools) and before the helper starts any
/// thread, so that every thread of the serving process has it.
///
/// # Errors
/// [`HardenError::Capabilities`].
pub fn keep_only_serving() -> Result<(), HardenError> {
    keep_only(SERVING)
}

/// Sets the calling thread's effective and permitted sets to what it holds
/// of `wanted`, and its inheritable set empty.
fn keep_only(wanted: CapabilitySet) -> Result<(), HardenError> {
    let kept = rustix::thread::capabilities(None)?.permitted & wanted;
    let sets = CapabilitySets {
        effective: kept,
        permitted: kept,
        inheritable: CapabilitySet::empty(),
    };
    Ok(rustix::thread::set_capabilities(None, sets)?)
}

/// Sets `PR_SET_NO_NEW_PRIVS` (no exec can gain privileges again) and
/// makes the helper not dumpable (`PR_SET_DUMPABLE` 0): a process of the
/// same uid whose capabilities are a superset of a helper thread's — a
/// growth tool with `CAP_SYS_ADMIN` and `CAP_DAC_READ_SEARCH` — could
/// otherwise open `/proc/<helper>/mem` (ptrace(2), "Ptrace access mode
/// checking"; no Yama needed).
///
/// # Errors
/// [`HardenError::NoNewPrivs`].
pub fn forbid_new_privileges() -> Result<(), HardenError> {
    rustix::thread::set_no_new_privs(true).map_err(|e| HardenError::NoNewPrivs(e.into()))?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| HardenError::NoNewPrivs(e.into()))
}

/// The seccomp policy, kept as data with a reason per system call.
const POLICY: &str = include_str!("../policy/seccomp.json");

/// Calls of the policy that only x86_64's older system call table has;
/// aarch64 and riscv64 never had them (their libc uses `ppoll`,
/// `readlinkat`, `fchmodat` and `utimensat`, which the policy also lists),
/// so the policy leaves them out there.
pub const X86_64_ONLY: [&str; 6] = ["poll", "readlink", "chmod", "utime", "utimes", "futimesat"];

/// The compiled filters of the policy.
#[derive(Debug)]
pub struct Filters {
    /// The allowlist of the serving thread and its connection threads.
    pub serving: BpfProgram,
    /// The denylist each tool child installs before it execs: no tool
    /// mounts, enters a namespace, loads a module or touches another
    /// process. [`TOOLS_PREFIX`] comes first.
    pub tools: BpfProgram,
}

/// `__X32_SYSCALL_BIT` (arch/x86/include/uapi/asm/unistd.h): x32 system
/// calls carry x86_64's audit arch with this bit set in their number, so a
/// denylist keyed on x86_64's numbers would let their x32 twins through on
/// kernels built with `CONFIG_X86_X32_ABI` (seccompiler checks the arch
/// only). No other architecture's numbers reach it.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `clone3` (435 in the generic and x86_64 tables alike): its flags are in
/// memory, out of a filter's reach.
const CLONE3: u32 = 435;

/// The instructions before the tools' denylist: any x32 system call fails
/// with `EPERM`, and `clone3` with `ENOSYS`, so that glibc falls back to
/// `clone`, whose namespace flags the denylist does see (glibc
/// `sysdeps/unix/sysv/linux/clone-internal.c` retries only on `ENOSYS`).
/// Anything else falls through to the denylist's first instruction. BPF
/// jumps are relative and forward, so the denylist runs unchanged after it.
pub const TOOLS_PREFIX: [sock_filter; 5] = [
    bpf(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0), // seccomp_data.nr
    bpf(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, 0, 1, X32_SYSCALL_BIT),
    bpf(
        libc::BPF_RET | libc::BPF_K,
        0,
        0,
        libc::SECCOMP_RET_ERRNO | libc::EPERM.unsigned_abs(),
    ),
    bpf(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 1, CLONE3),
    bpf(
        libc::BPF_RET | libc::BPF_K,
        0,
        0,
        libc::SECCOMP_RET_ERRNO | libc::ENOSYS.unsigned_abs(),
    ),
];

/// One BPF instruction (linux/filter.h `BPF_STMT` / `BPF_JUMP`).
#[allow(clippy::cast_possible_truncation, reason = "BPF opcodes are 16 bits")]
const fn bpf(code: u32, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Compiles the policy for this architecture.
///
/// # Errors
/// [`HardenError::Seccomp`] when the policy does not compile.
pub fn seccomp_filters() -> Result<Filters, HardenError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| HardenError::Seccomp(format!("{e:?}")))?;
    seccomp_filters_for(arch)
}

/// Compiles the policy for `arch` (seccompiler resolves names with that
/// architecture's table, so any architecture compiles on any build host).
///
/// # Errors
/// [`HardenError::Seccomp`] when the policy does not compile.
pub fn seccomp_filters_for(arch: TargetArch) -> Result<Filters, HardenError> {
    let invalid = |e: &dyn std::fmt::Display| HardenError::Seccomp(e.to_string());
    let mut policy: serde_json::Value = serde_json::from_str(POLICY).map_err(|e| invalid(&e))?;
    if arch != TargetArch::x86_64 {
        let filters = policy.as_object_mut().into_iter().flat_map(|map| map.values_mut());
        for calls in filters.filter_map(|f| f.get_mut("filter").and_then(serde_json::Value::as_array_mut)) {
            calls.retain(|rule| !X86_64_ONLY.iter().any(|name| rule["syscall"] == *name));
        }
    }
    let json = serde_json::to_vec(&policy).map_err(|e| invalid(&e))?;
    let mut filters: HashMap<String, BpfProgram> =
        seccompiler::compile_from_json(json.as_slice(), arch).map_err(|e| invalid(&e))?;
    let mut take = |name: &str| {
        filters
            .remove(name)
            .ok_or_else(|| HardenError::Seccomp(format!("the policy has no {name:?} filter")))
    };
    let serving = take("serving")?;
    let tools = TOOLS_PREFIX.into_iter().chain(take("tools")?).collect();
    Ok(Filters { serving, tools })
}

/// Installs `serving` on the calling thread; threads it spawns inherit it.
/// A system call outside the list fails with `EPERM`.
///
/// # Errors
/// [`HardenError::Seccomp`].
pub fn install_seccomp(serving: &BpfProgram) -> Result<(), HardenError> {
    seccompiler::apply_filter(serving).map_err(|e| HardenError::Seccomp(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn the_policy_compiles_and_refuses_what_it_does_not_list() {
        let program = seccomp_filters().unwrap().serving;
        let outcome = std::thread::spawn(move || {
            seccompiler::apply_filter(&program).unwrap();
            // Listed: reading a file.
            let listed = std::fs::read_to_string("/proc/self/mountinfo").is_ok();
            // Not listed: an IPv4 socket, a ptrace, a reboot-class call.
            let socket = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.raw_os_error());
            let chroot = rustix::process::chroot("/").map_err(|e| Some(e.raw_os_error()));
            // Listed with arguments: BLKGETDISKSEQ reaches the kernel (which
            // answers ENOTTY for /dev/null), another ioctl does not, nor a
            // lazy unmount.
            let null = std::fs::File::open("/dev/null").unwrap();
            let listed_ioctl = crate::sys::disk_sequence(std::os::fd::AsFd::as_fd(&null));
            let sector_size = rustix::fs::ioctl_blksszget(&null).map_err(|e| e.raw_os_error());
            let lazy = rustix::mount::unmount("/nonexistent", rustix::mount::UnmountFlags::DETACH)
                .map_err(|e| e.raw_os_error());
            (
                listed,
                socket.err(),
                chroot.err(),
                listed_ioctl.ok(),
                sector_size.err(),
                lazy.err(),
            )
        })
        .join()
        .unwrap();
        assert_eq!(
            outcome,
            (true, Some(Some(1)), Some(Some(1)), Some(None), Some(1), Some(1)),
            "(listed works, EPERM, EPERM, ENOTTY as no sequence, EPERM, EPERM)"
        );
    }

    /// T16 of the helper audit: the helper must start on Graviton (aarch64)
    /// and riscv64 too, whatever machine builds it.
    #[test]
    fn the_policy_compiles_for_every_architecture_seccompiler_knows() {
        for arch in [TargetArch::x86_64, TargetArch::aarch64, TargetArch::riscv64] {
            let filters = seccomp_filters_for(arch).unwrap_or_else(|e| panic!("{arch:?}: {e}"));
            assert!(
                filters.serving.len() > 50,
                "{arch:?}: {} instructions",
                filters.serving.len()
            );
            assert!(
                filters.tools.len() > 30,
                "{arch:?}: {} instructions",
                filters.tools.len()
            );
        }
    }

    /// The tools' denylist lets a tool read and write files and ask its own
    /// limits but not mount, change its root, make a namespace, use
    /// io_uring or x32 calls, change a file's mode, make a socket, signal a
    /// process (itself included), change another's limits or freeze a
    /// filesystem (third audit A1, A11).
    #[test]
    #[allow(unsafe_code, reason = "raw system calls that the filter must refuse")]
    fn the_tools_filter_denies_what_no_tool_needs() {
        let program = seccomp_filters().unwrap().tools;
        let outcome = std::thread::spawn(move || {
            seccompiler::apply_filter(&program).unwrap();
            let reads = std::fs::read_to_string("/proc/self/status").is_ok();
            let umount = rustix::mount::unmount("/nonexistent", rustix::mount::UnmountFlags::empty())
                .map_err(|e| e.raw_os_error());
            let chroot = rustix::process::chroot("/").map_err(|e| e.raw_os_error());
            // Each call below would fail anyway if it reached the kernel,
            // with another errno than the filter's: a new user namespace
            // with CLONE_THREAD (EINVAL), clone3 without arguments (EFAULT
            // or EINVAL), io_uring without parameters (EFAULT), x32's
            // getpid (ENOSYS without x32, a pid with it).
            let raw = |nr: libc::c_long, a: libc::c_long, b: libc::c_long| {
                // SAFETY: the arguments are integers; the kernel reads no
                // memory through them, because every call fails first.
                let result = unsafe { libc::syscall(nr, a, b, 0, 0, 0) };
                (result == -1).then(|| std::io::Error::last_os_error().raw_os_error().unwrap_or_default())
            };
            let new_user = raw(
                libc::SYS_clone,
                libc::c_long::from(libc::CLONE_NEWUSER | libc::CLONE_THREAD),
                0,
            );
            let clone3 = raw(libc::SYS_clone3, 0, 0);
            let io_uring = raw(libc::SYS_io_uring_setup, 1, 0);
            let x32 = raw(libc::c_long::from(X32_SYSCALL_BIT) | libc::SYS_getpid, 0, 0);
            // Without the filter: ENOENT, a socket, 0, 0, 0 and ENOTTY.
            let own = libc::c_long::from(rustix::process::getpid().as_raw_nonzero().get());
            let null = std::fs::File::open("/dev/null").unwrap();
            let denied = (
                rustix::fs::chmod("/nonexistent", rustix::fs::Mode::RWXU)
                    .map_err(|e| e.raw_os_error())
                    .err(),
                raw(
                    libc::SYS_socket,
                    libc::c_long::from(libc::AF_UNIX),
                    libc::c_long::from(libc::SOCK_STREAM),
                ),
                raw(libc::SYS_kill, own, 0),
                raw(libc::SYS_prlimit64, own, libc::c_long::from(libc::RLIMIT_NOFILE)),
                raw(libc::SYS_ioctl, libc::c_long::from(null.as_raw_fd()), 0xC004_5877),
            );
            let own_limits = raw(libc::SYS_prlimit64, 0, libc::c_long::from(libc::RLIMIT_NOFILE));
            (
                reads,
                umount.err(),
                chroot.err(),
                new_user,
                clone3,
                io_uring,
                x32,
                denied,
                own_limits,
            )
        })
        .join()
        .unwrap();
        let (eperm, enosys) = (Some(libc::EPERM), Some(libc::ENOSYS));
        assert_eq!(
            outcome,
            (
                true,
                Some(1),
                Some(1),
                eperm,
                enosys,
                eperm,
                eperm,
                (eperm, eperm, eperm, eperm, eperm),
                None
            ),
            "(reads, EPERM, EPERM, EPERM, ENOSYS, EPERM, EPERM, (chmod, socket, kill, prlimit, FIFREEZE: EPERM), \
             its own limits)"
        );
    }
}
