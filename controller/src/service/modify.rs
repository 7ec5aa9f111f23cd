//! ControllerExpandVolume and ControllerModifyVolume, through one
//! per-volume coalescer: EC2 allows one modification per volume every six
//! hours, so requests that arrive within the handler window (a resize and
//! a VolumeAttributesClass change, say) become a single ModifyVolume.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ebs_csi_proto::v1::volume_capability::AccessType;
use ebs_csi_proto::v1::{
    ControllerExpandVolumeRequest, ControllerExpandVolumeResponse, ControllerModifyVolumeRequest,
    ControllerModifyVolumeResponse,
};
use tokio::sync::oneshot;

use super::wait::{self, Look};
use super::{ControllerService, GIB, gib_ceil, required};
use crate::ec2::{Ec2, Ec2Error, ModificationState, ModifyVolumeInput, Volume};
use crate::error::ControllerError;
use crate::parameters;
use crate::tags;
use crate::volume_type;

type Waiter = oneshot::Sender<Result<(), Ec2Error>>;

/// Per volume: the merged request and everyone waiting for it.
type Pending = Arc<Mutex<HashMap<String, (ModifyVolumeInput, Vec<Waiter>)>>>;

/// Collects modification requests per volume for a window, then sends one
/// ModifyVolume for all of them.
pub struct Coalescer<E: Ec2> {
    ec2: Arc<E>,
    window: Duration,
    pending: Pending,
}

/// Merges `from` into `into`: the larger size wins; other properties must
/// agree.
fn merge(into: &mut ModifyVolumeInput, from: &ModifyVolumeInput) -> Result<(), ControllerError> {
    into.size_gib = into.size_gib.max(from.size_gib);
    fn agree<T: PartialEq + Clone + std::fmt::Debug>(
        name: &str,
        into: &mut Option<T>,
        from: &Option<T>,
    ) -> Result<(), ControllerError> {
        match (into.as_ref(), from) {
            (Some(a), Some(b)) if a != b => Err(ControllerError::Aborted(format!(
                "a concurrent modification sets {name} to {a:?}, not {b:?}; retry"
            ))),
            (None, Some(b)) => {
                *into = Some(b.clone());
                Ok(())
            }
            _ => Ok(()),
        }
    }
    agree("type", &mut into.volume_type, &from.volume_type)?;
    agree("iops", &mut into.iops, &from.iops)?;
    agree("throughput", &mut into.throughput, &from.throughput)
}

impl<E: Ec2> Coalescer<E> {
    /// A coalescer that waits `window` after a volume's first request.
    pub fn new(ec2: Arc<E>, window: Duration) -> Self {
        Self {
            ec2,
            window,
            pending: Arc::default(),
        }
    }

    /// Adds `input` to the volume's pending modification and waits until
    /// EC2 has accepted (or refused) the merged ModifyVolume.
    ///
    /// # Errors
    /// ABORTED when it conflicts with a pending request; the EC2 error.
    pub async fn modify(&self, volume_id: &str, input: ModifyVolumeInput) -> Result<(), ControllerError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((merged, waiters)) = pending.get_mut(volume_id) {
                merge(merged, &input)?;
                waiters.push(tx);
            } else {
                pending.insert(volume_id.to_owned(), (input, vec![tx]));
                let (ec2, pending, window, id) = (
                    Arc::clone(&self.ec2),
                    Arc::clone(&self.pending),
                    self.window,
                    volume_id.to_owned(),
                );
                tokio::spawn(async move {
                    tokio::time::sleep(window).await;
                    let Some((input, waiters)) = pending.lock().unwrap_or_else(PoisonError::into_inner).remove(&id)
                    else {
                        return;
                    };
                    tracing::info!(volume_id = %id, ?input, requests = waiters.len(), "modifying volume");
                    let result = ec2.modify_volume(&id, input).await;
                    for waiter in waiters {
                        let _ = waiter.send(result.clone());
                    }
                });
            }
        }
        rx.await
            .map_err(|_| ControllerError::Internal("the modification was dropped".into()))?
            .map_err(ControllerError::from)
    }
}

/// `input` without the properties `volume` already has.
fn without_no_ops(volume: &Volume, mut input: ModifyVolumeInput) -> ModifyVolumeInput {
    if input.size_gib.is_some_and(|s| s <= volume.size_gib) {
        input.size_gib = None;
    }
    if input.volume_type.as_deref() == Some(volume.volume_type.as_str()) {
        input.volume_type = None;
    }
    if input.iops.is_some() && input.iops == volume.iops {
        input.iops = None;
    }
    if input.throughput.is_some() && input.throughput == volume.throughput {
        input.throughput = None;
    }
    input
}

/// Whether a volume's tags allow its IOPS to follow its `iopsPerGB`
/// (`allowAutoIOPSIncreaseOnModify`).
fn allows_iops_increase(volume: &Volume) -> bool {
    volume.tags.get(tags::AUTO_IOPS_ON_MODIFY).is_some_and(|v| v == "true")
}

/// The `iopsPerGB` a volume's tags say to keep when it grows
/// (`allowAutoIOPSIncreaseOnModify`).
fn kept_iops_ratio(volume: &Volume) -> Option<i32> {
    let ratio = volume.tags.get(tags::IOPS_PER_GIB).and_then(|v| v.parse::<i32>().ok());
    ratio.filter(|_| allows_iops_increase(volume))
}

/// The `iopsPerGB` of a VolumeAttributesClass that sets the volume's IOPS
/// now (its size × the ratio): as the Go driver's ResizeOrModifyDisk
/// (`pkg/cloud/cloud.go`, `../shared/reviews/parity-go-driver.md` row 4.5),
/// only where `allowAutoIOPSIncreaseOnModify` allows it, from the class or
/// else from the volume's tag. Otherwise the ratio is only recorded on the
/// volume, for a later class or resize that allows it.
fn applied_iops_ratio(volume: &Volume, m: &parameters::Mutation) -> Option<i32> {
    let allowed = m
        .allow_iops_increase_on_modify
        .unwrap_or_else(|| allows_iops_increase(volume));
    m.iops_per_gib.filter(|_| allowed)
}

impl<E: Ec2> ControllerService<E> {
    pub(super) async fn expand(
        &self,
        r: ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse, ControllerError> {
        let volume_id = required("volume_id", &r.volume_id)?;
        let range = r
            .capacity_range
            .ok_or_else(|| ControllerError::InvalidArgument("capacity_range is required".into()))?;
        if range.required_bytes <= 0 || (range.limit_bytes > 0 && range.limit_bytes < range.required_bytes) {
            return Err(ControllerError::InvalidArgument(
                "capacity_range.required_bytes must be positive and within the limit".into(),
            ));
        }
        let volume = self.existing(volume_id).await?;
        let size_gib = i32::try_from(gib_ceil(range.required_bytes))
            .map_err(|_| ControllerError::OutOfRange("size too large".into()))?;
        let block = matches!(
            r.volume_capability.as_ref().and_then(|c| c.access_type.as_ref()),
            Some(AccessType::Block(_))
        );
        if size_gib <= volume.size_gib {
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: i64::from(volume.size_gib) * GIB,
                node_expansion_required: !block,
            });
        }
        volume_type::lookup(&volume.volume_type)?.check_size(i64::from(size_gib))?;
        if range.limit_bytes > 0 && i64::from(size_gib) * GIB > range.limit_bytes {
            return Err(ControllerError::OutOfRange(format!(
                "{size_gib} GiB exceeds the limit of {} bytes",
                range.limit_bytes
            )));
        }
        let input = without_no_ops(
            &volume,
            ModifyVolumeInput {
                size_gib: Some(size_gib),
                iops: self.iops_for_size(&volume, size_gib).await?,
                ..ModifyVolumeInput::default()
            },
        );
        let size = self.apply(&volume, input).await?.max(size_gib);
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: i64::from(size) * GIB,
            node_expansion_required: !block,
        })
    }

    pub(super) async fn modify(
        &self,
        r: ControllerModifyVolumeRequest,
    ) -> Result<ControllerModifyVolumeResponse, ControllerError> {
        let volume_id = required("volume_id", &r.volume_id)?;
        let m = parameters::mutation(&r.mutable_parameters, self.settings.invalid_tags)?;
        let volume = self.existing(volume_id).await?;
        let kind = volume_type::lookup(m.volume_type.as_deref().unwrap_or(&volume.volume_type))?;
        let ratio = applied_iops_ratio(&volume, &m);
        let iops = if m.iops.is_some() || ratio.is_some() {
            let kind = self
                .iops_ceilings
                .in_zone(self.ec2.as_ref(), kind, &volume.zone, &volume.tags)
                .await;
            kind.resolve_iops(volume.size_gib, m.iops, ratio, false)?
        } else {
            None
        };
        let input = without_no_ops(
            &volume,
            ModifyVolumeInput {
                size_gib: None,
                volume_type: m.volume_type,
                iops,
                throughput: m.throughput,
            },
        );
        // Tags first, as the Go driver: a ModifyVolume EC2 refuses (the
        // last modification not completed, or four this day) does not hold
        // them back.
        if !m.add_tags.is_empty() {
            self.ec2.create_tags(volume_id, m.add_tags).await?;
        }
        // Only tags the volume has: deleting others would be a call for nothing.
        let delete_tags: Vec<String> = m
            .delete_tags
            .into_iter()
            .filter(|k| volume.tags.contains_key(k))
            .collect();
        if !delete_tags.is_empty() {
            self.ec2.delete_tags(volume_id, delete_tags).await?;
        }
        if !input.is_empty() {
            self.apply(&volume, input).await?;
        }
        Ok(ControllerModifyVolumeResponse {})
    }

    /// The IOPS that keep a volume's recorded `iopsPerGB` at `size_gib`
    /// where its tags allow that, capped at the zone's maximum as at
    /// creation; never fewer than it has.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a volume type unknown here.
    async fn iops_for_size(&self, volume: &Volume, size_gib: i32) -> Result<Option<i32>, ControllerError> {
        let Some(ratio) = kept_iops_ratio(volume) else {
            return Ok(None);
        };
        let kind = volume_type::lookup(&volume.volume_type)?;
        let kind = self
            .iops_ceilings
            .in_zone(self.ec2.as_ref(), kind, &volume.zone, &volume.tags)
            .await;
        let iops = kind.resolve_iops(size_gib, None, Some(ratio), true)?;
        Ok(iops.filter(|new| volume.iops.is_none_or(|old| *new > old)))
    }

    /// Sends `input` through the coalescer and waits until the
    /// modification takes effect (`optimizing` or `completed`); returns
    /// the volume's size then, in GiB.
    async fn apply(&self, volume: &Volume, input: ModifyVolumeInput) -> Result<i32, ControllerError> {
        let target = input.size_gib;
        self.coalescer.modify(&volume.id, input).await?;
        let id = volume.id.clone();
        wait::until(
            &format!("the modification of volume {id}"),
            self.settings.state_timeout,
            self.cadence(),
            || async {
                Ok(match self.describe.modifications.get(&id).await? {
                    Some(m) if m.state == ModificationState::Failed => Look::Fail(ControllerError::Internal(format!(
                        "the modification of volume {id} failed"
                    ))),
                    Some(m)
                        if matches!(m.state, ModificationState::Optimizing | ModificationState::Completed)
                            && target.is_none_or(|t| m.target_size_gib.is_some_and(|s| s >= t)) =>
                    {
                        Look::Done(m.target_size_gib.unwrap_or(volume.size_gib))
                    }
                    _ => Look::Again,
                })
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_sizes_and_refuses_conflicts() {
        let mut merged = ModifyVolumeInput {
            size_gib: Some(10),
            ..Default::default()
        };
        merge(
            &mut merged,
            &ModifyVolumeInput {
                size_gib: Some(20),
                iops: Some(4000),
                ..Default::default()
            },
        )
        .unwrap();
        merge(
            &mut merged,
            &ModifyVolumeInput {
                size_gib: Some(15),
                volume_type: Some("io2".into()),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            merged,
            ModifyVolumeInput {
                size_gib: Some(20),
                volume_type: Some("io2".into()),
                iops: Some(4000),
                throughput: None
            }
        );
        assert!(
            merge(
                &mut merged,
                &ModifyVolumeInput {
                    iops: Some(5000),
                    ..Default::default()
                }
            )
            .is_err()
        );
    }
}
