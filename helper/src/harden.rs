//! Least privilege, applied at start-up (`docs/helper.md`, steps 1–7).

use std::collections::HashMap;
use std::io;

use caps::{CapSet, Capability, CapsHashSet};
use seccompiler::{BpfProgram, TargetArch};

/// The capabilities the helper keeps, and why:
/// - `CAP_SYS_ADMIN`: `mount(2)`, `umount2(2)`, the NVMe admin ioctl, and
///   `xfs_growfs` (XFS_IOC_FSGROWFSDATA);
/// - `CAP_SYS_RESOURCE`: online ext4 growth by `resize2fs`
///   (`ext4_resize_begin` checks it);
/// - `CAP_DAC_READ_SEARCH`: `resize2fs` and `xfs_growfs` open the mounted
///   filesystem's root directory (e2fsprogs resize/online.c, xfsprogs
///   growfs), which its owner may have made unreadable to others.
///
/// Only the executor threads keep all three ([`keep_only_serving`] drops
/// the last two on the serving thread after they start); each tool child sets
/// its own to what it needs ([`crate::exec::Tool::capabilities`]) before
/// it execs, and `no_new_privs` keeps the exec from adding any.
pub const KEPT: [Capability; 3] = [
    Capability::CAP_SYS_ADMIN,
    Capability::CAP_SYS_RESOURCE,
    Capability::CAP_DAC_READ_SEARCH,
];

/// What the serving thread and its connection threads keep: mount, umount
/// and the NVMe admin ioctl need `CAP_SYS_ADMIN`, nothing there needs more.
pub const SERVING: Capability = Capability::CAP_SYS_ADMIN;

/// Why hardening failed; the helper refuses to start then.
#[derive(Debug, thiserror::Error)]
pub enum HardenError {
    /// A capability set could not be changed.
    #[error("capabilities: {0}")]
    Capabilities(#[from] caps::errors::CapsError),
    /// `PR_SET_NO_NEW_PRIVS` failed.
    #[error("no_new_privs: {0}")]
    NoNewPrivs(io::Error),
    /// The seccomp policy did not compile or install.
    #[error("seccomp: {0}")]
    Seccomp(String),
}

/// Drops every capability but [`KEPT`] from the bounding set, clears the
/// inheritable and ambient sets, and sets permitted and effective to what
/// remains of [`KEPT`].
///
/// # Errors
/// [`HardenError::Capabilities`].
pub fn reduce_capabilities() -> Result<(), HardenError> {
    for capability in caps::all() {
        if !KEPT.contains(&capability) && caps::has_cap(None, CapSet::Bounding, capability)? {
            caps::drop(None, CapSet::Bounding, capability)?;
        }
    }
    caps::clear(None, CapSet::Ambient)?;
    caps::clear(None, CapSet::Inheritable)?;
    let permitted = caps::read(None, CapSet::Permitted)?;
    let kept: CapsHashSet = KEPT.into_iter().filter(|c| permitted.contains(c)).collect();
    caps::set(None, CapSet::Effective, &kept)?;
    caps::set(None, CapSet::Permitted, &kept)?;
    Ok(())
}

/// Keeps only [`SERVING`] in the calling thread's effective and permitted
/// sets. Capabilities are per thread: call it after the executor threads
/// have started (they keep [`KEPT`] for the tools) and before the serving
/// thread starts any other.
///
/// # Errors
/// [`HardenError::Capabilities`].
pub fn keep_only_serving() -> Result<(), HardenError> {
    let permitted = caps::read(None, CapSet::Permitted)?;
    let kept: CapsHashSet = [SERVING].into_iter().filter(|c| permitted.contains(c)).collect();
    caps::set(None, CapSet::Effective, &kept)?;
    caps::set(None, CapSet::Permitted, &kept)?;
    Ok(())
}

/// Sets `PR_SET_NO_NEW_PRIVS`: no exec can gain privileges again.
///
/// # Errors
/// [`HardenError::NoNewPrivs`].
pub fn forbid_new_privileges() -> Result<(), HardenError> {
    rustix::thread::set_no_new_privs(true).map_err(|e| HardenError::NoNewPrivs(e.into()))
}

/// The seccomp policy, kept as data with a reason per system call.
const POLICY: &str = include_str!("../seccomp.json");

/// Calls of the policy that only x86_64's older system call table has;
/// aarch64 and riscv64 never had them (their libc uses `ppoll` and
/// `readlinkat`, which the policy also lists), so the policy leaves them
/// out there.
pub const X86_64_ONLY: [&str; 2] = ["poll", "readlink"];

/// The compiled filters of the policy.
#[derive(Debug)]
pub struct Filters {
    /// The allowlist of the serving thread and its connection threads.
    pub serving: BpfProgram,
    /// The denylist each tool child installs before it execs: no tool
    /// mounts, enters a namespace, loads a module or touches another
    /// process.
    pub tools: BpfProgram,
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
    Ok(Filters {
        serving: take("serving")?,
        tools: take("tools")?,
    })
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

    /// The tools' denylist lets a tool read and write files but not mount
    /// or change its root.
    #[test]
    fn the_tools_filter_denies_what_no_tool_needs() {
        let program = seccomp_filters().unwrap().tools;
        let outcome = std::thread::spawn(move || {
            seccompiler::apply_filter(&program).unwrap();
            let reads = std::fs::read_to_string("/proc/self/status").is_ok();
            let umount = rustix::mount::unmount("/nonexistent", rustix::mount::UnmountFlags::empty())
                .map_err(|e| e.raw_os_error());
            let chroot = rustix::process::chroot("/").map_err(|e| e.raw_os_error());
            (reads, umount.err(), chroot.err())
        })
        .join()
        .unwrap();
        assert_eq!(outcome, (true, Some(1), Some(1)), "(reads, EPERM, EPERM)");
    }
}
