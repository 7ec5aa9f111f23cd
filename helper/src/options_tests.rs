use super::*;

fn strings(options: &[&str]) -> Vec<String> {
    options.iter().map(|s| (*s).to_owned()).collect()
}

const KUBELET_CONTEXT: &str = "context=\"system_u:object_r:container_file_t:s0:c123,c456\"";

#[test]
fn maps_allowed_options() {
    let parsed = parse(Some(FsType::Ext4), &strings(&["noatime,discard", "nodiratime", "rw"])).unwrap();
    assert_eq!(parsed.flags, MountFlags::NOATIME | MountFlags::NODIRATIME);
    assert_eq!(parsed.data, ["discard"]);
    let bind = parse(None, &strings(&["ro", "discard", KUBELET_CONTEXT])).unwrap();
    assert_eq!(
        bind,
        MountOptions {
            flags: MountFlags::RDONLY,
            data: vec![]
        }
    );
}

#[test]
fn accepts_what_real_storage_classes_carry() {
    let ext4 = parse(
        Some(FsType::Ext4),
        &strings(&["commit=60,usrquota", "grpquota,prjquota", KUBELET_CONTEXT, "noatime"]),
    )
    .unwrap();
    assert_eq!(
        ext4.data,
        [
            "commit=60",
            "usrquota",
            "grpquota",
            "prjquota",
            "context=\"system_u:object_r:container_file_t:s0:c123,c456\""
        ]
    );
    let xfs = parse(
        Some(FsType::Xfs),
        &strings(&[
            "nouuid,pquota",
            "uqnoenforce",
            "context=system_u:object_r:container_file_t:s0",
        ]),
    )
    .unwrap();
    assert_eq!(
        xfs.data,
        [
            "nouuid",
            "pquota",
            "uqnoenforce",
            "context=\"system_u:object_r:container_file_t:s0\""
        ]
    );
    let twice = parse(Some(FsType::Ext4), &strings(&["commit=5", "commit=5,quota,quota"])).unwrap();
    assert_eq!(twice.data, ["commit=5", "quota"]);
}

/// The reasons helper/policy/mount-options.json gives, as a user reads them.
const SETUID: &str = "set-user-ID files on the volume would run with their owner's rights on the node";
const FSTAB_USERS: &str = "lets users mount it from fstab; a CSI mount has no fstab entry";
const OPERATION: &str = "an operation of mount(8), not an option of a mount";
const NAMES_A_DEVICE: &str = "names a device or file other than the volume, which the helper cannot prove";

/// The refusal of `option` for `reason`.
fn refused(option: &str, reason: &str) -> Result<MountOptions, HelperError> {
    Err(HelperError::MountOptionRefused(format!("{option:?} refused: {reason}")))
}

#[test]
fn refuses_what_gives_a_pod_more_than_its_volume_each_with_its_reason() {
    let label = "the value must be an SELinux label of type container_file_t or svirt_sandbox_file_t";
    let unknown_ext4 = "not an option mount(8) or the kernel documents for ext4";
    for (fs, flags, option, reason) in [
        (Some(FsType::Ext4), "suid", "suid", SETUID),
        (Some(FsType::Ext4), "nosuid,suid", "suid", SETUID),
        (
            Some(FsType::Ext4),
            "dev",
            "dev",
            "device nodes on the volume would open the node's devices",
        ),
        (Some(FsType::Ext4), "user", "user", FSTAB_USERS),
        (Some(FsType::Ext4), "noatime,bind", "bind", OPERATION),
        (None, "rbind", "rbind", OPERATION),
        (
            Some(FsType::Ext4),
            "journal_path=/etc/passwd",
            "journal_path=/etc/passwd",
            NAMES_A_DEVICE,
        ),
        (
            Some(FsType::Ext4),
            "journal_dev=2049",
            "journal_dev=2049",
            NAMES_A_DEVICE,
        ),
        (Some(FsType::Xfs), "logdev=/dev/sda", "logdev=/dev/sda", NAMES_A_DEVICE),
        (Some(FsType::Xfs), "rtdev=/dev/sda", "rtdev=/dev/sda", NAMES_A_DEVICE),
        (
            Some(FsType::Ext4),
            "errors=panic",
            "errors=panic",
            "an inconsistency in the volume's filesystem would panic the node",
        ),
        (
            Some(FsType::Ext4),
            "abort",
            "abort",
            "a debugging option that breaks the filesystem on purpose",
        ),
        (
            Some(FsType::Ext4),
            "context=system_u:object_r:etc_t:s0",
            "context=system_u:object_r:etc_t:s0",
            label,
        ),
        (
            Some(FsType::Ext4),
            "context=\"system_u:object_r:container_file_t:s0\",suid",
            "suid",
            SETUID,
        ),
        (
            Some(FsType::Ext4),
            "context=system_u:object_r:container_file_t:s0\"x",
            "context=system_u:object_r:container_file_t:s0\"x",
            label,
        ),
        (
            Some(FsType::Ext4),
            "context=system_u:object_r:container_file_t:s0 x",
            "context=system_u:object_r:container_file_t:s0 x",
            label,
        ),
        (
            Some(FsType::Ext4),
            "context=:object_r:container_file_t",
            "context=:object_r:container_file_t",
            label,
        ),
        (
            Some(FsType::Ext4),
            "context=system_u:object_r",
            "context=system_u:object_r",
            label,
        ),
        (
            None,
            "context=system_u:object_r:shadow_t:s0",
            "context=system_u:object_r:shadow_t:s0",
            label,
        ),
        (
            Some(FsType::Ext4),
            "fscontext=system_u:object_r:container_file_t:s0",
            "fscontext=system_u:object_r:container_file_t:s0",
            unknown_ext4,
        ),
        (
            Some(FsType::Ext4),
            "commit=",
            "commit=",
            "the value must be a decimal number",
        ),
        (
            Some(FsType::Ext4),
            "commit=+5",
            "commit=+5",
            "the value must be a decimal number",
        ),
        (
            Some(FsType::Ext4),
            "commit=-1",
            "commit=-1",
            "the value must be a decimal number",
        ),
        (
            Some(FsType::Ext4),
            "commit=99999999999",
            "commit=99999999999",
            "the value must be a decimal number",
        ),
        (
            Some(FsType::Ext4),
            "usrjquota=/etc/passwd",
            "usrjquota=/etc/passwd",
            "the value must be a file name in the filesystem's root directory",
        ),
        (
            Some(FsType::Ext4),
            "usrjquota=..",
            "usrjquota=..",
            "the value must be a file name in the filesystem's root directory",
        ),
        (
            Some(FsType::Ext4),
            "data=bogus",
            "data=bogus",
            "the value must be one of journal, ordered, writeback",
        ),
        (
            Some(FsType::Xfs),
            "logbsize=32q",
            "logbsize=32q",
            "the value must be a size in bytes, with an optional k, m or g",
        ),
        (
            Some(FsType::Xfs),
            "commit=5",
            "commit=5",
            "not an option mount(8) or the kernel documents for xfs",
        ),
        (Some(FsType::Ext4), "nouuid", "nouuid", unknown_ext4),
        (Some(FsType::Ext4), "loop", "loop", unknown_ext4),
        (Some(FsType::Ext4), "mand", "mand", unknown_ext4),
        (Some(FsType::Ext4), "uid=0", "uid=0", unknown_ext4),
        (
            None,
            "shared",
            "shared",
            "not an option mount(8) or the kernel documents for a bind mount",
        ),
    ] {
        assert_eq!(parse(fs, &strings(&[flags])), refused(option, reason), "{flags}");
    }
}

#[test]
fn drops_what_mount8_keeps_to_itself() {
    let parsed = parse(
        Some(FsType::Xfs),
        &strings(&[
            "nofail,_netdev",
            "auto,noauto,nouser",
            "x-systemd.device-timeout=5s,comment=cloud",
        ]),
    )
    .unwrap();
    assert_eq!(parsed, parse(Some(FsType::Xfs), &[]).unwrap());
}

#[test]
fn kernel_defaults_are_accepted_and_change_nothing() {
    let parsed = parse(
        Some(FsType::Ext4),
        &strings(&["exec,async", "atime,diratime,nostrictatime,nolazytime,nomand,loud"]),
    )
    .unwrap();
    assert_eq!(parsed, parse(Some(FsType::Ext4), &[]).unwrap());
}

#[test]
fn tuning_options_reach_the_kernel_as_written() {
    let ext4 = [
        "dioread_nolock",
        "nodelalloc",
        "journal_checksum",
        "init_itable=10",
        "data=journal",
        "jqfmt=vfsv0",
        "usrjquota=aquota.user",
        "barrier=0",
        "errors=continue",
    ];
    assert_eq!(parse(Some(FsType::Ext4), &strings(&ext4)).unwrap().data, ext4);
    let xfs = [
        "logbufs=8",
        "logbsize=256k",
        "allocsize=64m",
        "largeio",
        "swalloc",
        "noalign",
    ];
    assert_eq!(parse(Some(FsType::Xfs), &strings(&xfs)).unwrap().data, xfs);
    // On a bind mount an option of either filesystem has no effect.
    assert_eq!(
        parse(None, &strings(&["logbufs=8", "dioread_nolock"])).unwrap().data,
        Vec::<String>::new()
    );
}

#[test]
fn splits_at_commas_outside_quotes() {
    assert_eq!(split("a,\"b,c\",d"), ["a", "\"b,c\"", "d"]);
    assert_eq!(split("a\"b,c"), ["a\"b,c"]);
    assert_eq!(split(""), [""]);
}

/// The shipped policy parses, and a refusal answers with the reason its
/// row gives.
#[test]
fn the_policy_parses_and_each_refusal_carries_its_rows_reason() {
    check_policy().unwrap();
    let policy = Policy::from_text(POLICY_TEXT).unwrap();
    assert!(policy.refused.len() >= 17, "{:?}", policy.refused);
    for (option, reason) in &policy.refused {
        let refusal = parse(Some(FsType::Ext4), &strings(&[option])).unwrap_err();
        assert_eq!(
            refusal,
            HelperError::MountOptionRefused(format!("{option:?} refused: {reason}"))
        );
    }
}

/// A policy that does not parse, names a flag `mount(2)` does not have or
/// refuses without a reason is no policy: the helper would not start.
#[test]
fn a_policy_that_is_wrong_is_refused_whole() {
    let shipped: serde_json::Value = serde_json::from_str(POLICY_TEXT).unwrap();
    let changed = |pointer: &str, value: serde_json::Value| {
        let mut policy = shipped.clone();
        *policy.pointer_mut(pointer).unwrap() = value;
        Policy::from_text(&policy.to_string()).unwrap_err()
    };
    assert!(Policy::from_text("{").unwrap_err().contains("EOF"));
    assert_eq!(
        changed("/flags/options/ro", "READONLY".into()),
        "ro: \"READONLY\" is not a mount(2) flag"
    );
    assert_eq!(
        changed("/refused/options/suid", " ".into()),
        "suid is refused without a reason"
    );
    assert!(changed("/filesystems/xfs/values/logbufs", "a number".into()).contains("did not match"));
}
