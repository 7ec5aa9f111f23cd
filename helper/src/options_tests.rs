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

#[test]
fn refuses_everything_else() {
    for (fs, option, refused) in [
        (Some(FsType::Ext4), "suid", "suid"),
        (Some(FsType::Ext4), "dev", "dev"),
        (Some(FsType::Ext4), "exec", "exec"),
        (Some(FsType::Ext4), "user", "user"),
        (
            Some(FsType::Ext4),
            "context=system_u:object_r:etc_t:s0",
            "context=system_u:object_r:etc_t:s0",
        ),
        (
            Some(FsType::Ext4),
            "context=\"system_u:object_r:container_file_t:s0\",suid",
            "suid",
        ),
        (
            Some(FsType::Ext4),
            "context=system_u:object_r:container_file_t:s0\"x",
            "context=system_u:object_r:container_file_t:s0\"x",
        ),
        (
            Some(FsType::Ext4),
            "context=system_u:object_r:container_file_t:s0 x",
            "context=system_u:object_r:container_file_t:s0 x",
        ),
        (
            Some(FsType::Ext4),
            "context=:object_r:container_file_t",
            "context=:object_r:container_file_t",
        ),
        (
            Some(FsType::Ext4),
            "context=system_u:object_r",
            "context=system_u:object_r",
        ),
        (
            Some(FsType::Ext4),
            "fscontext=system_u:object_r:container_file_t:s0",
            "fscontext=system_u:object_r:container_file_t:s0",
        ),
        (Some(FsType::Ext4), "commit=", "commit="),
        (Some(FsType::Ext4), "commit=+5", "commit=+5"),
        (Some(FsType::Ext4), "commit=-1", "commit=-1"),
        (Some(FsType::Ext4), "commit=86401", "commit=86401"),
        (Some(FsType::Ext4), "commit=99999999999", "commit=99999999999"),
        (Some(FsType::Ext2), "commit=5", "commit=5"),
        (Some(FsType::Xfs), "commit=5", "commit=5"),
        (Some(FsType::Ext4), "usrjquota=aquota.user", "usrjquota=aquota.user"),
        (Some(FsType::Ext4), "jqfmt=vfsv0", "jqfmt=vfsv0"),
        (Some(FsType::Ext4), "nouuid", "nouuid"),
        (Some(FsType::Ext2), "prjquota", "prjquota"),
        (Some(FsType::Ext4), "noatime,bind", "bind"),
        (Some(FsType::Xfs), "nobarrier", "nobarrier"),
        (Some(FsType::Ext2), "discard", "discard"),
        (Some(FsType::Ext4), "data=journal", "data=journal"),
        (None, "rbind", "rbind"),
        (None, "x-mount.mkdir", "x-mount.mkdir"),
        (
            None,
            "context=system_u:object_r:shadow_t:s0",
            "context=system_u:object_r:shadow_t:s0",
        ),
    ] {
        assert_eq!(
            parse(fs, &strings(&[option])),
            Err(HelperError::MountOptionRefused(refused.to_owned())),
            "{option}"
        );
    }
}

#[test]
fn splits_at_commas_outside_quotes() {
    assert_eq!(split("a,\"b,c\",d"), ["a", "\"b,c\"", "d"]);
    assert_eq!(split("a\"b,c"), ["a\"b,c"]);
    assert_eq!(split(""), [""]);
}
