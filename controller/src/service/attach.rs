//! ControllerPublishVolume and ControllerUnpublishVolume: AttachVolume and
//! DetachVolume, with device names and waits.

use std::collections::HashMap;

use ebs_csi_proto::v1::{
    ControllerPublishVolumeRequest, ControllerPublishVolumeResponse, ControllerUnpublishVolumeRequest,
    ControllerUnpublishVolumeResponse,
};

use super::capability;
use super::wait::{self, Look};
use super::{ControllerService, required};
use crate::devices::Reservation;
use crate::ec2::{AttachmentState, Ec2, Ec2Error, Instance, Volume};
use crate::error::ControllerError;
use crate::parameters;

/// The publish-context key the node reads the device name from (the Go
/// driver's, which Nomad and kubelet pass through).
pub const DEVICE_PATH_KEY: &str = "devicePath";

/// Device names tried for one publish before giving up (EC2 may refuse a
/// name that is in use on the instance but not in its block-device map).
const NAME_ATTEMPTS: usize = 3;

fn attachment_on<'a>(volume: &'a Volume, instance_id: &str) -> Option<&'a crate::ec2::Attachment> {
    volume
        .attachments
        .iter()
        .find(|a| a.instance_id == instance_id && a.state != AttachmentState::Detached)
}

/// Whether the volume's class set `blockAttachUntilInitialized` (the key
/// read case-insensitively, as the Go driver's node reads its context).
fn holds_until_initialized(context: &HashMap<String, String>) -> bool {
    context
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case(parameters::BLOCK_ATTACH_UNTIL_INITIALIZED) && v == "true")
}

impl<E: Ec2> ControllerService<E> {
    /// Refuses to attach a volume EC2 still initializes from its snapshot
    /// (DescribeVolumeStatus's `initialization-state`), for
    /// `blockAttachUntilInitialized`: the CO retries the publish with its
    /// backoff until initialization completes.
    ///
    /// # Errors
    /// UNAVAILABLE naming the progress EC2 reports; the DescribeVolumeStatus
    /// error when there is no status to go by.
    async fn check_initialized(&self, volume_id: &str) -> Result<(), ControllerError> {
        let Some(initializing) = self
            .ec2
            .describe_volume_status(volume_id)
            .await?
            .and_then(|health| health.initializing)
        else {
            return Ok(());
        };
        let progress = initializing
            .progress_percent
            .map_or_else(String::new, |p| format!(", {p}% done"));
        let left = initializing
            .seconds_left
            .map_or_else(String::new, |s| format!(", about {s} s left"));
        Err(ControllerError::Unavailable(format!(
            "volume {volume_id} is still being initialized from its snapshot{progress}{left}; \
             blockAttachUntilInitialized holds the attachment until it is done"
        )))
    }

    pub(super) async fn publish(
        &self,
        r: ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse, ControllerError> {
        let volume_id = required("volume_id", &r.volume_id)?;
        let node_id = required("node_id", &r.node_id)?;
        capability::check(r.volume_capability.as_slice())?;
        let _guard = self.in_flight.acquire(&format!("{volume_id}/{node_id}"))?;
        let volume = self.existing(volume_id).await?;
        let instance = self
            .describe
            .instances
            .get(node_id)
            .await?
            .ok_or_else(|| ControllerError::NotFound(format!("node {node_id} (EC2 instance) not found")))?;
        // The name stays reserved until the attachment is confirmed (like
        // the Go driver's device manager): a concurrent publish to the node
        // must not pick it from a block-device map that does not show it yet.
        let (device, _reserved) = match attachment_on(&volume, node_id) {
            Some(existing) => (existing.device.clone(), None),
            None => {
                if holds_until_initialized(&r.volume_context) {
                    self.check_initialized(volume_id).await?;
                }
                let elsewhere: Vec<&str> = volume
                    .attachments
                    .iter()
                    .filter(|a| a.state != AttachmentState::Detached)
                    .map(|a| a.instance_id.as_str())
                    .collect();
                if !elsewhere.is_empty() && !volume.multi_attach {
                    return Err(ControllerError::FailedPrecondition(format!(
                        "volume {volume_id} is attached to node {}",
                        elsewhere.join(", ")
                    )));
                }
                let reservation = self.attach(volume_id, &instance).await?;
                (reservation.name.clone(), Some(reservation))
            }
        };
        self.wait_attached(volume_id, node_id, &device).await?;
        tracing::info!(volume_id, node_id, %device, "volume attached");
        Ok(ControllerPublishVolumeResponse {
            publish_context: HashMap::from([(DEVICE_PATH_KEY.to_owned(), device)]),
        })
    }

    /// AttachVolume with a fresh device name, trying another when EC2
    /// refuses one; the name's reservation is returned with it.
    async fn attach(&self, volume_id: &str, instance: &Instance) -> Result<Reservation, ControllerError> {
        let node_id = instance.id.as_str();
        let card = self.ebs_cards.for_next_volume(self.ec2.as_ref(), instance).await;
        for _ in 0..NAME_ATTEMPTS {
            let name = self
                .devices
                .allocate(node_id, &instance.device_names)
                .ok_or_else(|| ControllerError::ResourceExhausted(format!("no free device name on node {node_id}")))?;
            match self.ec2.attach_volume(volume_id, node_id, &name.name, card).await {
                Ok(()) => return Ok(name),
                Err(Ec2Error::DeviceNameRefused(m)) => {
                    tracing::warn!(volume_id, node_id, device = %name.name, reason = %m, "device name refused");
                    self.devices.refuse(node_id, &name.name);
                }
                Err(Ec2Error::AttachmentLimitExceeded(m)) => {
                    return Err(ControllerError::ResourceExhausted(format!(
                        "node {node_id} cannot attach more volumes: {m}"
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(ControllerError::Unavailable(format!(
            "EC2 refused {NAME_ATTEMPTS} device names on node {node_id}"
        )))
    }

    /// Waits for the attachment to be `attached` on `device`; one not
    /// attached by the attach timeout is detached again. Until then an
    /// attachment DescribeVolumes does not show yet, or shows in an
    /// earlier state, is looked at again like one `attaching`: EC2's
    /// answers lag its changes (Amazon EC2 Developer Guide, "Eventual
    /// consistency in the Amazon EC2 API").
    async fn wait_attached(&self, volume_id: &str, node_id: &str, device: &str) -> Result<(), ControllerError> {
        let what = format!("volume {volume_id} to attach to {node_id}");
        let result = wait::until(&what, self.settings.attach_timeout, self.cadence(), || async {
            let volume = self.describe.volumes.get(volume_id).await?;
            Ok(match volume.as_ref().and_then(|v| attachment_on(v, node_id)) {
                Some(a) if a.state == AttachmentState::Attached && a.device == device => Look::Done(()),
                Some(a) if a.state == AttachmentState::Attached => Look::Fail(ControllerError::Internal(format!(
                    "volume {volume_id} is attached to {node_id} as {}, not {device}",
                    a.device
                ))),
                // Attaching, busy, not shown yet, or a lagging view's
                // earlier attachment still detaching.
                _ => Look::Again,
            })
        })
        .await;
        if let Err(ControllerError::Unavailable(_)) = &result {
            tracing::warn!(volume_id, node_id, "attachment stuck; detaching");
            if let Err(e) = self.ec2.detach_volume(volume_id, node_id).await {
                tracing::error!(volume_id, node_id, error = %e, "could not undo the stuck attachment");
            }
        }
        result
    }

    pub(super) async fn unpublish(
        &self,
        r: ControllerUnpublishVolumeRequest,
    ) -> Result<ControllerUnpublishVolumeResponse, ControllerError> {
        let volume_id = required("volume_id", &r.volume_id)?;
        let node_id = required("node_id", &r.node_id)?;
        let _guard = self.in_flight.acquire(&format!("{volume_id}/{node_id}"))?;
        // Already detached, as EC2 says it (the Go driver takes the same
        // three answers as success): `InvalidVolume.NotFound` (no volume),
        // `InvalidAttachment.NotFound` (attached elsewhere), or
        // `IncorrectState` "Volume '…' is in the 'available' state." — the
        // last also for a volume still `detaching`, so the wait below
        // decides from the volume's attachments.
        match self.ec2.detach_volume(volume_id, node_id).await {
            Ok(()) | Err(Ec2Error::IncorrectState(_)) => {}
            Err(Ec2Error::NotFound(_)) => return Ok(ControllerUnpublishVolumeResponse {}),
            Err(e) => return Err(e.into()),
        }
        wait::until(
            &format!("volume {volume_id} to detach from {node_id}"),
            self.settings.detach_timeout,
            self.cadence(),
            || async {
                let volume = self.describe.volumes.get(volume_id).await?;
                let attachment = volume.as_ref().and_then(|v| attachment_on(v, node_id));
                self.settings
                    .detach_pending
                    .track(volume_id, node_id, attachment.map(|a| a.state));
                Ok(if attachment.is_some() {
                    Look::Again
                } else {
                    Look::Done(())
                })
            },
        )
        .await?;
        tracing::info!(volume_id, node_id, "volume detached");
        Ok(ControllerUnpublishVolumeResponse {})
    }
}
