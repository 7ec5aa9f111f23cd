//! The narrow view of EC2 the controller needs: domain types, one error
//! type, and the [`Ec2`] trait implemented by the AWS SDK client
//! ([`sdk::SdkEc2`]) and, for unit tests, by an in-memory model.

pub mod batch;
pub mod limits;
#[cfg(test)]
pub mod model;
pub mod pacing;
pub mod sdk;

use std::collections::BTreeMap;
use std::future::Future;

/// Tags as EC2 stores them.
pub type Tags = BTreeMap<String, String>;

/// An EBS volume (EC2 API `Volume`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    /// `vol-…`.
    pub id: String,
    /// Size in GiB.
    pub size_gib: i32,
    /// Lifecycle state.
    pub state: VolumeState,
    /// Availability zone.
    pub zone: String,
    /// `gp3`, `io2`, …
    pub volume_type: String,
    /// Provisioned IOPS, where the type has them.
    pub iops: Option<i32>,
    /// Provisioned throughput in MiB/s (gp3).
    pub throughput: Option<i32>,
    /// Encrypted at rest.
    pub encrypted: bool,
    /// KMS key ARN when encrypted.
    pub kms_key_id: Option<String>,
    /// The snapshot the volume was restored from.
    pub snapshot_id: Option<String>,
    /// io1/io2 Multi-Attach enabled.
    pub multi_attach: bool,
    /// The Outpost it is on, if any.
    pub outpost_arn: Option<String>,
    /// Tags.
    pub tags: Tags,
    /// Attachments to instances.
    pub attachments: Vec<Attachment>,
}

/// An availability zone (EC2 API `AvailabilityZone`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Zone {
    /// `ZoneName`, e.g. `us-east-1a` (differs between accounts).
    pub name: String,
    /// `ZoneId`, e.g. `use1-az1` (the same physical zone in every account).
    pub id: String,
}

/// Volume states (EC2 API `VolumeState`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeState {
    /// Being created.
    Creating,
    /// Ready, not attached.
    Available,
    /// Attached to at least one instance.
    InUse,
    /// Being deleted.
    Deleting,
    /// Deleted.
    Deleted,
    /// Creation failed.
    Error,
}

/// One attachment of a volume (EC2 API `VolumeAttachment`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// `i-…`.
    pub instance_id: String,
    /// Device name given to AttachVolume, e.g. `/dev/xvdba`.
    pub device: String,
    /// Attachment state.
    pub state: AttachmentState,
}

/// Attachment states (EC2 API `VolumeAttachmentState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachmentState {
    /// Being attached.
    Attaching,
    /// Attached.
    Attached,
    /// Being detached.
    Detaching,
    /// Detached.
    Detached,
    /// Attached, but the instance is busy with it.
    Busy,
}

/// An EBS snapshot (EC2 API `Snapshot`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// `snap-…`.
    pub id: String,
    /// The source volume.
    pub volume_id: String,
    /// Size of the source volume in GiB.
    pub size_gib: i32,
    /// `pending`, `completed` or `error`.
    pub state: SnapshotState,
    /// Seconds since the Unix epoch when the snapshot started.
    pub start_time_seconds: i64,
    /// Tags.
    pub tags: Tags,
}

/// What CreateSnapshot is asked to make, besides the source volume.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateSnapshotInput {
    /// Tags of the snapshot.
    pub tags: Tags,
    /// Store the snapshot on this Outpost (`OutpostArn`) rather than in
    /// the Region.
    pub outpost_arn: Option<String>,
}

/// An EBS snapshot lock (EC2 API `LockSnapshot`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotLock {
    /// `compliance` (no one may unlock or shorten it once the cooling-off
    /// period ends) or `governance`.
    pub mode: LockMode,
    /// How long it lasts, either days (`LockDuration`, 1–36,500)...
    pub duration_days: Option<i32>,
    /// ...or until this moment, seconds since the Unix epoch
    /// (`ExpirationDate`).
    pub expires_at_seconds: Option<i64>,
    /// Compliance mode: hours during which it may still be changed
    /// (`CoolOffPeriod`, 1–72).
    pub cool_off_hours: Option<i32>,
}

/// Snapshot lock modes (EC2 API `LockMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// `compliance`.
    Compliance,
    /// `governance`.
    Governance,
}

/// Snapshot states (EC2 API `SnapshotState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotState {
    /// Being copied to storage.
    Pending,
    /// Usable.
    Completed,
    /// Failed.
    Error,
}

/// An instance as far as attachments are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// `i-…`.
    pub id: String,
    /// Availability zone.
    pub zone: String,
    /// Device names in its block-device mapping (root and attached volumes).
    pub device_names: Vec<String>,
    /// Instance type, e.g. `p5.48xlarge`.
    pub instance_type: String,
    /// The EBS card of each EBS volume in its block-device mapping
    /// (`EbsCardIndex`; 0 where EC2 reports none).
    pub ebs_cards_in_use: Vec<i32>,
    /// The EBS volumes in its block-device mapping but its root device's
    /// (`RootDeviceName`): the data volumes CreateSnapshots takes.
    pub data_volume_ids: Vec<String>,
    /// Its attached network interfaces (`NetworkInterfaces`).
    pub network_interfaces: usize,
}

/// The state of a volume modification (EC2 API `VolumeModificationState`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Modification {
    /// The volume.
    pub volume_id: String,
    /// `modifying`, `optimizing`, `completed` or `failed`.
    pub state: ModificationState,
    /// Target size in GiB.
    pub target_size_gib: Option<i32>,
}

/// Modification states; the new size is usable from `Optimizing` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModificationState {
    /// In progress.
    Modifying,
    /// Applied; performance still being optimized.
    Optimizing,
    /// Done.
    Completed,
    /// Failed.
    Failed,
}

/// What EC2's volume status checks say (DescribeVolumeStatus).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeHealth {
    /// The status is `impaired` (I/O disabled or degraded).
    pub impaired: bool,
    /// The status and its failed checks, for the CSI condition message.
    pub detail: String,
    /// The volume is still being initialized from its snapshot (the
    /// `initialization-state` check is `initializing`).
    pub initializing: Option<Initializing>,
}

/// How far a volume's initialization is (EC2 API
/// `InitializationStatusDetails`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Initializing {
    /// Percent done, 0–100.
    pub progress_percent: Option<i64>,
    /// Seconds EC2 estimates are left (volumes with a provisioned
    /// initialization rate only).
    pub seconds_left: Option<i64>,
}

/// Everything CreateVolume needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateVolumeInput {
    /// Availability zone.
    pub zone: String,
    /// Size in GiB.
    pub size_gib: i32,
    /// Volume type.
    pub volume_type: String,
    /// Provisioned IOPS.
    pub iops: Option<i32>,
    /// Throughput in MiB/s.
    pub throughput: Option<i32>,
    /// Encrypt.
    pub encrypted: bool,
    /// KMS key.
    pub kms_key_id: Option<String>,
    /// Restore from this snapshot.
    pub snapshot_id: Option<String>,
    /// With `snapshot_id`: initialize the volume at this rate, MiB/s.
    pub initialization_rate: Option<i32>,
    /// Enable io2 Multi-Attach.
    pub multi_attach: bool,
    /// Create it on this Outpost (`OutpostArn`).
    pub outpost_arn: Option<String>,
    /// Tags applied at creation.
    pub tags: Tags,
    /// Idempotency token (at most 64 ASCII characters).
    pub client_token: String,
}

/// A ModifyVolume request; `None` leaves a property as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModifyVolumeInput {
    /// New size in GiB.
    pub size_gib: Option<i32>,
    /// New type.
    pub volume_type: Option<String>,
    /// New IOPS.
    pub iops: Option<i32>,
    /// New throughput in MiB/s.
    pub throughput: Option<i32>,
}

impl ModifyVolumeInput {
    /// Whether the request changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Which volumes or snapshots to describe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// By id (ids that do not exist are simply absent from the result).
    Ids(Vec<String>),
    /// By tag key, with any of the values.
    Tag(String, Vec<String>),
    /// Every resource carrying the tag key.
    TagKey(String),
    /// Snapshots of a volume.
    SourceVolume(String),
}

/// Why an EC2 call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Ec2Error {
    /// The named resource does not exist (`*.NotFound`, `*.Malformed`).
    #[error("{0} not found")]
    NotFound(String),
    /// A ClientToken was reused with other parameters.
    #[error("idempotent parameter mismatch: {0}")]
    IdempotentParameterMismatch(String),
    /// The resource is in a state that does not allow the call
    /// (`IncorrectState`, `VolumeInUse`, `InvalidVolume.ZoneMismatch`, …).
    #[error("incorrect state: {0}")]
    IncorrectState(String),
    /// The device name is in use or not accepted on the instance.
    #[error("device name refused: {0}")]
    DeviceNameRefused(String),
    /// The instance has no attachment slot left.
    #[error("attachment limit exceeded: {0}")]
    AttachmentLimitExceeded(String),
    /// An account or Region quota is reached (`SnapshotLimitExceeded`,
    /// `VolumeLimitExceeded`, `MaxIOPSLimitExceeded`,
    /// `VolumeModificationSizeLimitExceeded`; EC2 API Reference, "Error
    /// codes").
    #[error("quota exceeded: {0}")]
    QuotaExceeded(String),
    /// A parameter was refused.
    #[error("invalid parameter: {0}")]
    InvalidParameter(String),
    /// Throttled, and neither the SDK's retries nor the pacing's
    /// ([`pacing`]) got through.
    #[error("throttled by EC2: {0}")]
    Throttled(String),
    /// The call could not be made or its answer not read (network, timeouts).
    #[error("EC2 unreachable: {0}")]
    Transport(String),
    /// Any other service error, with its code.
    #[error("EC2 error {code}: {message}")]
    Service {
        /// EC2 error code.
        code: String,
        /// EC2 error message.
        message: String,
    },
}

/// The EC2 calls the controller makes. Each method is one EC2 API action.
pub trait Ec2: Send + Sync + 'static {
    /// `CreateVolume`.
    fn create_volume(&self, input: CreateVolumeInput) -> impl Future<Output = Result<Volume, Ec2Error>> + Send;
    /// `CopyVolumes` of one volume: a new volume with the source's data,
    /// in the source's zone, with `input`'s size, type, performance, tags
    /// and token.
    fn copy_volume(
        &self,
        source_volume_id: &str,
        input: CreateVolumeInput,
    ) -> impl Future<Output = Result<Volume, Ec2Error>> + Send;
    /// `DescribeVolumeStatus` of one volume; `None` when EC2 reports none.
    fn describe_volume_status(
        &self,
        volume_id: &str,
    ) -> impl Future<Output = Result<Option<VolumeHealth>, Ec2Error>> + Send;
    /// `DeleteVolume`.
    fn delete_volume(&self, volume_id: &str) -> impl Future<Output = Result<(), Ec2Error>> + Send;
    /// `DescribeVolumes` (all pages).
    fn describe_volumes(&self, selector: Selector) -> impl Future<Output = Result<Vec<Volume>, Ec2Error>> + Send;
    /// `AttachVolume`, on EBS card `ebs_card` of an instance with several
    /// (`EbsCardIndex`), else on EC2's default.
    fn attach_volume(
        &self,
        volume_id: &str,
        instance_id: &str,
        device: &str,
        ebs_card: Option<i32>,
    ) -> impl Future<Output = Result<(), Ec2Error>> + Send;
    /// `DescribeInstanceTypes` of one type: how many EBS cards it has
    /// (`EbsInfo.MaximumEbsCards`); `None` where EC2 reports no number.
    fn ebs_cards(&self, instance_type: &str) -> impl Future<Output = Result<Option<i32>, Ec2Error>> + Send;
    /// `DetachVolume`.
    fn detach_volume(&self, volume_id: &str, instance_id: &str) -> impl Future<Output = Result<(), Ec2Error>> + Send;
    /// `DescribeInstances` by id (missing ids are absent from the result).
    fn describe_instances(&self, ids: Vec<String>) -> impl Future<Output = Result<Vec<Instance>, Ec2Error>> + Send;
    /// `CreateSnapshot`.
    fn create_snapshot(
        &self,
        volume_id: &str,
        input: CreateSnapshotInput,
    ) -> impl Future<Output = Result<Snapshot, Ec2Error>> + Send;
    /// `CreateSnapshots` of the volumes attached to `instance_id` but its
    /// boot volume and `excluded_volume_ids`: "point-in-time, crash-consistent"
    /// snapshots of them all (EC2 API Reference, CreateSnapshots), each
    /// tagged with `tags`.
    fn create_snapshots(
        &self,
        instance_id: &str,
        excluded_volume_ids: Vec<String>,
        tags: Tags,
    ) -> impl Future<Output = Result<Vec<Snapshot>, Ec2Error>> + Send;
    /// `LockSnapshot`.
    fn lock_snapshot(
        &self,
        snapshot_id: &str,
        lock: &SnapshotLock,
    ) -> impl Future<Output = Result<(), Ec2Error>> + Send;
    /// `EnableFastSnapshotRestores` of one snapshot in `zones`: the zones
    /// EC2 lists as unsuccessful, each with its error message.
    fn enable_fast_snapshot_restores(
        &self,
        snapshot_id: &str,
        zones: &[String],
    ) -> impl Future<Output = Result<Vec<String>, Ec2Error>> + Send;
    /// `DeleteSnapshot`.
    fn delete_snapshot(&self, snapshot_id: &str) -> impl Future<Output = Result<(), Ec2Error>> + Send;
    /// `DescribeSnapshots` (all pages, owned by this account).
    fn describe_snapshots(&self, selector: Selector) -> impl Future<Output = Result<Vec<Snapshot>, Ec2Error>> + Send;
    /// `ModifyVolume`.
    fn modify_volume(
        &self,
        volume_id: &str,
        input: ModifyVolumeInput,
    ) -> impl Future<Output = Result<(), Ec2Error>> + Send;
    /// `DescribeVolumesModifications` (missing ids are absent).
    fn describe_volumes_modifications(
        &self,
        ids: Vec<String>,
    ) -> impl Future<Output = Result<Vec<Modification>, Ec2Error>> + Send;
    /// `CreateTags`.
    fn create_tags(&self, resource_id: &str, tags: Tags) -> impl Future<Output = Result<(), Ec2Error>> + Send;
    /// `DeleteTags`.
    fn delete_tags(&self, resource_id: &str, keys: Vec<String>) -> impl Future<Output = Result<(), Ec2Error>> + Send;
    /// `DescribeAvailabilityZones`: the region's available zones.
    fn describe_availability_zones(&self) -> impl Future<Output = Result<Vec<Zone>, Ec2Error>> + Send;
    /// A `DryRun` CreateVolume of `volume_type` in `zone`, `size_gib` large,
    /// asking for more IOPS than any type has: the maximum EC2's refusal
    /// names ([`crate::volume_type::max_iops_in`]), `None` if it names none.
    /// It carries `tags`, those of the volume it is for: IAM evaluates a
    /// dry run as the request itself, and the policy in `deploy/` allows
    /// CreateVolume only with `ebs.csi.aws.com/cluster=true` among them.
    fn max_iops(
        &self,
        volume_type: &str,
        zone: &str,
        size_gib: i32,
        tags: &Tags,
    ) -> impl Future<Output = Result<Option<i32>, Ec2Error>> + Send;
    /// A `DryRun` call that proves the credentials and endpoint work.
    fn dry_run(&self) -> impl Future<Output = Result<(), Ec2Error>> + Send;
}
