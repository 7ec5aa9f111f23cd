//! StorageClass parameters of CreateVolume and VolumeAttributesClass
//! parameters of ControllerModifyVolume, with the Go driver's names. Keys
//! are case-insensitive; an unknown key is refused.

use std::collections::HashMap;

use ebs_csi_helper_proto::{FormatOptions, FsType};
use ebs_csi_proto::format_context;

use crate::ec2::{LockMode, SnapshotLock, Tags};
use crate::error::ControllerError;
use crate::tags::{self, InvalidTags};

/// The fstype key the external-provisioner passes through.
const FS_TYPE: &str = "csi.storage.k8s.io/fstype";
/// The Go driver's deprecated spelling of [`FS_TYPE`] (lowercased).
const DEPRECATED_FS_TYPE: &str = "fstype";
/// The Go driver's deprecated io2 Block Express switch (lowercased).
const DEPRECATED_BLOCK_EXPRESS: &str = "blockexpress";
/// Holds ControllerPublishVolume until the volume is initialized
/// (lowercased; also the volume-context key that carries it there).
pub const BLOCK_ATTACH_UNTIL_INITIALIZED: &str = "blockattachuntilinitialized";
/// Lets ControllerExpandVolume keep `iopsPerGB` (lowercased).
const AUTO_IOPS_ON_MODIFY: &str = "allowautoiopsincreaseonmodify";
/// The Go driver's deprecated spelling of `type` in a VolumeAttributesClass.
const DEPRECATED_VOLUME_TYPE: &str = "volumetype";
/// Keys the external-provisioner adds with `--extra-create-metadata`, and
/// the external-resizer with `--extra-modify-metadata`.
const PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
const PV_NAME: &str = "csi.storage.k8s.io/pv/name";
/// Keys the external-snapshotter adds with `--extra-create-metadata`.
const SNAPSHOT_NAME: &str = "csi.storage.k8s.io/volumesnapshot/name";
const SNAPSHOT_NAMESPACE: &str = "csi.storage.k8s.io/volumesnapshot/namespace";
const SNAPSHOT_CONTENT_NAME: &str = "csi.storage.k8s.io/volumesnapshotcontent/name";
const GROUP_SNAPSHOT_NAME: &str = "csi.storage.k8s.io/volumegroupsnapshot/name";
const GROUP_SNAPSHOT_NAMESPACE: &str = "csi.storage.k8s.io/volumegroupsnapshot/namespace";
const GROUP_SNAPSHOT_CONTENT_NAME: &str = "csi.storage.k8s.io/volumegroupsnapshotcontent/name";

/// CreateVolume's parameters, parsed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeParameters {
    /// `type`, default gp3.
    pub volume_type: Option<String>,
    /// `iops`.
    pub iops: Option<i32>,
    /// `iopsPerGB`.
    pub iops_per_gib: Option<i32>,
    /// `allowAutoIOPSPerGBIncrease`.
    pub allow_iops_increase: bool,
    /// `allowAutoIOPSIncreaseOnModify`: ControllerExpandVolume keeps
    /// `iopsPerGB` (recorded in tags, as the Go driver does).
    pub allow_iops_increase_on_modify: bool,
    /// `blockAttachUntilInitialized`: ControllerPublishVolume waits until
    /// the volume is initialized from its snapshot.
    pub block_attach_until_initialized: bool,
    /// `throughput`, MiB/s.
    pub throughput: Option<i32>,
    /// `encrypted`.
    pub encrypted: bool,
    /// `kmsKeyId`.
    pub kms_key_id: Option<String>,
    /// `volumeInitializationRate`: MiB/s at which a volume restored from a
    /// snapshot is initialized, 100–300 (EC2 API Reference, CreateVolume,
    /// `VolumeInitializationRate`).
    pub initialization_rate: Option<i32>,
    /// `csi.storage.k8s.io/fstype`, validated.
    pub fs_type: Option<FsType>,
    /// `blockSize`, `inodeSize`, … validated against the fstype.
    pub format: FormatOptions,
    /// Tags from `tagSpecification_N` plus the `kubernetes.io/created-for/…` ones.
    pub tags: Tags,
}

/// Parses CreateVolume parameters.
///
/// # Errors
/// INVALID_ARGUMENT naming the key for an unknown key or a bad value.
pub fn volume(parameters: &HashMap<String, String>, invalid: InvalidTags) -> Result<VolumeParameters, ControllerError> {
    let lower: HashMap<String, &String> = parameters.iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect();
    let fields = volume_fields(&lower);
    let mut p = VolumeParameters::default();
    for (key, value) in &lower {
        match key.as_str() {
            "type" => p.volume_type = Some(value.to_ascii_lowercase()),
            "iops" => p.iops = Some(number(key, value)?),
            "iopspergb" => p.iops_per_gib = Some(number(key, value)?),
            "allowautoiopspergbincrease" => p.allow_iops_increase = boolean(key, value)?,
            AUTO_IOPS_ON_MODIFY => p.allow_iops_increase_on_modify = boolean(key, value)?,
            BLOCK_ATTACH_UNTIL_INITIALIZED => p.block_attach_until_initialized = boolean(key, value)?,
            "throughput" => p.throughput = Some(number(key, value)?),
            "encrypted" => p.encrypted = boolean(key, value)?,
            "kmskeyid" => p.kms_key_id = Some((*value).clone()),
            "volumeinitializationrate" => p.initialization_rate = Some(initialization_rate(key, value)?),
            FS_TYPE => p.fs_type = Some(fs_type(value)?),
            // Deprecated keys the Go driver still takes.
            DEPRECATED_FS_TYPE => {
                tracing::warn!("StorageClass parameter fsType is deprecated: use csi.storage.k8s.io/fstype");
                if !lower.contains_key(FS_TYPE) {
                    p.fs_type = Some(fs_type(value)?);
                }
            }
            DEPRECATED_BLOCK_EXPRESS => {
                tracing::warn!(
                    "StorageClass parameter blockExpress is deprecated and ignored: every io2 volume is Block Express"
                );
            }
            PVC_NAME | PVC_NAMESPACE | PV_NAME => {
                let suffix = key.trim_start_matches("csi.storage.k8s.io/");
                p.tags
                    .insert(format!("{}{suffix}", tags::CREATED_FOR_PREFIX), (*value).clone());
            }
            k if format_context::is_key(k) => {}
            k if k.starts_with(tags::SPECIFICATION_PREFIX) => {
                if let Some((tag, tag_value)) = invalid.take(tags::parse_specification(value, &fields))? {
                    p.tags.insert(tag, tag_value);
                }
            }
            _ => return Err(unknown(key)),
        }
    }
    exclusive_iops(p.iops, p.iops_per_gib)?;
    // Recorded on the volume for ControllerExpandVolume, as the Go driver.
    if let Some(ratio) = p.iops_per_gib {
        p.tags.insert(tags::IOPS_PER_GIB.to_owned(), ratio.to_string());
    }
    if p.allow_iops_increase_on_modify {
        p.tags.insert(tags::AUTO_IOPS_ON_MODIFY.to_owned(), "true".to_owned());
    }
    p.format = format_context::from_map(parameters).map_err(ControllerError::InvalidArgument)?;
    p.format
        .validate(p.fs_type.unwrap_or(FsType::Ext4))
        .map_err(ControllerError::InvalidArgument)?;
    Ok(p)
}

/// CreateSnapshot's (VolumeSnapshotClass) parameters, parsed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotParameters {
    /// Tags from `tagSpecification_N`.
    pub tags: Tags,
    /// `fastSnapshotRestoreAvailabilityZones`: zones (comma-separated in
    /// the class) in which to enable fast snapshot restore.
    pub fast_restore_zones: Vec<String>,
    /// `lockMode`, `lockDuration`, `lockExpirationDate`,
    /// `lockCoolOffPeriod`: an EBS snapshot lock.
    pub lock: Option<SnapshotLock>,
    /// `outpostArn`: store the snapshot on this Outpost.
    pub outpost_arn: Option<String>,
}

/// Parses CreateSnapshot (VolumeSnapshotClass) parameters, with the Go
/// driver's keys: `tagSpecification_N` with the snapshot template fields,
/// the snapshotter's metadata keys, fast snapshot restore zones, a lock and
/// an Outpost.
///
/// # Errors
/// INVALID_ARGUMENT for any other key or a bad value, checked against
/// EC2's ranges (EC2 API Reference, LockSnapshot): a lock needs `lockMode`
/// `compliance` or `governance` and exactly one of `lockDuration` (1–36,500
/// days) and `lockExpirationDate` (RFC 3339); `lockCoolOffPeriod` (1–72
/// hours) is for compliance mode only.
pub fn snapshot(
    parameters: &HashMap<String, String>,
    invalid: InvalidTags,
) -> Result<SnapshotParameters, ControllerError> {
    let lower: HashMap<String, &String> = parameters.iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect();
    let field = |key: &str| lower.get(key).map(|v| (*v).clone()).unwrap_or_default();
    let fields = [
        ("VolumeSnapshotName", field(SNAPSHOT_NAME)),
        ("VolumeSnapshotNamespace", field(SNAPSHOT_NAMESPACE)),
        ("VolumeSnapshotContentName", field(SNAPSHOT_CONTENT_NAME)),
    ];
    let mut p = SnapshotParameters::default();
    for (key, value) in &lower {
        match key.as_str() {
            SNAPSHOT_NAME | SNAPSHOT_NAMESPACE | SNAPSHOT_CONTENT_NAME => {}
            LOCK_MODE | LOCK_DURATION | LOCK_EXPIRATION_DATE | LOCK_COOL_OFF_PERIOD => {}
            "fastsnapshotrestoreavailabilityzones" => {
                p.fast_restore_zones = value
                    .split(',')
                    .map(str::trim)
                    .filter(|z| !z.is_empty())
                    .map(str::to_owned)
                    .collect();
            }
            "outpostarn" => p.outpost_arn = Some(outpost_arn(value)?),
            k if k.starts_with(tags::SPECIFICATION_PREFIX) => {
                if let Some((tag, tag_value)) = invalid.take(tags::parse_specification(value, &fields))? {
                    p.tags.insert(tag, tag_value);
                }
            }
            _ => return Err(unknown(key)),
        }
    }
    p.lock = lock(&lower)?;
    Ok(p)
}

/// Parses CreateVolumeGroupSnapshot (VolumeGroupSnapshotClass)
/// parameters: `tagSpecification_N`, as for snapshots, with the group's
/// template fields (`.VolumeGroupSnapshotName`,
/// `.VolumeGroupSnapshotNamespace`, `.VolumeGroupSnapshotContentName`), and
/// the snapshotter's metadata keys (`--extra-create-metadata`). The tags go
/// on every member snapshot.
///
/// # Errors
/// INVALID_ARGUMENT for any other key or a bad tag specification.
pub fn group_snapshot(parameters: &HashMap<String, String>, invalid: InvalidTags) -> Result<Tags, ControllerError> {
    let lower: HashMap<String, &String> = parameters.iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect();
    let field = |key: &str| lower.get(key).map(|v| (*v).clone()).unwrap_or_default();
    let fields = [
        ("VolumeGroupSnapshotName", field(GROUP_SNAPSHOT_NAME)),
        ("VolumeGroupSnapshotNamespace", field(GROUP_SNAPSHOT_NAMESPACE)),
        ("VolumeGroupSnapshotContentName", field(GROUP_SNAPSHOT_CONTENT_NAME)),
    ];
    let mut tags = Tags::new();
    for (key, value) in &lower {
        match key.as_str() {
            GROUP_SNAPSHOT_NAME | GROUP_SNAPSHOT_NAMESPACE | GROUP_SNAPSHOT_CONTENT_NAME => {}
            k if k.starts_with(tags::SPECIFICATION_PREFIX) => {
                if let Some((tag, tag_value)) = invalid.take(tags::parse_specification(value, &fields))? {
                    tags.insert(tag, tag_value);
                }
            }
            _ => return Err(unknown(key)),
        }
    }
    Ok(tags)
}

const LOCK_MODE: &str = "lockmode";
const LOCK_DURATION: &str = "lockduration";
const LOCK_EXPIRATION_DATE: &str = "lockexpirationdate";
const LOCK_COOL_OFF_PERIOD: &str = "lockcooloffperiod";

/// A lowercased lock key as the Go driver's documentation spells it.
fn spelled(key: &str) -> &str {
    [
        (LOCK_DURATION, "lockDuration"),
        (LOCK_EXPIRATION_DATE, "lockExpirationDate"),
        (LOCK_COOL_OFF_PERIOD, "lockCoolOffPeriod"),
    ]
    .into_iter()
    .find_map(|(lower, name)| (lower == key).then_some(name))
    .unwrap_or(key)
}

/// The snapshot lock a class asks for, if any (see [`snapshot`]).
fn lock(lower: &HashMap<String, &String>) -> Result<Option<SnapshotLock>, ControllerError> {
    let invalid = |m: String| Err(ControllerError::InvalidArgument(m));
    let mode = match lower.get(LOCK_MODE).map(|m| m.to_ascii_lowercase()).as_deref() {
        None => {
            let stray = [LOCK_DURATION, LOCK_EXPIRATION_DATE, LOCK_COOL_OFF_PERIOD]
                .into_iter()
                .find(|k| lower.contains_key(*k));
            return match stray {
                Some(key) => invalid(format!("{} needs lockMode", spelled(key))),
                None => Ok(None),
            };
        }
        Some("compliance") => LockMode::Compliance,
        Some("governance") => LockMode::Governance,
        Some(other) => return invalid(format!("lockMode={other:?} is not compliance or governance")),
    };
    let in_range = |key: &str, range: std::ops::RangeInclusive<i32>| -> Result<Option<i32>, ControllerError> {
        let Some(value) = lower.get(key) else {
            return Ok(None);
        };
        match value.parse::<i32>() {
            Ok(n) if range.contains(&n) => Ok(Some(n)),
            _ => Err(ControllerError::InvalidArgument(format!(
                "{}={value:?} is outside EC2's {}–{}",
                spelled(key),
                range.start(),
                range.end()
            ))),
        }
    };
    let duration_days = in_range(LOCK_DURATION, 1..=36_500)?;
    let cool_off_hours = in_range(LOCK_COOL_OFF_PERIOD, 1..=72)?;
    let expires_at_seconds = match lower.get(LOCK_EXPIRATION_DATE) {
        None => None,
        Some(date) => Some(
            aws_smithy_types::DateTime::from_str(date, aws_smithy_types::date_time::Format::DateTime)
                .map_err(|e| ControllerError::InvalidArgument(format!("lockExpirationDate={date:?}: {e}")))?
                .secs(),
        ),
    };
    if duration_days.is_some() == expires_at_seconds.is_some() {
        return invalid("a snapshot lock needs one of lockDuration and lockExpirationDate".to_owned());
    }
    if cool_off_hours.is_some() && mode != LockMode::Compliance {
        return invalid("lockCoolOffPeriod applies only to lockMode compliance".to_owned());
    }
    Ok(Some(SnapshotLock {
        mode,
        duration_days,
        expires_at_seconds,
        cool_off_hours,
    }))
}

/// An Outpost ARN, `arn:<partition>:outposts:<region>:<account>:outpost/op-…`
/// (AWS Outposts User Guide, "Resource types").
fn outpost_arn(value: &str) -> Result<String, ControllerError> {
    let parts: Vec<&str> = value.splitn(6, ':').collect();
    match parts.as_slice() {
        ["arn", _, "outposts", _, _, resource] if resource.starts_with("outpost/op-") => Ok(value.to_owned()),
        _ => Err(ControllerError::InvalidArgument(format!(
            "outpostArn={value:?} is not an Outpost ARN (arn:aws:outposts:<region>:<account>:outpost/op-…)"
        ))),
    }
}

impl VolumeParameters {
    /// These parameters with a VolumeAttributesClass's applied on top (its
    /// `mutable_parameters` given to CreateVolume win over the
    /// StorageClass's): type, IOPS and throughput replace, tags are added
    /// or removed.
    pub fn with(mut self, mutation: Mutation) -> Self {
        if mutation.volume_type.is_some() {
            self.volume_type = mutation.volume_type;
        }
        if mutation.iops.is_some() || mutation.iops_per_gib.is_some() {
            self.iops = mutation.iops;
            self.iops_per_gib = mutation.iops_per_gib;
        }
        if mutation.throughput.is_some() {
            self.throughput = mutation.throughput;
        }
        self.tags.extend(mutation.add_tags);
        for key in mutation.delete_tags {
            self.tags.remove(&key);
        }
        self
    }
}

/// ControllerModifyVolume's mutable parameters, parsed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mutation {
    /// `type`.
    pub volume_type: Option<String>,
    /// `iops`.
    pub iops: Option<i32>,
    /// `iopsPerGB`.
    pub iops_per_gib: Option<i32>,
    /// `throughput`.
    pub throughput: Option<i32>,
    /// `allowAutoIOPSIncreaseOnModify`, when given.
    pub allow_iops_increase_on_modify: Option<bool>,
    /// Tags to add or overwrite (`tagSpecification_N`).
    pub add_tags: Tags,
    /// Tag keys to remove (`tagDeletion_N`).
    pub delete_tags: Vec<String>,
}

/// The template fields of a volume's tag specifications, from the
/// sidecars' metadata keys (empty where a key is absent), in the order
/// of the Go driver's struct.
fn volume_fields(lower: &HashMap<String, &String>) -> [(&'static str, String); 3] {
    let field = |key: &str| lower.get(key).map(|v| (*v).clone()).unwrap_or_default();
    [
        ("PVCName", field(PVC_NAME)),
        ("PVCNamespace", field(PVC_NAMESPACE)),
        ("PVName", field(PV_NAME)),
    ]
}

/// Parses ControllerModifyVolume's `mutable_parameters`: the Go driver's
/// VolumeAttributesClass keys, tag templates filled from the keys the
/// external-resizer adds with `--extra-modify-metadata`.
///
/// # Errors
/// INVALID_ARGUMENT for an unknown key or a bad value.
pub fn mutation(parameters: &HashMap<String, String>, invalid: InvalidTags) -> Result<Mutation, ControllerError> {
    let lower: HashMap<String, &String> = parameters.iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect();
    let fields = volume_fields(&lower);
    let mut m = Mutation::default();
    for (key, value) in &lower {
        match key.as_str() {
            "type" => m.volume_type = Some(value.to_ascii_lowercase()),
            DEPRECATED_VOLUME_TYPE => {
                tracing::warn!("VolumeAttributesClass parameter volumeType is deprecated: use type");
                if !lower.contains_key("type") {
                    m.volume_type = Some(value.to_ascii_lowercase());
                }
            }
            PVC_NAME | PVC_NAMESPACE | PV_NAME => {}
            "iops" => m.iops = Some(number(key, value)?),
            "iopspergb" => m.iops_per_gib = Some(number(key, value)?),
            "throughput" => m.throughput = Some(number(key, value)?),
            AUTO_IOPS_ON_MODIFY => m.allow_iops_increase_on_modify = Some(boolean(key, value)?),
            k if k.starts_with(tags::SPECIFICATION_PREFIX) => {
                if let Some((tag, tag_value)) = invalid.take(tags::parse_specification(value, &fields))? {
                    m.add_tags.insert(tag, tag_value);
                }
            }
            k if k.starts_with(tags::DELETION_PREFIX) => {
                tags::check_key(value)?;
                m.delete_tags.push((*value).clone());
            }
            k => return Err(unknown(k)),
        }
    }
    exclusive_iops(m.iops, m.iops_per_gib)?;
    // The volume's record of its ratio follows the class: a new ratio
    // replaces it, a fixed IOPS ends it.
    match (m.iops_per_gib, m.iops) {
        (Some(ratio), _) => {
            m.add_tags.insert(tags::IOPS_PER_GIB.to_owned(), ratio.to_string());
        }
        (None, Some(_)) => m.delete_tags.push(tags::IOPS_PER_GIB.to_owned()),
        (None, None) => {}
    }
    match m.allow_iops_increase_on_modify {
        Some(true) => {
            m.add_tags
                .insert(tags::AUTO_IOPS_ON_MODIFY.to_owned(), "true".to_owned());
        }
        Some(false) => m.delete_tags.push(tags::AUTO_IOPS_ON_MODIFY.to_owned()),
        None => {}
    }
    Ok(m)
}

/// `iops` and `iopsPerGB` name the same thing two ways: one or the other.
fn exclusive_iops(iops: Option<i32>, iops_per_gib: Option<i32>) -> Result<(), ControllerError> {
    if iops.is_some() && iops_per_gib.is_some() {
        return Err(ControllerError::InvalidArgument(
            "iops and iopsPerGB are both set: give one".to_owned(),
        ));
    }
    Ok(())
}

fn number(key: &str, value: &str) -> Result<i32, ControllerError> {
    value
        .parse::<i32>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| ControllerError::InvalidArgument(format!("{key}={value:?} is not a positive number")))
}

/// EC2's valid range for `VolumeInitializationRate`, MiB/s (EC2 API
/// Reference, CreateVolume).
const INITIALIZATION_RATES: std::ops::RangeInclusive<i32> = 100..=300;

fn initialization_rate(key: &str, value: &str) -> Result<i32, ControllerError> {
    let rate = number(key, value)?;
    if !INITIALIZATION_RATES.contains(&rate) {
        return Err(ControllerError::InvalidArgument(format!(
            "{key}={rate} is outside EC2's {}–{} MiB/s",
            INITIALIZATION_RATES.start(),
            INITIALIZATION_RATES.end()
        )));
    }
    Ok(rate)
}

fn boolean(key: &str, value: &str) -> Result<bool, ControllerError> {
    value
        .to_ascii_lowercase()
        .parse::<bool>()
        .map_err(|_| ControllerError::InvalidArgument(format!("{key}={value:?} is not true or false")))
}

fn fs_type(value: &str) -> Result<FsType, ControllerError> {
    FsType::from_name(&value.to_ascii_lowercase()).ok_or_else(|| {
        ControllerError::InvalidArgument(format!("fstype {value:?} is not one of ext2, ext3, ext4, xfs"))
    })
}

fn unknown(key: &str) -> ControllerError {
    ControllerError::InvalidArgument(format!("parameter {key:?} is not known"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    /// The keys the first column of docs/reference/parameters.md's
    /// StorageClass table names (`tagSpecification_N` as `_1`).
    fn documented_keys() -> Vec<String> {
        include_str!("../../docs/reference/parameters.md")
            .lines()
            .filter(|l| l.starts_with("| `"))
            .flat_map(|l| l.split('|').nth(1).unwrap_or_default().split('`').skip(1).step_by(2))
            .map(|key| key.replace("_N", "_1"))
            .collect()
    }

    /// A key the reference names but the parser does not know would send
    /// an operator to a StorageClass no volume can be made of.
    #[test]
    fn every_key_the_reference_names_is_known() {
        let keys = documented_keys();
        assert!(keys.len() >= 20, "{keys:?}");
        for key in keys {
            for value in ["1", "true", "gp3", "ext4", "team=storage"] {
                if let Err(e) = volume(&map(&[(&key, value)]), InvalidTags::Refuse) {
                    assert_ne!(e.to_string(), unknown(&key.to_ascii_lowercase()).to_string(), "{key}");
                }
            }
        }
    }

    #[test]
    fn go_driver_spellings_are_taken() {
        let p = volume(
            &map(&[
                ("fsType", "xfs"),
                ("blockExpress", "true"),
                ("tagSpecification1", "team=storage"),
                ("tagSpecification_2", "tier=gold"),
            ]),
            InvalidTags::Refuse,
        )
        .unwrap();
        assert_eq!(p.fs_type, Some(FsType::Xfs));
        assert_eq!(p.tags.get("team").map(String::as_str), Some("storage"));
        assert_eq!(p.tags.get("tier").map(String::as_str), Some("gold"));
        // The CSI key wins over the deprecated one.
        let p = volume(
            &map(&[("fsType", "xfs"), ("csi.storage.k8s.io/fstype", "ext4")]),
            InvalidTags::Refuse,
        )
        .unwrap();
        assert_eq!(p.fs_type, Some(FsType::Ext4));
    }

    #[test]
    fn iops_and_iops_per_gb_together_are_refused() {
        let both = map(&[("iops", "3000"), ("iopsPerGB", "50")]);
        for error in [
            volume(&both, InvalidTags::Refuse).unwrap_err(),
            mutation(&both, InvalidTags::Refuse).unwrap_err(),
        ] {
            assert_eq!(error.to_string(), "iops and iopsPerGB are both set: give one");
            assert!(matches!(error, ControllerError::InvalidArgument(_)));
        }
    }

    #[test]
    fn parses_the_go_drivers_parameters() {
        let p = volume(
            &map(&[
                ("Type", "IO2"),
                ("iopsPerGB", "50"),
                ("allowAutoIOPSPerGBIncrease", "true"),
                ("encrypted", "TRUE"),
                ("kmsKeyId", "arn:aws:kms:key"),
                ("csi.storage.k8s.io/fstype", "xfs"),
                ("blockSize", "4096"),
                ("tagSpecification_1", "owner={{ .PVCNamespace }}"),
                ("csi.storage.k8s.io/pvc/namespace", "shop"),
                ("csi.storage.k8s.io/pvc/name", "data"),
            ]),
            InvalidTags::Refuse,
        )
        .unwrap();
        assert_eq!(p.volume_type.as_deref(), Some("io2"));
        assert_eq!(
            (p.iops_per_gib, p.allow_iops_increase, p.encrypted),
            (Some(50), true, true)
        );
        assert_eq!(p.fs_type, Some(FsType::Xfs));
        assert_eq!(p.format.block_size, Some(4096));
        assert_eq!(p.tags.get("owner").map(String::as_str), Some("shop"));
        assert_eq!(
            p.tags.get("kubernetes.io/created-for/pvc/name").map(String::as_str),
            Some("data")
        );
    }

    #[test]
    fn refuses_unknown_keys_and_bad_values() {
        for bad in [
            map(&[("color", "blue")]),
            map(&[("iops", "many")]),
            map(&[("iops", "-5")]),
            map(&[("encrypted", "yes")]),
            map(&[("csi.storage.k8s.io/fstype", "ntfs")]),
            map(&[("csi.storage.k8s.io/fstype", "xfs"), ("bytesPerInode", "4096")]),
            map(&[("tagSpecification_1", "CSIVolumeName=x")]),
        ] {
            assert!(
                matches!(
                    volume(&bad, InvalidTags::Refuse),
                    Err(ControllerError::InvalidArgument(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn parses_snapshot_and_modify_parameters() {
        let p = snapshot(
            &map(&[
                (
                    "tagSpecification_1",
                    "source={{ .VolumeSnapshotNamespace }}/{{ .VolumeSnapshotName }}",
                ),
                ("csi.storage.k8s.io/volumesnapshot/name", "nightly"),
                ("csi.storage.k8s.io/volumesnapshot/namespace", "shop"),
            ]),
            InvalidTags::Refuse,
        )
        .unwrap();
        assert_eq!(p.tags.get("source").map(String::as_str), Some("shop/nightly"));
        assert!(snapshot(&map(&[("type", "gp3")]), InvalidTags::Refuse).is_err());
        // The Go driver's other VolumeSnapshotClass keys.
        let p = snapshot(
            &map(&[
                ("fastSnapshotRestoreAvailabilityZones", "us-east-1a, us-east-1b"),
                ("lockMode", "compliance"),
                ("lockExpirationDate", "2030-01-01T00:00:00Z"),
                ("lockCoolOffPeriod", "24"),
                (
                    "outpostArn",
                    "arn:aws:outposts:us-east-1:123456789012:outpost/op-0123456789abcdef0",
                ),
            ]),
            InvalidTags::Refuse,
        )
        .unwrap();
        assert_eq!(p.fast_restore_zones, vec!["us-east-1a", "us-east-1b"]);
        assert_eq!(
            p.lock,
            Some(SnapshotLock {
                mode: LockMode::Compliance,
                duration_days: None,
                expires_at_seconds: Some(1_893_456_000),
                cool_off_hours: Some(24),
            })
        );
        assert!(p.outpost_arn.is_some());
        for (bad, why) in [
            (
                vec![("lockMode", "governance")],
                "a snapshot lock needs one of lockDuration and lockExpirationDate",
            ),
            (
                vec![
                    ("lockMode", "governance"),
                    ("lockDuration", "1"),
                    ("lockCoolOffPeriod", "1"),
                ],
                "lockCoolOffPeriod applies only to lockMode compliance",
            ),
            (vec![("lockDuration", "1")], "lockDuration needs lockMode"),
            (
                vec![("lockMode", "compliance"), ("lockDuration", "0")],
                "lockDuration=\"0\" is outside EC2's 1–36500",
            ),
            (
                vec![("outpostArn", "op-1")],
                "outpostArn=\"op-1\" is not an Outpost ARN (arn:aws:outposts:<region>:<account>:outpost/op-…)",
            ),
        ] {
            match snapshot(&map(&bad), InvalidTags::Refuse) {
                Err(ControllerError::InvalidArgument(m)) => assert_eq!(m, why),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let m = mutation(
            &map(&[
                ("type", "io2"),
                ("iops", "4000"),
                ("tagDeletion_1", "team"),
                ("tagSpecification_1", "env=prod"),
            ]),
            InvalidTags::Refuse,
        )
        .unwrap();
        assert_eq!((m.volume_type.as_deref(), m.iops), (Some("io2"), Some(4000)));
        // A fixed IOPS ends the volume's recorded ratio.
        assert_eq!(m.delete_tags, vec!["team".to_owned(), tags::IOPS_PER_GIB.to_owned()]);
        let m = mutation(
            &map(&[("iopsPerGB", "50"), ("allowAutoIOPSIncreaseOnModify", "false")]),
            InvalidTags::Refuse,
        )
        .unwrap();
        assert_eq!(m.add_tags.get(tags::IOPS_PER_GIB).map(String::as_str), Some("50"));
        assert_eq!(m.delete_tags, vec![tags::AUTO_IOPS_ON_MODIFY.to_owned()]);
        assert!(mutation(&map(&[("encrypted", "true")]), InvalidTags::Refuse).is_err());
        // The Go driver's deprecated volumeType, and templates filled from
        // the external-resizer's --extra-modify-metadata keys.
        let m = mutation(
            &map(&[
                ("volumeType", "io1"),
                (
                    "tagSpecification_1",
                    "owner={{ .PVCNamespace }}/{{ .PVCName }} on {{ .PVName }}",
                ),
                ("csi.storage.k8s.io/pvc/name", "data"),
                ("csi.storage.k8s.io/pvc/namespace", "shop"),
                ("csi.storage.k8s.io/pv/name", "pvc-1"),
            ]),
            InvalidTags::Refuse,
        )
        .unwrap();
        assert_eq!(m.volume_type.as_deref(), Some("io1"));
        assert_eq!(m.add_tags.get("owner").map(String::as_str), Some("shop/data on pvc-1"));
        let both = mutation(&map(&[("type", "gp3"), ("volumeType", "io1")]), InvalidTags::Refuse).unwrap();
        assert_eq!(both.volume_type.as_deref(), Some("gp3"), "type wins over volumeType");
    }
}
