//! CreateVolume, DeleteVolume, ValidateVolumeCapabilities,
//! ControllerGetVolume and ListVolumes.

use ebs_csi_helper_proto::{FormatOptions, FsType};
use ebs_csi_proto::format_context;
use ebs_csi_proto::v1::controller_get_volume_response;
use ebs_csi_proto::v1::list_volumes_response;
use ebs_csi_proto::v1::validate_volume_capabilities_response::Confirmed;
use ebs_csi_proto::v1::volume_capability::AccessType;
use ebs_csi_proto::v1::volume_content_source::{self, SnapshotSource};
use ebs_csi_proto::v1::*;

use super::capability;
use super::topology;
use super::wait::{self, Look};
use super::{ControllerService, GIB, gib_ceil, required};
use crate::ec2::{AttachmentState, CreateVolumeInput, Ec2, Ec2Error, Selector, Volume, VolumeState};
use crate::error::ControllerError;
use crate::parameters;
use crate::tags;
use crate::volume_type::{self, VolumeType};

/// Size of a volume created without a capacity range, in GiB (the Go
/// driver's default).
const DEFAULT_SIZE_GIB: i64 = 100;

/// The size in GiB for a capacity range: the requested bytes rounded up to
/// GiB, at least the type's minimum, at most the limit.
fn size_gib(range: Option<&CapacityRange>, kind: &VolumeType, at_least_gib: i64) -> Result<i32, ControllerError> {
    let required = range.map_or(0, |r| r.required_bytes);
    let limit = range.map_or(0, |r| r.limit_bytes);
    if required < 0 || limit < 0 || (limit > 0 && required > limit) {
        return Err(ControllerError::InvalidArgument(format!(
            "capacity range {required}..{limit} bytes is invalid"
        )));
    }
    let wanted = if required > 0 {
        gib_ceil(required)
    } else if limit > 0 {
        DEFAULT_SIZE_GIB.min(limit / GIB)
    } else {
        DEFAULT_SIZE_GIB
    };
    let size = wanted.max(i64::from(kind.min_gib)).max(at_least_gib);
    if limit > 0 && size * GIB > limit {
        return Err(ControllerError::OutOfRange(format!(
            "{} volumes of {size} GiB (the smallest that fits) exceed the limit of {limit} bytes",
            kind.name
        )));
    }
    kind.check_size(size)?;
    i32::try_from(size).map_err(|_| ControllerError::OutOfRange(format!("{size} GiB is too large")))
}

/// A volume as CSI reports it.
fn csi_volume(v: &Volume, context: std::collections::HashMap<String, String>) -> ebs_csi_proto::v1::Volume {
    ebs_csi_proto::v1::Volume {
        volume_id: v.id.clone(),
        capacity_bytes: i64::from(v.size_gib) * GIB,
        volume_context: context,
        content_source: v.snapshot_id.as_ref().map(|id| VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(SnapshotSource {
                snapshot_id: id.clone(),
            })),
        }),
        accessible_topology: vec![topology::topology(&v.zone, None, v.outpost_arn.as_deref())],
    }
}

/// Nodes the volume is attached to (or being attached to).
fn published_nodes(v: &Volume) -> Vec<String> {
    v.attachments
        .iter()
        .filter(|a| {
            matches!(
                a.state,
                AttachmentState::Attaching | AttachmentState::Attached | AttachmentState::Busy
            )
        })
        .map(|a| a.instance_id.clone())
        .collect()
}

/// Whether an existing volume satisfies a repeated CreateVolume: what the
/// request set must hold. Encryption only when asked for: EC2 encrypts
/// volumes the request did not (encryption by default, an encrypted
/// snapshot or source volume).
fn matches_request(v: &Volume, input: &CreateVolumeInput) -> bool {
    v.size_gib == input.size_gib
        && v.volume_type == input.volume_type
        && input.iops.is_none_or(|iops| v.iops == Some(iops))
        && input.throughput.is_none_or(|t| v.throughput == Some(t))
        && (v.encrypted || !input.encrypted)
        && v.snapshot_id == input.snapshot_id
        && v.multi_attach == input.multi_attach
}

/// Paginates `items` (sorted by id) after `token` (the last id returned).
pub(super) fn page<T>(
    items: Vec<T>,
    id: impl Fn(&T) -> &str,
    token: &str,
    max: i32,
) -> Result<(Vec<T>, String), ControllerError> {
    let start = if token.is_empty() {
        0
    } else {
        items
            .iter()
            .position(|item| id(item) == token)
            .map(|i| i + 1)
            .ok_or_else(|| ControllerError::Aborted(format!("starting_token {token:?} is not valid")))?
    };
    let max = usize::try_from(max).ok().filter(|m| *m > 0).unwrap_or(usize::MAX);
    let rest: Vec<T> = items.into_iter().skip(start).collect();
    let more = rest.len() > max;
    let page: Vec<T> = rest.into_iter().take(max).collect();
    let next = if more {
        page.last().map(|item| id(item).to_owned()).unwrap_or_default()
    } else {
        String::new()
    };
    Ok((page, next))
}

/// A clone is made by CopyVolumes, which takes neither a zone nor an
/// encryption setting (EC2 API Reference, CopyVolumes): it lands in its
/// source's zone with its source's encryption. A request that asks for
/// something else is refused before EC2 is called.
///
/// # Errors
/// RESOURCE_EXHAUSTED when the requisite topology leaves out the source's
/// zone (CSI spec, CreateVolume: unable to provision in the topology);
/// INVALID_ARGUMENT when encryption is asked of an unencrypted source, or
/// a KMS key (an ARN or key id; an alias cannot be resolved here) other
/// than the source's.
fn check_clone(
    source: &Volume,
    source_zone_id: Option<&str>,
    p: &parameters::VolumeParameters,
    requirement: Option<&TopologyRequirement>,
) -> Result<(), ControllerError> {
    if !topology::allows(requirement, &source.zone, source_zone_id) {
        return Err(ControllerError::ResourceExhausted(format!(
            "the source volume {} is in {}, outside the requisite topology; a clone stays in its source's zone",
            source.id, source.zone
        )));
    }
    let invalid = |m: String| Err(ControllerError::InvalidArgument(m));
    if (p.encrypted || p.kms_key_id.is_some()) && !source.encrypted {
        return invalid(format!(
            "the source volume {} is not encrypted, and a clone keeps its source's encryption",
            source.id
        ));
    }
    let source_key = source.kms_key_id.as_deref().unwrap_or_default();
    let is_alias = |key: &str| key.starts_with("alias/") || key.contains(":alias/");
    let is_source_key = |key: &str| key == source_key || source_key.ends_with(&format!("key/{key}"));
    if p.kms_key_id
        .as_deref()
        .is_some_and(|key| !is_alias(key) && !is_source_key(key))
    {
        return invalid(format!(
            "the source volume {} is encrypted with {source_key}, and a clone keeps its source's key",
            source.id
        ));
    }
    Ok(())
}

/// Checks the class's formatting options against the filesystem the
/// capability asks for, as the Go driver does (the external-provisioner
/// does not pass `csi.storage.k8s.io/fstype` on, so the parameter alone
/// would let an xfs volume take ext-only options, which fail only at
/// NodeStageVolume).
///
/// # Errors
/// INVALID_ARGUMENT for options a block volume would never use, or that
/// the filesystem does not take.
fn check_format_options(
    p: &parameters::VolumeParameters,
    capabilities: &[VolumeCapability],
    block: bool,
) -> Result<(), ControllerError> {
    if p.format == FormatOptions::default() {
        return Ok(());
    }
    if block {
        return Err(ControllerError::InvalidArgument(
            "formatting options (blockSize, inodeSize, …) do not apply to a block volume".into(),
        ));
    }
    let asked = capabilities.iter().find_map(|c| match &c.access_type {
        Some(AccessType::Mount(m)) => FsType::from_name(&m.fs_type.to_ascii_lowercase()),
        _ => None,
    });
    p.format
        .validate(asked.or(p.fs_type).unwrap_or(FsType::Ext4))
        .map_err(ControllerError::InvalidArgument)
}

impl<E: Ec2> ControllerService<E> {
    /// The id of the zone `name` where the CO's topologies carry zone ids
    /// (and so must the volume's), else `None` without an EC2 call.
    ///
    /// # Errors
    /// The DescribeAvailabilityZones error.
    async fn zone_id(&self, requirement: Option<&TopologyRequirement>, name: &str) -> Result<Option<String>, Ec2Error> {
        if !topology::uses_zone_ids(requirement) {
            return Ok(None);
        }
        Ok(self.zones.zone(self.ec2.as_ref(), name).await?.map(|z| z.id))
    }

    pub(super) async fn create(&self, r: CreateVolumeRequest) -> Result<CreateVolumeResponse, ControllerError> {
        let name = required("name", &r.name)?;
        let needs = capability::check(&r.volume_capabilities)?;
        let p = parameters::volume(&r.parameters, self.settings.invalid_tags)?
            .with(parameters::mutation(&r.mutable_parameters, self.settings.invalid_tags)?);
        check_format_options(&p, &r.volume_capabilities, needs.block)?;
        let kind = volume_type::lookup(p.volume_type.as_deref().unwrap_or(volume_type::DEFAULT))?;
        if needs.multi_attach && !kind.multi_attach {
            return Err(ControllerError::InvalidArgument(format!(
                "{} volumes cannot be attached to several nodes",
                kind.name
            )));
        }
        let (snapshot, source) = match r.volume_content_source.as_ref().and_then(|s| s.r#type.as_ref()) {
            Some(volume_content_source::Type::Snapshot(s)) => {
                let id = required("snapshot_id", &s.snapshot_id)?;
                let snapshot = self.describe.snapshots.get(id).await?;
                (
                    Some(snapshot.ok_or_else(|| ControllerError::NotFound(format!("snapshot {id} not found")))?),
                    None,
                )
            }
            Some(volume_content_source::Type::Volume(v)) => {
                (None, Some(self.existing(required("volume_id", &v.volume_id)?).await?))
            }
            None => (None, None),
        };
        let at_least = snapshot
            .as_ref()
            .map(|s| s.size_gib)
            .or(source.as_ref().map(|v| v.size_gib))
            .unwrap_or_default();
        if p.initialization_rate.is_some() && snapshot.is_none() {
            // EC2 refuses it too: only a volume restored from a snapshot
            // is initialized (EC2 API Reference, CreateVolume).
            return Err(ControllerError::InvalidArgument(
                "volumeInitializationRate applies only to a volume restored from a snapshot".to_owned(),
            ));
        }
        let size_gib = size_gib(r.capacity_range.as_ref(), &kind, i64::from(at_least))?;
        let _guard = self.in_flight.acquire(name)?;
        let requirement = r.accessibility_requirements.as_ref();
        let zone = match &source {
            Some(v) => {
                check_clone(v, self.zone_id(requirement, &v.zone).await?.as_deref(), &p, requirement)?;
                v.zone.clone()
            }
            None => {
                self.zones
                    .pick(name, r.accessibility_requirements.as_ref(), self.ec2.as_ref())
                    .await?
            }
        };
        let mut volume_tags = tags::common(self.settings.cluster_id.as_deref(), name, &self.settings.extra_tags);
        volume_tags.extend(p.tags);
        volume_tags.insert(tags::VOLUME_NAME.to_owned(), name.to_owned());
        // Once the zone is known: its IOPS maximum caps them (a dry run,
        // only where IOPS are asked).
        let kind = if p.iops.is_some() || p.iops_per_gib.is_some() {
            self.iops_ceilings
                .in_zone(self.ec2.as_ref(), kind, &zone, &volume_tags)
                .await
        } else {
            kind
        };
        let iops = kind.resolve_iops(size_gib, p.iops, p.iops_per_gib, p.allow_iops_increase)?;
        let input = CreateVolumeInput {
            zone,
            size_gib,
            volume_type: kind.name.to_owned(),
            iops,
            throughput: p.throughput,
            // A KMS key implies encryption, as in the Go driver.
            encrypted: p.encrypted || p.kms_key_id.is_some(),
            kms_key_id: p.kms_key_id,
            snapshot_id: snapshot.map(|s| s.id),
            initialization_rate: p.initialization_rate,
            multi_attach: needs.multi_attach,
            outpost_arn: topology::outpost_of(requirement),
            tags: volume_tags,
            client_token: self.tokens.token(name),
        };
        // A volume deleted here that DescribeVolumes still lists is gone.
        let found = self
            .describe
            .volumes_by_name
            .get(name)
            .await?
            .filter(|v| !self.tokens.deleted_here(&v.id));
        let (volume, made_here) = match found {
            Some(v) if matches_request(&v, &input) => (v, false),
            Some(v) => {
                return Err(ControllerError::AlreadyExists(format!(
                    "volume {} named {name} exists with other parameters",
                    v.id
                )));
            }
            None => match self.create_or_copy(source.as_ref(), input).await {
                Ok(v) => (v, true),
                Err(Ec2Error::IdempotentParameterMismatch(m)) => {
                    self.tokens.rotate(name);
                    return Err(ControllerError::AlreadyExists(format!(
                        "a volume named {name} was requested with other parameters: {m}; the next attempt uses a new client token"
                    )));
                }
                Err(e) => return Err(e.into()),
            },
        };
        tracing::info!(volume_id = %volume.id, name, zone = %volume.zone, size_gib, made_here, "volume created");
        self.tokens.made(&volume.id, name);
        let volume = self.wait_usable(name, volume, made_here).await?;
        let mut context = format_context::to_context(&p.format);
        if let Some(fs) = p.fs_type {
            context.insert("csi.storage.k8s.io/fstype".to_owned(), fs.name().to_owned());
        }
        if p.block_attach_until_initialized {
            context.insert(parameters::BLOCK_ATTACH_UNTIL_INITIALIZED.to_owned(), "true".to_owned());
        }
        // The source as the request named it (CSI spec, CreateVolume: a
        // volume created from a source reports it; external-provisioner
        // deletes a clone whose reply lacks it).
        let zone_id = self.zone_id(requirement, &volume.zone).await?;
        let volume = ebs_csi_proto::v1::Volume {
            content_source: r.volume_content_source.clone(),
            accessible_topology: vec![topology::topology(
                &volume.zone,
                zone_id.as_deref(),
                volume.outpost_arn.as_deref(),
            )],
            ..csi_volume(&volume, context)
        };
        Ok(CreateVolumeResponse { volume: Some(volume) })
    }

    /// CreateVolume, or CopyVolumes when the content source is a volume.
    async fn create_or_copy(&self, source: Option<&Volume>, input: CreateVolumeInput) -> Result<Volume, Ec2Error> {
        match source {
            Some(source) => self.ec2.copy_volume(&source.id, input).await,
            None => self.ec2.create_volume(input).await,
        }
    }

    /// Waits until EC2 describes the volume `available`, or `in-use` (a
    /// repeated CreateVolume for a volume a pod already uses: the Go
    /// driver's v1.58 accepts it too).
    ///
    /// EC2 answers CreateVolume with the volume `creating`, and its API is
    /// eventually consistent (Amazon EC2 Developer Guide, "Eventual
    /// consistency in the Amazon EC2 API"): the new volume may be missing
    /// from DescribeVolumes for a while. Missing is looked at again, like
    /// `creating`, until the create timeout — also for a volume the answer
    /// says is `available`: EC2 answers a reused client token with the
    /// volume in its state now, listed or not, and a CO that deleted it
    /// before it was listed would get InvalidVolume.NotFound, which
    /// DeleteVolume takes for gone (the chaos run's leaked volume).
    ///
    /// The controller deletes a volume only when a DeleteVolume RPC names
    /// it, with one exception: a volume this call's CreateVolume or
    /// CopyVolumes answered with (`made_here`) that EC2 then reports in
    /// state `error` — the creation failed, it never held data, and the
    /// name's next attempt takes a new client token. A volume EC2 answered
    /// with that is `deleting` or `deleted` is an earlier volume of the
    /// same name that EC2 still keeps the token for (one deleted before a
    /// restart forgot it): the next attempt takes a new token too.
    ///
    /// # Errors
    /// UNAVAILABLE at the create timeout (the CO's retry finds the volume
    /// by name, or EC2 returns it for the same client token) and for an
    /// earlier, deleted volume; INTERNAL for a volume in `error`, or one
    /// found by name that went to `deleting` or `deleted`.
    async fn wait_usable(&self, name: &str, volume: Volume, made_here: bool) -> Result<Volume, ControllerError> {
        let id = volume.id.clone();
        // EC2 answers a token whose volume is deleted with it in its state
        // now, which DescribeVolumes no longer shows.
        let ended = if matches!(volume.state, VolumeState::Deleting | VolumeState::Deleted) {
            Err(volume.state)
        } else {
            wait::until(
                &format!("volume {id} to become available (still creating, or not yet visible to DescribeVolumes)"),
                self.settings.create_timeout,
                self.cadence(),
                || async {
                    Ok(match self.describe.volumes.get(&id).await? {
                        Some(v) if matches!(v.state, VolumeState::Available | VolumeState::InUse) => Look::Done(Ok(v)),
                        None => Look::Again,
                        Some(v) if v.state == VolumeState::Creating => Look::Again,
                        Some(v) => Look::Done(Err(v.state)),
                    })
                },
            )
            .await?
        };
        let state = match ended {
            Ok(v) => return Ok(v),
            Err(state) => state,
        };
        if made_here {
            self.tokens.deleted(&id);
        }
        if made_here && matches!(state, VolumeState::Deleting | VolumeState::Deleted) {
            return Err(ControllerError::Unavailable(format!(
                "EC2 answered this name's client token with volume {id}, an earlier volume named {name} that is \
                 {state:?}; the next attempt uses a new client token"
            )));
        }
        if state == VolumeState::Error && made_here {
            tracing::error!(volume_id = %id, name, "EC2 failed to create the volume; deleting it");
            if let Err(e) = self.ec2.delete_volume(&id).await {
                tracing::error!(volume_id = %id, error = %e, "could not delete the failed volume");
            }
        }
        Err(ControllerError::Internal(format!(
            "volume {id} went to state {state:?} while creating"
        )))
    }

    pub(super) async fn delete(&self, r: DeleteVolumeRequest) -> Result<DeleteVolumeResponse, ControllerError> {
        let volume_id = required("volume_id", &r.volume_id)?;
        let _guard = self.in_flight.acquire(volume_id)?;
        match self.ec2.delete_volume(volume_id).await {
            Ok(()) | Err(Ec2Error::NotFound(_)) => {
                self.tokens.deleted(volume_id);
                tracing::info!(volume_id, "volume deleted");
                Ok(DeleteVolumeResponse {})
            }
            Err(Ec2Error::IncorrectState(m)) => Err(ControllerError::FailedPrecondition(format!(
                "volume {volume_id} is attached: {m}"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) async fn existing(&self, volume_id: &str) -> Result<Volume, ControllerError> {
        self.describe
            .volumes
            .get(volume_id)
            .await?
            .filter(|v| !matches!(v.state, VolumeState::Deleted | VolumeState::Deleting))
            .ok_or_else(|| ControllerError::NotFound(format!("volume {volume_id} not found")))
    }

    pub(super) async fn validate(
        &self,
        r: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, ControllerError> {
        let volume_id = required("volume_id", &r.volume_id)?;
        if r.volume_capabilities.is_empty() {
            return Err(ControllerError::InvalidArgument(
                "volume_capabilities are required".into(),
            ));
        }
        let volume = self.existing(volume_id).await?;
        let supported =
            capability::check(&r.volume_capabilities).is_ok_and(|needs| !needs.multi_attach || volume.multi_attach);
        Ok(ValidateVolumeCapabilitiesResponse {
            confirmed: supported.then(|| Confirmed {
                volume_context: r.volume_context.clone(),
                volume_capabilities: r.volume_capabilities.clone(),
                parameters: r.parameters.clone(),
                mutable_parameters: r.mutable_parameters.clone(),
            }),
            message: if supported {
                String::new()
            } else {
                "a capability is not supported by this volume".into()
            },
        })
    }

    pub(super) async fn get(
        &self,
        r: ControllerGetVolumeRequest,
    ) -> Result<ControllerGetVolumeResponse, ControllerError> {
        let volume = self.existing(required("volume_id", &r.volume_id)?).await?;
        let volume_condition = match self.ec2.describe_volume_status(&volume.id).await {
            Ok(Some(health)) if volume.state != VolumeState::Error => VolumeCondition {
                abnormal: health.impaired,
                message: health.detail,
            },
            Ok(_) => condition(&volume),
            Err(e) => {
                tracing::warn!(volume_id = %volume.id, error = %e, "no volume status; the condition comes from the volume state");
                condition(&volume)
            }
        };
        Ok(ControllerGetVolumeResponse {
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: published_nodes(&volume),
                volume_condition: Some(volume_condition),
            }),
            volume: Some(csi_volume(&volume, Default::default())),
        })
    }

    pub(super) async fn list(&self, r: ListVolumesRequest) -> Result<ListVolumesResponse, ControllerError> {
        let mut volumes = self
            .ec2
            .describe_volumes(Selector::TagKey(tags::CLUSTER.to_owned()))
            .await?;
        // EC2 still describes a deleted volume for a while, `deleting` or
        // `deleted` (Amazon EC2 User Guide, "Amazon EBS volume lifecycle"):
        // after DeleteVolume succeeded it is no volume of the CO's
        // (csi-sanity's ListVolumes spec counts it gone at once).
        volumes.retain(|v| !matches!(v.state, VolumeState::Deleting | VolumeState::Deleted));
        volumes.sort_by(|a, b| a.id.cmp(&b.id));
        let (volumes, next_token) = page(volumes, |v| &v.id, &r.starting_token, r.max_entries)?;
        Ok(ListVolumesResponse {
            entries: volumes
                .iter()
                .map(|v| list_volumes_response::Entry {
                    volume: Some(csi_volume(v, Default::default())),
                    status: Some(list_volumes_response::VolumeStatus {
                        published_node_ids: published_nodes(v),
                        volume_condition: Some(condition(v)),
                    }),
                })
                .collect(),
            next_token,
        })
    }
}

fn condition(v: &Volume) -> VolumeCondition {
    match v.state {
        VolumeState::Error => VolumeCondition {
            abnormal: true,
            message: "the volume is in the error state".into(),
        },
        _ => VolumeCondition {
            abnormal: false,
            message: "ok".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_and_respect_limits() {
        let gp3 = volume_type::lookup("gp3").unwrap();
        let range = |required: i64, limit: i64| {
            Some(CapacityRange {
                required_bytes: required,
                limit_bytes: limit,
            })
        };
        assert_eq!(size_gib(None, &gp3, 0).unwrap(), 100);
        assert_eq!(size_gib(range(1, 0).as_ref(), &gp3, 0).unwrap(), 1);
        assert_eq!(size_gib(range(GIB + 1, 0).as_ref(), &gp3, 0).unwrap(), 2);
        assert_eq!(size_gib(range(0, 10 * GIB).as_ref(), &gp3, 0).unwrap(), 10);
        assert_eq!(
            size_gib(range(GIB, 0).as_ref(), &gp3, 8).unwrap(),
            8,
            "at least the snapshot's size"
        );
        let io1 = volume_type::lookup("io1").unwrap();
        assert_eq!(
            size_gib(range(GIB, 0).as_ref(), &io1, 0).unwrap(),
            4,
            "the type's minimum"
        );
        assert!(matches!(
            size_gib(range(GIB, 2 * GIB).as_ref(), &io1, 0),
            Err(ControllerError::OutOfRange(_))
        ));
        assert!(matches!(
            size_gib(range(70_000 * GIB, 0).as_ref(), &gp3, 0),
            Err(ControllerError::OutOfRange(_))
        ));
        assert!(size_gib(range(5 * GIB, GIB).as_ref(), &gp3, 0).is_err());
    }

    #[test]
    fn pages_after_the_token() {
        let ids: Vec<String> = (1..=5).map(|i| format!("vol-{i}")).collect();
        let (first, next) = page(ids.clone(), |s| s, "", 2).unwrap();
        assert_eq!(
            (first, next.as_str()),
            (vec!["vol-1".to_owned(), "vol-2".to_owned()], "vol-2")
        );
        let (rest, next) = page(ids.clone(), |s| s, "vol-4", 0).unwrap();
        assert_eq!((rest, next.as_str()), (vec!["vol-5".to_owned()], ""));
        assert!(matches!(page(ids, |s| s, "bogus", 2), Err(ControllerError::Aborted(_))));
    }
}
