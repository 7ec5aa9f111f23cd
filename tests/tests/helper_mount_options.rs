//! Mount options that real StorageClasses carry reach the kernel through
//! the helper's real mount(2) on loop devices.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::path::Path;

use ebs_csi_helper::mount::EXT_ERRORS_DEFAULT;
use ebs_csi_helper_proto::{FsType, Reply};
use ebs_csi_tests::guest::super_options;
use ebs_csi_tests::loopdev::run;
use ebs_csi_tests::{Helper, LoopVolume, Sandbox, require_root, stage_request};

/// Stages a 300 MiB loop volume, first given to `prepare` (its device),
/// and returns what `read` finds at the staged mount.
fn staged<T>(
    fs_type: FsType,
    mount_flags: &[&str],
    prepare: impl FnOnce(&Path),
    read: impl FnOnce(&Path, &LoopVolume) -> T,
) -> T {
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let volume = LoopVolume::create(sandbox.path(), "vol-0a000000000000011", 300);
    prepare(&volume.device);
    let staging = sandbox.staging("vol-0a000000000000011");
    let request = stage_request(&volume.volume_id, &volume.device, &staging, fs_type, mount_flags);
    assert_eq!(helper.call(request).unwrap(), Reply::Done);
    read(&staging, &volume)
}

fn staged_options(fs_type: FsType, mount_flags: &[&str]) -> String {
    staged(fs_type, mount_flags, |_| {}, |staging, _| super_options(staging))
}

#[test]
fn ext4_commit_interval_and_quotas_reach_the_kernel() {
    if !require_root() {
        return;
    }
    let options = staged_options(FsType::Ext4, &["commit=60,usrquota", "grpquota", "noatime"]);
    let options: Vec<&str> = options.split(',').collect();
    for expected in ["commit=60", "usrquota", "grpquota"] {
        assert!(options.contains(&expected), "{expected} in {options:?}");
    }
}

#[test]
fn xfs_nouuid_asked_again_is_mounted_once() {
    if !require_root() {
        return;
    }
    let options = staged_options(FsType::Xfs, &["nouuid", "noatime"]);
    assert_eq!(options.split(',').filter(|o| *o == "nouuid").count(), 1, "{options}");
}

#[test]
fn selinux_context_is_left_out_where_selinux_is_not_enabled() {
    if !require_root() {
        return;
    }
    assert!(
        !std::path::Path::new("/sys/fs/selinux").exists(),
        "this test is for a node without SELinux"
    );
    // What kubelet passes when the CSIDriver has seLinuxMount (on a node
    // with SELinux; mount(8) drops it elsewhere, and so does the helper).
    let options = staged_options(
        FsType::Ext4,
        &["context=\"system_u:object_r:container_file_t:s0:c1,c2\""],
    );
    assert!(!options.contains("context"), "{options}");
}

/// N6 (`shared/reviews/helper-reaudit.md`, E9): a volume whose ext4
/// superblock asks for `errors=panic` (`tune2fs -e panic`) is mounted with
/// `errors=remount-ro`, or with `errors=continue` when the request asks it,
/// so an inconsistency planted in the image never panics the node. The
/// kernel's full list of the mount's options is
/// `/proc/fs/ext4/<device>/options` (mountinfo leaves defaults out).
#[test]
fn ext4_is_never_mounted_with_the_superblocks_errors_panic() {
    if !require_root() {
        return;
    }
    for (flags, expected) in [
        (&[][..], EXT_ERRORS_DEFAULT),
        (&["errors=continue"][..], "errors=continue"),
    ] {
        let options = staged(
            FsType::Ext4,
            flags,
            |device| {
                let device = device.to_string_lossy();
                run("mkfs.ext4", &["-q", &device]);
                run("tune2fs", &["-e", "panic", &device]);
                assert!(run("dumpe2fs", &["-h", &device]).contains("Errors behavior:          Panic"));
            },
            |_, volume| {
                let name = volume.device.file_name().unwrap().to_string_lossy().into_owned();
                std::fs::read_to_string(format!("/proc/fs/ext4/{name}/options")).unwrap()
            },
        );
        let errors: Vec<&str> = options.lines().filter(|o| o.starts_with("errors=")).collect();
        assert_eq!(errors, [expected], "{flags:?}");
    }
}
