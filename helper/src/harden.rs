//! Least privilege, applied at start-up (`docs/helper.md`, steps 1–7).

use std::collections::HashMap;
use std::io;

use caps::{CapSet, Capability, CapsHashSet};
use seccompiler::{BpfProgram, TargetArch};

/// The capabilities the helper keeps, and why:
/// - `CAP_SYS_ADMIN`: `mount(2)`, `umount2(2)`, the NVMe admin ioctl, and
///   `xfs_growfs` (XFS_IOC_FSGROWFSDATA);
/// - `CAP_SYS_RESOURCE`: online ext4 growth by `resize2fs`
///   (`ext4_resize_begin` checks it).
///
/// Tools inherit exactly these (root's exec keeps the bounding set, and
/// `no_new_privs` caps it at the helper's permitted set).
pub const KEPT: [Capability; 2] = [Capability::CAP_SYS_ADMIN, Capability::CAP_SYS_RESOURCE];

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

/// Sets `PR_SET_NO_NEW_PRIVS`: no exec can gain privileges again.
///
/// # Errors
/// [`HardenError::NoNewPrivs`].
pub fn forbid_new_privileges() -> Result<(), HardenError> {
    rustix::thread::set_no_new_privs(true).map_err(|e| HardenError::NoNewPrivs(e.into()))
}

/// The seccomp policy, kept as data with a reason per system call.
const POLICY: &str = include_str!("../seccomp.json");

/// Compiles the serving threads' allowlist for this architecture.
///
/// # Errors
/// [`HardenError::Seccomp`] when the policy does not compile.
pub fn seccomp_program() -> Result<BpfProgram, HardenError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| HardenError::Seccomp(format!("{e:?}")))?;
    let mut filters: HashMap<String, BpfProgram> =
        seccompiler::compile_from_json(POLICY.as_bytes(), arch).map_err(|e| HardenError::Seccomp(e.to_string()))?;
    filters
        .remove("serving")
        .ok_or_else(|| HardenError::Seccomp("the policy has no \"serving\" filter".into()))
}

/// Installs the allowlist on the calling thread; threads it spawns inherit
/// it. A system call outside the list fails with `EPERM`.
///
/// # Errors
/// [`HardenError::Seccomp`].
pub fn install_seccomp() -> Result<(), HardenError> {
    seccompiler::apply_filter(&seccomp_program()?).map_err(|e| HardenError::Seccomp(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_compiles_and_refuses_what_it_does_not_list() {
        let program = seccomp_program().unwrap();
        let outcome = std::thread::spawn(move || {
            seccompiler::apply_filter(&program).unwrap();
            // Listed: reading a file.
            let listed = std::fs::read_to_string("/proc/self/mountinfo").is_ok();
            // Not listed: an IPv4 socket, a ptrace, a reboot-class call.
            let socket = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.raw_os_error());
            let chroot = rustix::process::chroot("/").map_err(|e| Some(e.raw_os_error()));
            (listed, socket.err(), chroot.err())
        })
        .join()
        .unwrap();
        assert_eq!(
            outcome,
            (true, Some(Some(1)), Some(Some(1))),
            "(listed works, EPERM, EPERM)"
        );
    }
}
