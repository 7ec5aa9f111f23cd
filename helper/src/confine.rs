//! What each tool may open: a Landlock ruleset per exec (landlock(7)).
//!
//! A tool runs as a uid of its own but holds `CAP_DAC_READ_SEARCH` (blkid)
//! or `CAP_DAC_OVERRIDE` (mkfs) to open its root-owned device node: without
//! a ruleset a tool taken over through a hostile image could read
//! `/etc/shadow`, rewrite `/etc/passwd` or a binary, or open another disk
//! (the re-audit's N3, the third audit's A1). Under its ruleset a tool may read and execute the
//! system's programs and libraries, read the few files of `/etc` the tools
//! read (the dynamic loader's, `mke2fs.conf`, XFS's project files: nothing
//! else of `/etc`, so not `/etc/shadow`, third audit A1), read `/proc` and
//! `/sys`, list `/dev`, use `/dev/null` and the random devices — the paths
//! and rights of the policy `helper/policy/landlock.json`, each with why —
//! and open the one objects it acts on — the verified device (blkid and `xfs_growfs`
//! read it, mkfs writes it), and for `xfs_growfs` the verified mount's root
//! — and nothing else. Where the kernel has them (Landlock ABI 4 and 6), it
//! may also neither bind nor connect a TCP socket, signal a process outside
//! its own domain (the helper, kubelet, any other root process) nor connect
//! to an abstract unix socket made outside it; the tools' seccomp filter
//! denies sockets and signals on any kernel (`helper/policy/seccomp.json`).

use std::collections::BTreeMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::LazyLock;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, PathBeneath, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
};
use rustix::fs::{Mode, OFlags};
use serde::Deserialize;

use crate::exec::Tool;

/// The newest Landlock ABI the tests run on (Linux 6.18: ABI 7). Every
/// filesystem and network right and every scope it knows is handled —
/// denied unless a rule allows it — as far as the running kernel knows it
/// (the `landlock` crate's best-effort compatibility: ABI 1 has 13
/// filesystem rights, 2 adds `REFER`, 3 `TRUNCATE`, 4 TCP's bind and
/// connect, 5 `IOCTL_DEV`, 6 the signal and abstract unix socket scopes;
/// landlock(7)).
const HANDLED: ABI = ABI::V7;

/// The policy as reviewed data: the system's paths every tool may open,
/// the rights on each and why.
const POLICY_TEXT: &str = include_str!("../policy/landlock.json");

/// The system's paths and the rights on each.
type SystemPaths = Vec<(String, BitFlags<AccessFs>)>;

/// [`SystemPaths`], parsed once; [`check_policy`] at start stops a helper
/// whose policy does not parse.
static SYSTEM: LazyLock<Result<SystemPaths, String>> = LazyLock::new(|| system_paths(POLICY_TEXT));

/// helper/policy/landlock.json (its `about` is for the reader).
#[derive(Debug, Deserialize)]
struct Text {
    paths: BTreeMap<String, Rule>,
}

/// One path's rights, by the landlock crate's `AccessFs` names, and why.
#[derive(Debug, Deserialize)]
struct Rule {
    rights: Vec<String>,
    why: String,
}

/// The paths and rights `text` gives.
///
/// # Errors
/// The JSON error, a right Landlock does not have, or a path allowed
/// without a reason.
fn system_paths(text: &str) -> Result<SystemPaths, String> {
    let text: Text = serde_json::from_str(text).map_err(|e| e.to_string())?;
    text.paths
        .into_iter()
        .map(|(path, rule)| {
            if rule.why.trim().is_empty() {
                return Err(format!("{path} is allowed without a reason"));
            }
            let rights = rule
                .rights
                .iter()
                .map(|name| {
                    AccessFs::from_all(HANDLED)
                        .iter()
                        .find(|right| format!("{right:?}") == *name)
                        .ok_or_else(|| format!("{path}: {name:?} is not a Landlock right"))
                })
                .collect::<Result<BitFlags<AccessFs>, String>>()?;
            Ok((path, rights))
        })
        .collect()
}

/// Parses the Landlock policy, so that one that does not parse stops the
/// helper at start.
///
/// # Errors
/// Why it does not parse.
pub fn check_policy() -> Result<(), String> {
    SYSTEM.as_ref().map(drop).map_err(Clone::clone)
}

/// The rights `tool` has on the verified device.
fn on_device(tool: Tool) -> BitFlags<AccessFs> {
    match tool {
        Tool::Blkid | Tool::XfsGrowfs => AccessFs::ReadFile | AccessFs::IoctlDev,
        Tool::MkfsExt2 | Tool::MkfsExt3 | Tool::MkfsExt4 | Tool::MkfsXfs => {
            AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev
        }
    }
}

/// The ruleset `tool` execs under, acting on `device` and, for
/// `xfs_growfs`, on the mount's root `mount_root`; the child enforces it
/// right before the exec. `None` where the kernel has no Landlock (not
/// built in, or not enabled in `lsm=`): the tool runs without a ruleset,
/// as the helper says at start ([`available`]).
///
/// # Errors
/// The error opening a system directory (one that does not exist is left
/// out), creating the ruleset or adding a rule.
pub fn ruleset(
    tool: Tool,
    device: BorrowedFd<'_>,
    mount_root: Option<BorrowedFd<'_>>,
) -> Result<Option<OwnedFd>, Box<dyn std::error::Error + Send + Sync>> {
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(HANDLED))?
        .handle_access(AccessNet::from_all(HANDLED))?
        .scope(Scope::from_all(HANDLED))?
        .create()?;
    for (path, rights) in SYSTEM.as_ref().map_err(Clone::clone)? {
        match rustix::fs::open(path.as_str(), OFlags::PATH | OFlags::CLOEXEC, Mode::empty()) {
            Ok(fd) => ruleset = ruleset.add_rule(PathBeneath::new(fd, *rights))?,
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    ruleset = ruleset.add_rule(PathBeneath::new(device, on_device(tool)))?;
    if let Some(root) = mount_root {
        // Open it, nothing beneath it.
        ruleset = ruleset.add_rule(PathBeneath::new(root, AccessFs::ReadDir))?;
    }
    Ok(ruleset.into())
}

/// Whether the running kernel enforces Landlock, asked at start (the
/// serving thread's seccomp filter does not allow the question).
pub fn available() -> bool {
    let created = Ruleset::default()
        .handle_access(AccessFs::from_all(HANDLED))
        .and_then(Ruleset::create);
    created.is_ok_and(|ruleset| Option::<OwnedFd>::from(ruleset).is_some())
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd};

    use super::*;

    /// The shipped policy parses; one that names a right Landlock does not
    /// have or allows a path without a reason is no policy.
    #[test]
    fn the_policy_parses_and_a_wrong_one_is_refused_whole() {
        check_policy().unwrap();
        let paths = system_paths(POLICY_TEXT).unwrap();
        assert!(paths.contains(&("/etc/mke2fs.conf".to_owned(), BitFlags::from(AccessFs::ReadFile))));
        let wrong = POLICY_TEXT.replace("\"Execute\"", "\"Run\"");
        assert_eq!(
            system_paths(&wrong).unwrap_err(),
            "/bin: \"Run\" is not a Landlock right"
        );
        let unexplained = POLICY_TEXT.replace("\"the dynamic loader's cache\"", "\" \"");
        assert_eq!(
            system_paths(&unexplained).unwrap_err(),
            "/etc/ld.so.cache is allowed without a reason"
        );
    }

    /// As any user: a thread under blkid's ruleset reads the system's
    /// files and its device, and cannot write either, read the rest of
    /// `/etc` or open a file beside the device; nor signal a process
    /// outside its domain or connect over TCP.
    #[test]
    #[allow(unsafe_code, reason = "landlock_restrict_self, as the tool's child makes it")]
    fn a_tool_opens_the_system_and_its_device_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let (device, other) = (dir.path().join("device"), dir.path().join("other"));
        std::fs::write(&other, b"x").unwrap();
        let file = std::fs::File::create(&device).unwrap();
        let ruleset = ruleset(Tool::Blkid, file.as_fd(), None)
            .unwrap()
            .expect("Landlock in this machine's kernel");
        let mut outside = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let outside_pid = rustix::process::Pid::from_child(&outside);
        let confined = std::thread::spawn(move || {
            rustix::thread::set_no_new_privs(true).unwrap();
            // SAFETY: integers only.
            let result = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) };
            assert_eq!(result, 0, "{}", std::io::Error::last_os_error());
            let read = |path: &std::path::Path| std::fs::File::open(path).is_ok();
            let write = |path: &std::path::Path| std::fs::OpenOptions::new().append(true).open(path).is_ok();
            let (conf, passwd) = (
                std::path::Path::new("/etc/mke2fs.conf"),
                std::path::Path::new("/etc/passwd"),
            );
            let opened = (
                read(conf),
                read(passwd),
                write(passwd),
                read(&device),
                write(&device),
                read(&other),
            );
            let signal = rustix::process::test_kill_process(outside_pid).map_err(|e| e.raw_os_error());
            let tcp = std::net::TcpStream::connect("127.0.0.1:9").map_err(|e| e.raw_os_error());
            (opened, signal.err(), tcp.err().flatten())
        })
        .join()
        .unwrap();
        outside.kill().unwrap();
        outside.wait().unwrap();
        assert_eq!(
            confined,
            (
                (true, false, false, true, false, false),
                Some(libc::EPERM),
                Some(libc::EACCES)
            ),
            "(read /etc/mke2fs.conf, read and write /etc/passwd, read and write the device, read another file), \
             signal a process outside, TCP connect"
        );
    }
}
