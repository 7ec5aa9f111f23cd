//! The tags the controller writes, the same as the Go driver's, and the
//! `tagSpecification_N` / `tagDeletion_N` parameters with their templates.

use crate::ec2::Tags;
use crate::error::ControllerError;
use crate::template;

/// Holds the CSI volume name: the idempotency key of CreateVolume.
pub const VOLUME_NAME: &str = "CSIVolumeName";
/// Holds the CSI snapshot name: the idempotency key of CreateSnapshot.
pub const SNAPSHOT_NAME: &str = "CSIVolumeSnapshotName";
/// Holds the CSI volume group snapshot name on each member snapshot: the
/// idempotency key of CreateVolumeGroupSnapshot and the group's id.
pub const GROUP_SNAPSHOT_NAME: &str = "CSIVolumeGroupSnapshotName";
/// Marks every resource this driver creates (`true`); the IAM policy in
/// `deploy/` is keyed on it.
pub const CLUSTER: &str = "ebs.csi.aws.com/cluster";
/// Prefix of the per-cluster ownership tag (`…/<id>=owned`).
pub const CLUSTER_ID_PREFIX: &str = "kubernetes.io/cluster/";
/// Holds the `--k8s-tag-cluster-id`; AWS's cluster-scoped IAM policy for
/// the Go driver (AmazonEBSCSIDriverEKSClusterScopedPolicy) is keyed on it.
pub const CLUSTER_NAME: &str = "ebs.csi.aws.com/cluster-name";
/// Holds the `--k8s-tag-cluster-id` too, as the in-tree provider wrote it.
pub const KUBERNETES_CLUSTER: &str = "KubernetesCluster";
/// The console's name of a resource: `<cluster id>-dynamic-<CSI name>`.
pub const NAME: &str = "Name";
/// Holds a volume's `iopsPerGB`, the ratio ControllerExpandVolume keeps
/// when [`AUTO_IOPS_ON_MODIFY`] is set (the Go driver's
/// `<driver name>/IOPSPerGb`, `pkg/cloud/cloud.go` `initVariables`).
pub const IOPS_PER_GIB: &str = "ebs.csi.aws.com/IOPSPerGb";
/// `true`: ControllerExpandVolume raises the IOPS with the size to keep
/// [`IOPS_PER_GIB`] (the Go driver's
/// `<driver name>/AllowAutoIOPSIncreaseOnModify`).
pub const AUTO_IOPS_ON_MODIFY: &str = "ebs.csi.aws.com/AllowAutoIOPSIncreaseOnModify";
/// Prefix of the PVC/PV provenance tags (`…/pvc/name`, …).
pub const CREATED_FOR_PREFIX: &str = "kubernetes.io/created-for/";

/// Prefix of StorageClass and VolumeSnapshotClass tag parameters,
/// lowercased: `tagSpecification_1`, and like the Go driver any key that
/// starts so (`tagSpecification1`).
pub const SPECIFICATION_PREFIX: &str = "tagspecification";
/// Prefix of VolumeAttributesClass tag deletions.
pub const DELETION_PREFIX: &str = "tagdeletion_";

/// Refuses keys the driver owns and keys EC2 reserves (`aws:`).
///
/// # Errors
/// INVALID_ARGUMENT naming the key.
pub fn check_key(key: &str) -> Result<(), ControllerError> {
    let reserved = [
        VOLUME_NAME,
        SNAPSHOT_NAME,
        CLUSTER,
        CLUSTER_NAME,
        IOPS_PER_GIB,
        AUTO_IOPS_ON_MODIFY,
    ]
    .contains(&key)
        || [CLUSTER_ID_PREFIX, CREATED_FOR_PREFIX, "aws:"]
            .iter()
            .any(|p| key.starts_with(p));
    if key.is_empty() || reserved {
        return Err(ControllerError::InvalidArgument(format!(
            "tag key {key:?} is reserved or empty"
        )));
    }
    Ok(())
}

/// What becomes of an invalid tag: a `tagSpecification_N` whose template
/// fails or whose key is reserved, an `--extra-tags` entry with a reserved
/// key. The Go driver's `--warn-on-invalid-tag` (`WarnOnInvalidTag`:
/// `pkg/driver/validation.go` `validateExtraTags`, `pkg/util/template`
/// `Evaluate`) chooses [`InvalidTags::Skip`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InvalidTags {
    /// The request is refused: INVALID_ARGUMENT naming the tag.
    #[default]
    Refuse,
    /// The tag is left out, with a warning naming it and why.
    Skip,
}

impl InvalidTags {
    /// `parsed` as this policy takes it: the tag, or nothing (logged), or
    /// the error.
    ///
    /// # Errors
    /// `parsed`'s error under [`InvalidTags::Refuse`].
    pub fn take<T>(self, parsed: Result<T, ControllerError>) -> Result<Option<T>, ControllerError> {
        match (parsed, self) {
            (Ok(tag), _) => Ok(Some(tag)),
            (Err(e), Self::Skip) => {
                tracing::warn!(error = %e, "an invalid tag is left out (--warn-on-invalid-tag)");
                Ok(None)
            }
            (Err(e), Self::Refuse) => Err(e),
        }
    }
}

/// Parses a `tagSpecification_N` value `key=value`: as the Go driver
/// (`pkg/util/template/template.go`), split at the first `=`, the value
/// then expanded as a template ([`template::expand`]: fields such as
/// `{{ .PVCName }}`, the driver's functions and pipelines) with `fields`.
///
/// # Errors
/// INVALID_ARGUMENT for a value without `=`, a template that cannot be
/// expanded, or a reserved key.
pub fn parse_specification(value: &str, fields: &[(&str, String)]) -> Result<(String, String), ControllerError> {
    let (key, value) = value
        .split_once('=')
        .ok_or_else(|| ControllerError::InvalidArgument(format!("tag specification {value:?} is not key=value")))?;
    check_key(key)?;
    let value = template::expand(value, fields).map_err(|e| ControllerError::InvalidArgument(e.to_string()))?;
    Ok((key.to_owned(), value))
}

/// The tags of every resource the driver creates, named `name` (the CSI
/// volume or snapshot name): the cluster marker, `--extra-tags`, and with
/// `--k8s-tag-cluster-id` the four tags the Go driver adds for it
/// (`kubernetes.io/cluster/<id>=owned`, `Name=<id>-dynamic-<name>`,
/// `KubernetesCluster=<id>`, `ebs.csi.aws.com/cluster-name=<id>`;
/// aws-ebs-csi-driver pkg/driver/controller.go, CreateVolume and
/// CreateSnapshot).
pub fn common(cluster_id: Option<&str>, name: &str, extra: &Tags) -> Tags {
    let mut tags = extra.clone();
    tags.insert(CLUSTER.to_owned(), "true".to_owned());
    if let Some(id) = cluster_id {
        tags.insert(format!("{CLUSTER_ID_PREFIX}{id}"), "owned".to_owned());
        tags.insert(NAME.to_owned(), format!("{id}-dynamic-{name}"));
        tags.insert(KUBERNETES_CLUSTER.to_owned(), id.to_owned());
        tags.insert(CLUSTER_NAME.to_owned(), id.to_owned());
    }
    tags
}

/// Parses `--extra-tags k=v,k2=v2`; an entry with a reserved key is
/// refused or left out as `invalid` says.
///
/// # Errors
/// A message for an entry without `=`, or with a reserved key under
/// [`InvalidTags::Refuse`].
pub fn parse_extra(text: &str, invalid: InvalidTags) -> Result<Tags, String> {
    let mut tags = Tags::new();
    for entry in text.split(',').filter(|e| !e.trim().is_empty()) {
        let (k, v) = entry
            .split_once('=')
            .ok_or_else(|| format!("extra tag {entry:?} is not key=value"))?;
        let (k, v) = (k.trim(), v.trim());
        if let Some(()) = invalid.take(check_key(k)).map_err(|e| e.to_string())? {
            tags.insert(k.to_owned(), v.to_owned());
        }
    }
    Ok(tags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_templates_and_refuses_reserved_keys() {
        let fields = [("PVCName", "data".to_owned()), ("PVCNamespace", "shop".to_owned())];
        assert_eq!(
            parse_specification("owner={{ .PVCNamespace }}/{{.PVCName}}", &fields).unwrap(),
            ("owner".to_owned(), "shop/data".to_owned())
        );
        assert_eq!(
            parse_specification("a=b=c", &fields).unwrap(),
            ("a".to_owned(), "b=c".to_owned())
        );
        for bad in [
            "novalue",
            "x={{ .PVName }}",
            "x={{ .PVCName",
            "CSIVolumeName=x",
            "aws:foo=x",
            "kubernetes.io/cluster/a=owned",
            "=x",
        ] {
            assert!(parse_specification(bad, &fields).is_err(), "{bad}");
        }
    }

    #[test]
    fn builds_common_tags() {
        let extra = parse_extra("team=storage, env=prod", InvalidTags::Refuse).unwrap();
        let tags = common(Some("prod-1"), "pvc-1", &extra);
        let expected: Tags = [
            ("ebs.csi.aws.com/cluster", "true"),
            ("kubernetes.io/cluster/prod-1", "owned"),
            ("Name", "prod-1-dynamic-pvc-1"),
            ("KubernetesCluster", "prod-1"),
            ("ebs.csi.aws.com/cluster-name", "prod-1"),
            ("team", "storage"),
            ("env", "prod"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(tags, expected);
        assert_eq!(
            common(None, "pvc-1", &Tags::new()).len(),
            1,
            "no cluster id: the marker alone"
        );
        assert!(parse_extra("broken", InvalidTags::Skip).is_err(), "not a tag at all");
        assert!(parse_extra("CSIVolumeName=x", InvalidTags::Refuse).is_err());
        assert!(parse_extra("ebs.csi.aws.com/cluster-name=other", InvalidTags::Refuse).is_err());
        let kept = parse_extra("CSIVolumeName=x,team=storage", InvalidTags::Skip).unwrap();
        assert_eq!(kept, Tags::from([("team".to_owned(), "storage".to_owned())]));
    }
}
