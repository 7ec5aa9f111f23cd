//! Mount options that real StorageClasses carry reach the kernel through
//! the helper's real mount(2) on loop devices.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::path::Path;

use ebs_csi_helper::mount::EXT_ERRORS_DEFAULT;
use ebs_csi_helper_client::ClientError;
use ebs_csi_helper_proto::{FsType, HelperError, Reply, Request, UnstageRequest};
use ebs_csi_tests::guest::super_options;
use ebs_csi_tests::run;
use ebs_csi_tests::{Helper, LoopVolume, Sandbox, is_mounted, require_root, stage_request};

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
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn ext4_commit_interval_and_quotas_reach_the_kernel() {
    require_root();
    let options = staged_options(FsType::Ext4, &["commit=60,usrquota", "grpquota", "noatime"]);
    let options: Vec<&str> = options.split(',').collect();
    for expected in ["commit=60", "usrquota", "grpquota"] {
        assert!(options.contains(&expected), "{expected} in {options:?}");
    }
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn xfs_nouuid_asked_again_is_mounted_once() {
    require_root();
    let options = staged_options(FsType::Xfs, &["nouuid", "noatime"]);
    assert_eq!(options.split(',').filter(|o| *o == "nouuid").count(), 1, "{options}");
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn selinux_context_is_left_out_where_selinux_is_not_enabled() {
    require_root();
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
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn ext4_is_never_mounted_with_the_superblocks_errors_panic() {
    require_root();
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

/// What staging a volume with one option does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The volume is staged.
    Staged,
    /// The helper passes the option on and the kernel refuses it (EINVAL,
    /// its reason in the kernel log): nothing is mounted, the filesystem
    /// is untouched.
    KernelRefuses,
    /// A quota option of XFS: staged where the kernel has XFS quota
    /// support (CONFIG_XFS_QUOTA, which also makes /proc/fs/xfs/xqm:
    /// fs/xfs/xfs_stats.c), refused by the kernel elsewhere.
    XfsQuota,
}

use Outcome::{KernelRefuses, Staged, XfsQuota};

impl Outcome {
    /// The outcome this machine's kernel gives.
    fn here(self) -> Outcome {
        match self {
            XfsQuota if Path::new("/proc/fs/xfs/xqm").exists() => Staged,
            XfsQuota => KernelRefuses,
            other => other,
        }
    }
}

/// Every option mount(8) documents as filesystem-independent, every option
/// the kernel documents for the filesystem (Documentation/admin-guide/
/// ext4.rst and xfs.rst, "Mount Options"), and those the Go driver's users
/// carry in StorageClasses (aws-ebs-csi-driver issue #28's list: `exec`,
/// `async`, `nofail`, `_netdev`, …), staged one at a time on a loop device
/// with this machine's kernel (what the kernel refuses is its own judgement,
/// recorded here as Linux 6.18 gives it: `journal_async_commit` needs
/// `data=journal`, `nouser_xattr` and `noacl` are unknown to the kernel's
/// parser (mount(8) fails on them too), `prjquota` needs ext4's `project`
/// feature, `dax` a DAX device, XFS `norecovery` a read-only mount,
/// `sunit`/`swidth` a filesystem made with an alignment, the zone options
/// a zoned device; each says so in the kernel log). The refused options are
/// `helper/src/options_tests.rs`'s and `helper_hostile.rs`'s.
const GENERIC: [(&str, Outcome); 28] = [
    ("defaults", Staged),
    ("rw", Staged),
    ("ro", Staged),
    ("exec", Staged),
    ("noexec", Staged),
    ("async", Staged),
    ("sync", Staged),
    ("dirsync", Staged),
    ("atime", Staged),
    ("noatime", Staged),
    ("diratime", Staged),
    ("nodiratime", Staged),
    ("relatime", Staged),
    ("strictatime", Staged),
    ("nostrictatime", Staged),
    ("lazytime", Staged),
    ("nolazytime", Staged),
    ("nomand", Staged),
    ("loud", Staged),
    ("nosuid", Staged),
    ("nodev", Staged),
    ("nosymfollow", Staged),
    ("nofail", Staged),
    ("_netdev", Staged),
    ("auto", Staged),
    ("noauto", Staged),
    ("nouser", Staged),
    ("x-systemd.device-timeout=5s", Staged),
];

const EXT4: [(&str, Outcome); 63] = [
    ("barrier", Staged),
    ("barrier=0", Staged),
    ("barrier=1", Staged),
    ("nobarrier", Staged),
    ("journal_checksum", Staged),
    ("nojournal_checksum", Staged),
    ("journal_async_commit", KernelRefuses),
    ("norecovery", Staged),
    ("noload", Staged),
    ("user_xattr", Staged),
    ("nouser_xattr", KernelRefuses),
    ("acl", Staged),
    ("noacl", KernelRefuses),
    ("bsddf", Staged),
    ("minixdf", Staged),
    ("debug", Staged),
    ("grpid", Staged),
    ("bsdgroups", Staged),
    ("nogrpid", Staged),
    ("sysvgroups", Staged),
    ("quota", Staged),
    ("noquota", Staged),
    ("usrquota", Staged),
    ("grpquota", Staged),
    ("prjquota", KernelRefuses),
    ("delalloc", Staged),
    ("nodelalloc", Staged),
    ("auto_da_alloc", Staged),
    ("auto_da_alloc=0", Staged),
    ("noauto_da_alloc", Staged),
    ("init_itable", Staged),
    ("init_itable=10", Staged),
    ("noinit_itable", Staged),
    ("discard", Staged),
    ("nodiscard", Staged),
    ("nouid32", Staged),
    ("block_validity", Staged),
    ("noblock_validity", Staged),
    ("dioread_lock", Staged),
    ("dioread_nolock", Staged),
    ("i_version", Staged),
    ("dax", KernelRefuses),
    ("dax=never", Staged),
    ("prefetch_block_bitmaps", Staged),
    ("no_prefetch_block_bitmaps", Staged),
    ("nombcache", Staged),
    ("inlinecrypt", Staged),
    ("oldalloc", Staged),
    ("data=journal", Staged),
    ("data=ordered", Staged),
    ("data=writeback", Staged),
    ("errors=remount-ro", Staged),
    ("errors=continue", Staged),
    ("data_err=abort", Staged),
    ("commit=60", Staged),
    ("inode_readahead_blks=64", Staged),
    ("resgid=0", Staged),
    ("resuid=0", Staged),
    ("jqfmt=vfsv0,usrjquota=aquota.user", Staged),
    ("stripe=16", Staged),
    ("max_batch_time=15000", Staged),
    ("journal_ioprio=3", Staged),
    ("mb_optimize_scan=1", Staged),
];

const XFS: [(&str, Outcome); 43] = [
    ("attr2", Staged),
    ("noattr2", Staged),
    ("discard", Staged),
    ("nodiscard", Staged),
    ("grpid", Staged),
    ("bsdgroups", Staged),
    ("nogrpid", Staged),
    ("sysvgroups", Staged),
    ("filestreams", Staged),
    ("ikeep", Staged),
    ("noikeep", Staged),
    ("inode32", Staged),
    ("inode64", Staged),
    ("largeio", Staged),
    ("nolargeio", Staged),
    ("noalign", Staged),
    ("norecovery", KernelRefuses),
    ("ro,norecovery", Staged),
    ("nouuid", Staged),
    ("noquota", Staged),
    ("uquota", XfsQuota),
    ("usrquota", XfsQuota),
    ("uqnoenforce", XfsQuota),
    ("quota", XfsQuota),
    ("qnoenforce", XfsQuota),
    ("gquota", XfsQuota),
    ("grpquota", XfsQuota),
    ("gqnoenforce", XfsQuota),
    ("pquota", XfsQuota),
    ("prjquota", XfsQuota),
    ("pqnoenforce", XfsQuota),
    ("swalloc", Staged),
    ("wsync", Staged),
    ("dax", Staged),
    ("dax=never", Staged),
    ("lifetime", Staged),
    ("allocsize=64m", Staged),
    ("logbufs=8", Staged),
    ("logbsize=256k", Staged),
    ("sunit=128,swidth=256", KernelRefuses),
    ("max_open_zones=4", KernelRefuses),
    ("max_atomic_write=64k", Staged),
    ("nolifetime", KernelRefuses),
];

/// Stages one volume of `fs_type` with each option in turn and unstages
/// it; returns the options whose outcome differs from the table's.
fn outcomes(fs_type: FsType, table: &[(&str, Outcome)]) -> Vec<String> {
    let sandbox = Sandbox::new();
    let helper = Helper::start(&sandbox, &[]);
    let volume = LoopVolume::create(sandbox.path(), "vol-0a000000000000012", 300);
    let staging = sandbox.staging("vol-0a000000000000012");
    assert_eq!(
        helper
            .call(stage_request(&volume.volume_id, &volume.device, &staging, fs_type, &[]))
            .unwrap(),
        Reply::Done
    );
    let formatted = volume.signature();
    let unstage = || {
        let request = Request::Unstage(UnstageRequest {
            staging_path: staging.to_string_lossy().into_owned(),
        });
        assert_eq!(helper.call(request).unwrap(), Reply::Done);
    };
    unstage();
    let mut differing = Vec::new();
    for (option, expected) in GENERIC.iter().chain(table) {
        let reply = helper.call(stage_request(
            &volume.volume_id,
            &volume.device,
            &staging,
            fs_type,
            &[option],
        ));
        let outcome = match reply {
            Ok(Reply::Done) => {
                unstage();
                Staged
            }
            Err(ClientError::Helper(HelperError::System { operation, detail }))
                if operation.starts_with("mounting") && detail.contains("Invalid argument") =>
            {
                assert!(!is_mounted(&staging), "{option}: refused, yet mounted");
                KernelRefuses
            }
            other => panic!("{option}: {other:?}"),
        };
        assert_eq!(volume.signature(), formatted, "{option}: the filesystem changed");
        if outcome != expected.here() {
            differing.push(format!("{option}: {outcome:?}"));
        }
    }
    differing
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn every_documented_ext4_option_is_staged_or_left_to_the_kernel() {
    require_root();
    assert_eq!(outcomes(FsType::Ext4, &EXT4), Vec::<String>::new());
}

#[test]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
fn every_documented_xfs_option_is_staged_or_left_to_the_kernel() {
    require_root();
    assert_eq!(outcomes(FsType::Xfs, &XFS), Vec::<String>::new());
}
