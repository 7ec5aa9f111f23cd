//! `ebs-csi-agent plugin-dir` as the node DaemonSet's init container runs
//! it: root holding CAP_CHOWN alone gives kubelet's plugin directory
//! (root's, 0755, as `hostPath` `DirectoryOrCreate` makes it) to the agent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use ebs_csi_tests::{Sandbox, binary, require_root};

/// Runs the subcommand on `path` as root whose bounding set is `bounding`
/// (setpriv(1) syntax), with no_new_privs; returns success and stderr.
fn plugin_dir(path: &Path, bounding: &str) -> (bool, String) {
    let out = Command::new("setpriv")
        .args([bounding, "--no-new-privs", "--"])
        .arg(binary("ebs-csi-agent"))
        .args(["plugin-dir", "--uid=990", "--gid=990"])
        .arg(path)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn owner(path: &Path) -> (u32, u32, u32) {
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn the_plugin_directory_goes_to_the_agent_and_nothing_else_does() {
    require_root();
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("plugins/ebs.csi.aws.com");
    std::fs::create_dir_all(&dir).unwrap();
    let other = sandbox.path().join("plugins/other.csi.example.com");
    std::fs::create_dir_all(&other).unwrap();
    let link = sandbox.path().join("plugins/link");
    std::os::unix::fs::symlink(&other, &link).unwrap();
    for made in [&dir, &other] {
        std::fs::set_permissions(made, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let file = sandbox.path().join("plugins/file");
    std::fs::write(&file, "").unwrap();

    // Without CAP_CHOWN: EPERM, nothing changed.
    let (ok, stderr) = plugin_dir(&dir, "--bounding-set=-all");
    assert!(!ok);
    assert!(
        stderr.ends_with(&format!(
            "giving {} to 990:990\n\nCaused by:\n    Operation not permitted (os error 1)\n",
            dir.display()
        )),
        "{stderr}"
    );
    assert_eq!(owner(&dir), (0, 0, 0o755));

    // A symlink or a file in its place: ENOTDIR, neither it nor its target
    // changed.
    for path in [&link, &file] {
        let (ok, stderr) = plugin_dir(path, "--bounding-set=-all,+chown");
        assert!(!ok);
        assert!(
            stderr.ends_with("\n\nCaused by:\n    Not a directory (os error 20)\n"),
            "{stderr}"
        );
    }
    assert_eq!(owner(&other), (0, 0, 0o755));
    assert_eq!(owner(&file).0, 0);

    // CAP_CHOWN alone, as the init container has it: the agent's now,
    // mode untouched.
    let (ok, stderr) = plugin_dir(&dir, "--bounding-set=-all,+chown");
    assert!(ok, "{stderr}");
    assert_eq!(owner(&dir), (990, 990, 0o755));
}
