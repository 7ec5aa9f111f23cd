//! Mount options that real StorageClasses carry reach the kernel through
//! the helper's real mount(2) on loop devices.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use ebs_csi_helper_proto::{FsType, Reply};
use ebs_csi_tests::guest::super_options;
use ebs_csi_tests::{Helper, LoopVolume, Sandbox, require_root, stage_request};

fn staged_options(fs_type: FsType, mount_flags: &[&str]) -> String {
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let volume = LoopVolume::create(sandbox.path(), "vol-0a000000000000011", 300);
    let staging = sandbox.mkdir("kubelet/staging/vol-0a000000000000011");
    let request = stage_request(&volume.volume_id, &volume.device, &staging, fs_type, mount_flags);
    assert_eq!(helper.call(request).unwrap(), Reply::Done);
    super_options(&staging)
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
