//! [`Ec2`] over aws-sdk-ec2.
//!
//! Endpoint, region and credentials come from the SDK's standard settings
//! (`AWS_ENDPOINT_URL_EC2`, else the Go driver's `AWS_EC2_ENDPOINT`;
//! `AWS_REGION`; the default credential chain with
//! web identity and IMDS), so tests against moto need no special path.
//! Retries are the SDK's adaptive mode; each mutating API gets its own
//! retry partition (token bucket), so throttling of one does not starve
//! the others.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::retry::{RetryConfig, RetryPartition};
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{self as sdk, Filter, ResourceType, Tag, TagSpecification};

use super::{
    Attachment, AttachmentState, CreateSnapshotInput, CreateVolumeInput, Ec2, Ec2Error, Initializing, Instance,
    LockMode, Modification, ModificationState, ModifyVolumeInput, Selector, Snapshot, SnapshotLock, SnapshotState,
    Tags, Volume, VolumeHealth, VolumeState, Zone,
};
use crate::metrics::{ApiMetrics, Failure};
use crate::volume_type;

/// The mutating APIs that get a retry partition of their own, and
/// [`MUTATING_ATTEMPTS`].
const MUTATING: [&str; 12] = [
    "CreateVolume",
    "CopyVolumes",
    "DeleteVolume",
    "AttachVolume",
    "DetachVolume",
    "ModifyVolume",
    "CreateSnapshot",
    "DeleteSnapshot",
    "LockSnapshot",
    "EnableFastSnapshotRestores",
    "CreateTags",
    "DeleteTags",
];

/// The attempts a mutating call gets, as the Go driver gives each of its
/// mutating APIs' adaptive retryers (`pkg/cloud/retry_manager.go`,
/// `retryMaxAttempt`): enough that the CO's deadline ends the call first.
const MUTATING_ATTEMPTS: u32 = 50;

/// The IOPS a maximum-discovering dry run asks for: more than any volume
/// type has (io2 Block Express: 256,000; EC2 API Reference, CreateVolume).
const PROBE_IOPS: i32 = 1_000_000;

/// The `initialization-state` check's status while a volume initializes
/// (EC2 API `VolumeStatusDetails`; the Go driver's
/// `VolumeStatusInitializingState`).
const INITIALIZING: &str = "initializing";

/// The EC2 client of the controller.
#[derive(Clone, Debug)]
pub struct SdkEc2 {
    describe: Client,
    mutating: HashMap<&'static str, Client>,
    metrics: ApiMetrics,
}

impl SdkEc2 {
    /// Builds clients from the shared SDK configuration.
    pub fn new(config: &aws_config::SdkConfig, metrics: ApiMetrics) -> Self {
        // The Go driver's endpoint variable, where the SDK's own
        // (`AWS_ENDPOINT_URL_EC2`, read into `config`) is not set.
        let endpoint = std::env::var("AWS_ENDPOINT_URL_EC2")
            .is_err()
            .then(|| std::env::var("AWS_EC2_ENDPOINT").ok())
            .flatten();
        let client = |partition: &str, retry: RetryConfig| {
            let mut conf = aws_sdk_ec2::config::Builder::from(config)
                .retry_config(retry)
                .retry_partition(RetryPartition::new(format!("ebs-csi-{partition}")))
                .interceptor(metrics.throttle_counter());
            if let Some(url) = &endpoint {
                conf = conf.endpoint_url(url);
            }
            let conf = conf.build();
            Client::from_conf(conf)
        };
        Self {
            describe: client("describe", RetryConfig::adaptive()),
            mutating: MUTATING
                .iter()
                .map(|api| {
                    (
                        *api,
                        client(api, RetryConfig::adaptive().with_max_attempts(MUTATING_ATTEMPTS)),
                    )
                })
                .collect(),
            metrics,
        }
    }

    fn client(&self, api: &'static str) -> &Client {
        self.mutating.get(api).unwrap_or(&self.describe)
    }
}

fn tag_specification(resource: ResourceType, tags: &Tags) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(resource)
        .set_tags(Some(to_sdk_tags(tags)))
        .build()
}

fn to_sdk_tags(tags: &Tags) -> Vec<Tag> {
    tags.iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

fn from_sdk_tags(tags: &[Tag]) -> Tags {
    tags.iter()
        .filter_map(|t| Some((t.key()?.to_owned(), t.value().unwrap_or_default().to_owned())))
        .collect()
}

fn filter(name: &str, values: Vec<String>) -> Filter {
    Filter::builder().name(name).set_values(Some(values)).build()
}

fn selector_filter(selector: Selector, id_filter: &str) -> Filter {
    match selector {
        Selector::Ids(ids) => filter(id_filter, ids),
        Selector::Tag(key, values) => filter(&format!("tag:{key}"), values),
        Selector::TagKey(key) => filter("tag-key", vec![key]),
        Selector::SourceVolume(id) => filter("volume-id", vec![id]),
    }
}

/// Maps an SDK error to [`Ec2Error`] by EC2 error code (EC2 API
/// reference, "Error codes"), or by the EBS direct APIs' error type (EBS
/// direct APIs reference, "Errors"), keeping the code.
pub(crate) fn classify<E, R>(error: SdkError<E, R>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    if matches!(
        error,
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_)
    ) {
        return Ec2Error::Transport(aws_sdk_ec2::error::DisplayErrorContext(&error).to_string()).into();
    }
    let code = error.code().unwrap_or_default().to_owned();
    let message = error.message().unwrap_or_default().to_owned();
    let classified = match code.as_str() {
        c if c.ends_with(".NotFound") || c.ends_with(".Malformed") || c == "ResourceNotFoundException" => {
            Ec2Error::NotFound(message)
        }
        "IdempotentParameterMismatch" => Ec2Error::IdempotentParameterMismatch(message),
        "IncorrectState"
        | "IncorrectInstanceState"
        | "IncorrectModificationState"
        | "VolumeInUse"
        | "InvalidVolume.ZoneMismatch"
        | "VolumeModificationRateExceeded" => Ec2Error::IncorrectState(message),
        "AttachmentLimitExceeded" => Ec2Error::AttachmentLimitExceeded(message),
        // The Go driver's classes (controller.go, controller_modify_volume.go,
        // cloud.go): limits are RESOURCE_EXHAUSTED, unknown or unsupported
        // input INVALID_ARGUMENT.
        "SnapshotLimitExceeded"
        | "VolumeLimitExceeded"
        | "MaxIOPSLimitExceeded"
        | "VolumeModificationSizeLimitExceeded" => Ec2Error::QuotaExceeded(message),
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "RequestThrottledException"
        | "ConcurrentLimitExceededException" => Ec2Error::Throttled(message),
        "InvalidParameterValue" if message.contains("unixDevice") || message.contains("already in use") => {
            Ec2Error::DeviceNameRefused(message)
        }
        c if c.starts_with("InvalidParameter")
            || matches!(
                c,
                "UnknownParameter"
                    | "UnknownVolumeType"
                    | "UnsupportedOperation"
                    | "ValidationError"
                    | "ValidationException"
            ) =>
        {
            Ec2Error::InvalidParameter(message)
        }
        "" => Ec2Error::Transport(aws_sdk_ec2::error::DisplayErrorContext(&error).to_string()),
        _ => Ec2Error::Service { code, message },
    };
    Failure {
        code: error.code().unwrap_or("Transport").to_owned(),
        error: classified,
    }
}

fn volume(v: &sdk::Volume) -> Volume {
    Volume {
        id: v.volume_id().unwrap_or_default().to_owned(),
        size_gib: v.size().unwrap_or_default(),
        state: match v.state() {
            Some(sdk::VolumeState::Creating) => VolumeState::Creating,
            Some(sdk::VolumeState::Available) => VolumeState::Available,
            Some(sdk::VolumeState::InUse) => VolumeState::InUse,
            Some(sdk::VolumeState::Deleting) => VolumeState::Deleting,
            Some(sdk::VolumeState::Deleted) => VolumeState::Deleted,
            _ => VolumeState::Error,
        },
        zone: v.availability_zone().unwrap_or_default().to_owned(),
        volume_type: v.volume_type().map(|t| t.as_str().to_owned()).unwrap_or_default(),
        iops: v.iops(),
        throughput: v.throughput(),
        encrypted: v.encrypted().unwrap_or_default(),
        kms_key_id: v.kms_key_id().map(str::to_owned),
        snapshot_id: v.snapshot_id().filter(|s| !s.is_empty()).map(str::to_owned),
        multi_attach: v.multi_attach_enabled().unwrap_or_default(),
        outpost_arn: v.outpost_arn().filter(|a| !a.is_empty()).map(str::to_owned),
        tags: from_sdk_tags(v.tags()),
        attachments: v
            .attachments()
            .iter()
            .map(|a| Attachment {
                instance_id: a.instance_id().unwrap_or_default().to_owned(),
                device: a.device().unwrap_or_default().to_owned(),
                state: match a.state() {
                    Some(sdk::VolumeAttachmentState::Attaching) => AttachmentState::Attaching,
                    Some(sdk::VolumeAttachmentState::Attached) => AttachmentState::Attached,
                    Some(sdk::VolumeAttachmentState::Detaching) => AttachmentState::Detaching,
                    Some(sdk::VolumeAttachmentState::Busy) => AttachmentState::Busy,
                    _ => AttachmentState::Detached,
                },
            })
            .collect(),
    }
}

fn snapshot(s: &sdk::Snapshot) -> Snapshot {
    Snapshot {
        id: s.snapshot_id().unwrap_or_default().to_owned(),
        volume_id: s.volume_id().unwrap_or_default().to_owned(),
        size_gib: s.volume_size().unwrap_or_default(),
        state: match s.state() {
            Some(sdk::SnapshotState::Completed) => SnapshotState::Completed,
            Some(sdk::SnapshotState::Error | sdk::SnapshotState::Recoverable) => SnapshotState::Error,
            _ => SnapshotState::Pending,
        },
        start_time_seconds: s.start_time().map_or_else(now_seconds, |t| t.secs()),
        tags: from_sdk_tags(s.tags()),
    }
}

fn now_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Ec2 for SdkEc2 {
    async fn create_volume(&self, input: CreateVolumeInput) -> Result<Volume, Ec2Error> {
        self.metrics
            .observe("CreateVolume", async {
                let out = self
                    .client("CreateVolume")
                    .create_volume()
                    .availability_zone(input.zone)
                    .size(input.size_gib)
                    .volume_type(sdk::VolumeType::from(input.volume_type.as_str()))
                    .set_iops(input.iops)
                    .set_throughput(input.throughput)
                    .encrypted(input.encrypted)
                    .set_kms_key_id(input.kms_key_id)
                    .set_snapshot_id(input.snapshot_id)
                    .set_volume_initialization_rate(input.initialization_rate)
                    .set_multi_attach_enabled(input.multi_attach.then_some(true))
                    .set_outpost_arn(input.outpost_arn)
                    .client_token(input.client_token)
                    .tag_specifications(tag_specification(ResourceType::Volume, &input.tags))
                    .send()
                    .await
                    .map_err(classify)?;
                let v = sdk::Volume::builder()
                    .set_volume_id(out.volume_id)
                    .set_size(out.size)
                    .set_state(out.state)
                    .set_availability_zone(out.availability_zone)
                    .set_volume_type(out.volume_type)
                    .set_iops(out.iops)
                    .set_throughput(out.throughput)
                    .set_encrypted(out.encrypted)
                    .set_kms_key_id(out.kms_key_id)
                    .set_snapshot_id(out.snapshot_id)
                    .set_multi_attach_enabled(out.multi_attach_enabled)
                    .set_outpost_arn(out.outpost_arn)
                    .set_tags(out.tags)
                    .build();
                Ok(volume(&v))
            })
            .await
    }

    async fn copy_volume(&self, source_volume_id: &str, input: CreateVolumeInput) -> Result<Volume, Ec2Error> {
        self.metrics
            .observe("CopyVolumes", async {
                let out = self
                    .client("CopyVolumes")
                    .copy_volumes()
                    .source_volume_id(source_volume_id)
                    .size(input.size_gib)
                    .volume_type(sdk::VolumeType::from(input.volume_type.as_str()))
                    .set_iops(input.iops)
                    .set_throughput(input.throughput)
                    .set_multi_attach_enabled(input.multi_attach.then_some(true))
                    .client_token(input.client_token)
                    .tag_specifications(tag_specification(ResourceType::Volume, &input.tags))
                    .send()
                    .await
                    .map_err(classify)?;
                out.volumes().first().map(volume).ok_or_else(|| {
                    Failure::from(Ec2Error::Service {
                        code: "EmptyResponse".into(),
                        message: "CopyVolumes returned no volume".into(),
                    })
                })
            })
            .await
    }

    async fn describe_volume_status(&self, volume_id: &str) -> Result<Option<VolumeHealth>, Ec2Error> {
        self.metrics
            .observe("DescribeVolumeStatus", async {
                let out = self
                    .describe
                    .describe_volume_status()
                    .volume_ids(volume_id)
                    .send()
                    .await
                    .map_err(classify)?;
                Ok(out
                    .volume_statuses()
                    .first()
                    .and_then(|item| item.volume_status())
                    .map(|info| {
                        let status = info.status().map(|s| s.as_str().to_owned()).unwrap_or_default();
                        let failed: Vec<String> = info
                            .details()
                            .iter()
                            .filter(|d| d.status().is_some_and(|s| s != "passed"))
                            .map(|d| {
                                format!(
                                    "{}: {}",
                                    d.name().map(|n| n.as_str()).unwrap_or_default(),
                                    d.status().unwrap_or_default()
                                )
                            })
                            .collect();
                        let initializing = info
                            .details()
                            .iter()
                            .any(|d| {
                                d.name() == Some(&sdk::VolumeStatusName::InitializationState)
                                    && d.status() == Some(INITIALIZING)
                            })
                            .then(|| {
                                let details = out
                                    .volume_statuses()
                                    .first()
                                    .and_then(|i| i.initialization_status_details());
                                Initializing {
                                    progress_percent: details.and_then(|d| d.progress()),
                                    seconds_left: details.and_then(|d| d.estimated_time_to_complete_in_seconds()),
                                }
                            });
                        VolumeHealth {
                            impaired: status == "impaired",
                            detail: format!("volume status {status}; {}", failed.join(", ")),
                            initializing,
                        }
                    }))
            })
            .await
    }

    async fn delete_volume(&self, volume_id: &str) -> Result<(), Ec2Error> {
        self.metrics
            .observe("DeleteVolume", async {
                self.client("DeleteVolume")
                    .delete_volume()
                    .volume_id(volume_id)
                    .send()
                    .await
                    .map_err(classify)
                    .map(drop)
            })
            .await
    }

    async fn describe_volumes(&self, selector: Selector) -> Result<Vec<Volume>, Ec2Error> {
        self.metrics
            .observe("DescribeVolumes", async {
                let mut pages = self
                    .describe
                    .describe_volumes()
                    .filters(selector_filter(selector, "volume-id"))
                    .into_paginator()
                    .send();
                let mut volumes = Vec::new();
                while let Some(page) = pages.next().await {
                    volumes.extend(page.map_err(classify)?.volumes().iter().map(volume));
                }
                Ok(volumes)
            })
            .await
    }

    async fn attach_volume(
        &self,
        volume_id: &str,
        instance_id: &str,
        device: &str,
        ebs_card: Option<i32>,
    ) -> Result<(), Ec2Error> {
        self.metrics
            .observe("AttachVolume", async {
                self.client("AttachVolume")
                    .attach_volume()
                    .volume_id(volume_id)
                    .instance_id(instance_id)
                    .device(device)
                    .set_ebs_card_index(ebs_card)
                    .send()
                    .await
                    .map_err(classify)
                    .map(drop)
            })
            .await
    }

    async fn detach_volume(&self, volume_id: &str, instance_id: &str) -> Result<(), Ec2Error> {
        self.metrics
            .observe("DetachVolume", async {
                self.client("DetachVolume")
                    .detach_volume()
                    .volume_id(volume_id)
                    .instance_id(instance_id)
                    .send()
                    .await
                    .map_err(classify)
                    .map(drop)
            })
            .await
    }

    async fn describe_instances(&self, ids: Vec<String>) -> Result<Vec<Instance>, Ec2Error> {
        self.metrics
            .observe("DescribeInstances", async {
                let mut pages = self
                    .describe
                    .describe_instances()
                    .filters(filter("instance-id", ids))
                    .into_paginator()
                    .send();
                let mut instances = Vec::new();
                while let Some(page) = pages.next().await {
                    for reservation in page.map_err(classify)?.reservations() {
                        instances.extend(reservation.instances().iter().map(|i| {
                            Instance {
                                id: i.instance_id().unwrap_or_default().to_owned(),
                                zone: i
                                    .placement()
                                    .and_then(|p| p.availability_zone())
                                    .unwrap_or_default()
                                    .to_owned(),
                                device_names: i
                                    .block_device_mappings()
                                    .iter()
                                    .filter_map(|m| m.device_name().map(str::to_owned))
                                    .collect(),
                                instance_type: i.instance_type().map(|t| t.as_str().to_owned()).unwrap_or_default(),
                                ebs_cards_in_use: i
                                    .block_device_mappings()
                                    .iter()
                                    .filter_map(|m| m.ebs())
                                    .map(|ebs| ebs.ebs_card_index().unwrap_or(0))
                                    .collect(),
                                data_volume_ids: i
                                    .block_device_mappings()
                                    .iter()
                                    .filter(|m| m.device_name() != i.root_device_name())
                                    .filter_map(|m| m.ebs()?.volume_id().map(str::to_owned))
                                    .collect(),
                                network_interfaces: i.network_interfaces().len(),
                            }
                        }));
                    }
                }
                Ok(instances)
            })
            .await
    }

    async fn ebs_cards(&self, instance_type: &str) -> Result<Option<i32>, Ec2Error> {
        self.metrics
            .observe("DescribeInstanceTypes", async {
                let out = self
                    .describe
                    .describe_instance_types()
                    .instance_types(sdk::InstanceType::from(instance_type))
                    .send()
                    .await
                    .map_err(classify)?;
                Ok(out
                    .instance_types()
                    .first()
                    .and_then(|t| t.ebs_info())
                    .and_then(|ebs| ebs.maximum_ebs_cards()))
            })
            .await
    }

    async fn create_snapshot(&self, volume_id: &str, input: CreateSnapshotInput) -> Result<Snapshot, Ec2Error> {
        self.metrics
            .observe("CreateSnapshot", async {
                let out = self
                    .client("CreateSnapshot")
                    .create_snapshot()
                    .volume_id(volume_id)
                    // The Go driver's description (pkg/cloud/cloud.go, CreateSnapshot).
                    .description(format!("Created by AWS EBS CSI driver for volume {volume_id}"))
                    .set_outpost_arn(input.outpost_arn)
                    .tag_specifications(tag_specification(ResourceType::Snapshot, &input.tags))
                    .send()
                    .await
                    .map_err(classify)?;
                let s = sdk::Snapshot::builder()
                    .set_snapshot_id(out.snapshot_id)
                    .set_volume_id(out.volume_id)
                    .set_volume_size(out.volume_size)
                    .set_state(out.state)
                    .set_start_time(out.start_time)
                    .set_tags(out.tags)
                    .build();
                Ok(snapshot(&s))
            })
            .await
    }

    async fn create_snapshots(
        &self,
        instance_id: &str,
        excluded_volume_ids: Vec<String>,
        tags: Tags,
    ) -> Result<Vec<Snapshot>, Ec2Error> {
        self.metrics
            .observe("CreateSnapshots", async {
                let instance = sdk::InstanceSpecification::builder()
                    .instance_id(instance_id)
                    .exclude_boot_volume(true)
                    .set_exclude_data_volume_ids(Some(excluded_volume_ids))
                    .build();
                let out = self
                    .client("CreateSnapshots")
                    .create_snapshots()
                    .instance_specification(instance)
                    .description(format!(
                        "Created by ebs-csi for a volume group snapshot of instance {instance_id}"
                    ))
                    .tag_specifications(tag_specification(ResourceType::Snapshot, &tags))
                    .send()
                    .await
                    .map_err(classify)?;
                Ok(out
                    .snapshots()
                    .iter()
                    .map(|info| {
                        snapshot(
                            &sdk::Snapshot::builder()
                                .set_snapshot_id(info.snapshot_id.clone())
                                .set_volume_id(info.volume_id.clone())
                                .set_volume_size(info.volume_size)
                                .set_state(info.state.clone())
                                .set_start_time(info.start_time)
                                .set_tags(info.tags.clone())
                                .build(),
                        )
                    })
                    .collect())
            })
            .await
    }

    async fn lock_snapshot(&self, snapshot_id: &str, lock: &SnapshotLock) -> Result<(), Ec2Error> {
        self.metrics
            .observe("LockSnapshot", async {
                self.client("LockSnapshot")
                    .lock_snapshot()
                    .snapshot_id(snapshot_id)
                    .lock_mode(match lock.mode {
                        LockMode::Compliance => sdk::LockMode::Compliance,
                        LockMode::Governance => sdk::LockMode::Governance,
                    })
                    .set_lock_duration(lock.duration_days)
                    .set_expiration_date(
                        lock.expires_at_seconds
                            .map(aws_sdk_ec2::primitives::DateTime::from_secs),
                    )
                    .set_cool_off_period(lock.cool_off_hours)
                    .send()
                    .await
                    .map_err(classify)
                    .map(drop)
            })
            .await
    }

    async fn enable_fast_snapshot_restores(
        &self,
        snapshot_id: &str,
        zones: &[String],
    ) -> Result<Vec<String>, Ec2Error> {
        self.metrics
            .observe("EnableFastSnapshotRestores", async {
                let out = self
                    .client("EnableFastSnapshotRestores")
                    .enable_fast_snapshot_restores()
                    .source_snapshot_ids(snapshot_id)
                    .set_availability_zones(Some(zones.to_vec()))
                    .send()
                    .await
                    .map_err(classify)?;
                Ok(out
                    .unsuccessful()
                    .iter()
                    .flat_map(|item| item.fast_snapshot_restore_state_errors())
                    .map(|e| {
                        let error = e.error();
                        format!(
                            "{}: {} {}",
                            e.availability_zone().unwrap_or_default(),
                            error.and_then(|e| e.code()).unwrap_or_default(),
                            error.and_then(|e| e.message()).unwrap_or_default()
                        )
                    })
                    .collect())
            })
            .await
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), Ec2Error> {
        self.metrics
            .observe("DeleteSnapshot", async {
                self.client("DeleteSnapshot")
                    .delete_snapshot()
                    .snapshot_id(snapshot_id)
                    .send()
                    .await
                    .map_err(classify)
                    .map(drop)
            })
            .await
    }

    async fn describe_snapshots(&self, selector: Selector) -> Result<Vec<Snapshot>, Ec2Error> {
        self.metrics
            .observe("DescribeSnapshots", async {
                // By id, any snapshot the account may use (one shared with
                // it too, to restore from); otherwise only its own.
                let owners = (!matches!(selector, Selector::Ids(_))).then(|| vec!["self".to_owned()]);
                let mut pages = self
                    .describe
                    .describe_snapshots()
                    .set_owner_ids(owners)
                    .filters(selector_filter(selector, "snapshot-id"))
                    .into_paginator()
                    .send();
                let mut snapshots = Vec::new();
                while let Some(page) = pages.next().await {
                    snapshots.extend(page.map_err(classify)?.snapshots().iter().map(snapshot));
                }
                Ok(snapshots)
            })
            .await
    }

    async fn modify_volume(&self, volume_id: &str, input: ModifyVolumeInput) -> Result<(), Ec2Error> {
        self.metrics
            .observe("ModifyVolume", async {
                self.client("ModifyVolume")
                    .modify_volume()
                    .volume_id(volume_id)
                    .set_size(input.size_gib)
                    .set_volume_type(input.volume_type.as_deref().map(sdk::VolumeType::from))
                    .set_iops(input.iops)
                    .set_throughput(input.throughput)
                    .send()
                    .await
                    .map_err(classify)
                    .map(drop)
            })
            .await
    }

    async fn describe_volumes_modifications(&self, ids: Vec<String>) -> Result<Vec<Modification>, Ec2Error> {
        self.metrics
            .observe("DescribeVolumesModifications", async {
                let out = self
                    .describe
                    .describe_volumes_modifications()
                    .filters(filter("volume-id", ids))
                    .send()
                    .await
                    .map_err(classify)?;
                Ok(out
                    .volumes_modifications()
                    .iter()
                    .map(|m| Modification {
                        volume_id: m.volume_id().unwrap_or_default().to_owned(),
                        state: match m.modification_state() {
                            Some(sdk::VolumeModificationState::Optimizing) => ModificationState::Optimizing,
                            Some(sdk::VolumeModificationState::Completed) => ModificationState::Completed,
                            Some(sdk::VolumeModificationState::Failed) => ModificationState::Failed,
                            _ => ModificationState::Modifying,
                        },
                        target_size_gib: m.target_size(),
                    })
                    .collect())
            })
            .await
    }

    async fn create_tags(&self, resource_id: &str, tags: Tags) -> Result<(), Ec2Error> {
        self.metrics
            .observe("CreateTags", async {
                self.client("CreateTags")
                    .create_tags()
                    .resources(resource_id)
                    .set_tags(Some(to_sdk_tags(&tags)))
                    .send()
                    .await
                    .map_err(classify)
                    .map(drop)
            })
            .await
    }

    async fn delete_tags(&self, resource_id: &str, keys: Vec<String>) -> Result<(), Ec2Error> {
        self.metrics
            .observe("DeleteTags", async {
                let tags = keys.into_iter().map(|k| Tag::builder().key(k).build()).collect();
                self.client("DeleteTags")
                    .delete_tags()
                    .resources(resource_id)
                    .set_tags(Some(tags))
                    .send()
                    .await
                    .map_err(classify)
                    .map(drop)
            })
            .await
    }

    async fn describe_availability_zones(&self) -> Result<Vec<Zone>, Ec2Error> {
        self.metrics
            .observe("DescribeAvailabilityZones", async {
                let out = self
                    .describe
                    .describe_availability_zones()
                    .filters(filter("state", vec!["available".into()]))
                    .send()
                    .await
                    .map_err(classify)?;
                Ok(out
                    .availability_zones()
                    .iter()
                    .filter_map(|z| {
                        Some(Zone {
                            name: z.zone_name()?.to_owned(),
                            id: z.zone_id().unwrap_or_default().to_owned(),
                        })
                    })
                    .collect())
            })
            .await
    }

    async fn max_iops(
        &self,
        volume_type: &str,
        zone: &str,
        size_gib: i32,
        tags: &Tags,
    ) -> Result<Option<i32>, Ec2Error> {
        let refused = self
            .client("CreateVolume")
            .create_volume()
            .dry_run(true)
            .availability_zone(zone)
            .volume_type(sdk::VolumeType::from(volume_type))
            .size(size_gib)
            .iops(PROBE_IOPS)
            .tag_specifications(tag_specification(ResourceType::Volume, tags))
            .send()
            .await;
        // Not observed: the refusal is the answer, not an error.
        match refused {
            Ok(_) => Ok(None),
            Err(e) if e.code() == Some("DryRunOperation") => Ok(None),
            Err(e) if e.code().is_some_and(|c| c.starts_with("InvalidParameter")) => {
                Ok(volume_type::max_iops_in(e.message().unwrap_or_default()))
            }
            Err(e) => Err(classify(e).error),
        }
    }

    async fn dry_run(&self) -> Result<(), Ec2Error> {
        self.metrics
            .observe("DescribeAvailabilityZones", async {
                match self.describe.describe_availability_zones().dry_run(true).send().await {
                    Ok(_) => Ok(()),
                    Err(e) if e.code() == Some("DryRunOperation") => Ok(()),
                    Err(e) => Err(classify(e)),
                }
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_ec2::error::ErrorMetadata;
    use aws_sdk_ec2::operation::attach_volume::AttachVolumeError;
    use aws_smithy_runtime_api::http::{Response, StatusCode};
    use aws_smithy_types::body::SdkBody;
    use tonic::{Code, Status};

    use super::*;
    use crate::error::ControllerError;

    /// EC2's error responses, as EC2 sends them, through the
    /// classification to the gRPC code the CO sees (the metric's `code`
    /// label is EC2's code). Codes: EC2 API Reference, "Error codes";
    /// messages as cited per case.
    #[test]
    fn each_ec2_error_reaches_the_co_as_its_grpc_code() {
        let cases = [
            // The EC2 API Reference's wording for a volume that does not exist.
            (
                "InvalidVolume.NotFound",
                "The volume 'vol-0123456789abcdef0' does not exist.",
                Code::NotFound,
            ),
            (
                "InvalidInstanceID.NotFound",
                "The instance ID 'i-0123456789abcdef0' does not exist",
                Code::NotFound,
            ),
            // Captured in kubernetes-sigs/aws-ebs-csi-driver#1801.
            (
                "IncorrectState",
                "Volume 'vol-0123456789abcdef0' is in the 'available' state.",
                Code::FailedPrecondition,
            ),
            (
                "VolumeInUse",
                "vol-0123456789abcdef0 is already attached to an instance",
                Code::FailedPrecondition,
            ),
            // A modification while the last one optimizes (AWS Knowledge
            // Center, "cloudformation-ebs-volume-error").
            (
                "IncorrectModificationState",
                "Volume vol-0123456789abcdef0 cannot be modified in modification state OPTIMIZING",
                Code::FailedPrecondition,
            ),
            (
                "IdempotentParameterMismatch",
                "The request uses the same client token as a previous, but non-identical request.",
                Code::AlreadyExists,
            ),
            (
                "AttachmentLimitExceeded",
                "Attachment limit exceeded.",
                Code::ResourceExhausted,
            ),
            (
                "SnapshotLimitExceeded",
                "The maximum number of snapshots has been reached.",
                Code::ResourceExhausted,
            ),
            (
                "VolumeLimitExceeded",
                "You have exceeded your maximum gp3 storage limit.",
                Code::ResourceExhausted,
            ),
            (
                "MaxIOPSLimitExceeded",
                "You have exceeded your maximum IOPS limit.",
                Code::ResourceExhausted,
            ),
            (
                "VolumeModificationSizeLimitExceeded",
                "You have exceeded your maximum volume modification storage limit.",
                Code::ResourceExhausted,
            ),
            // The refusal the Go driver's nonIo2ErrRegex is written for.
            (
                "InvalidParameterValue",
                "Volume iops of 200000 is too high; maximum is 80000",
                Code::InvalidArgument,
            ),
            // A device name in use on the instance (the Go driver's
            // isAWSErrorBlockDeviceInUse): another name is tried.
            (
                "InvalidParameterValue",
                "Invalid value '/dev/xvdba' for unixDevice. Attachment point /dev/xvdba is already in use",
                Code::Unavailable,
            ),
            (
                "InvalidParameterCombination",
                "The parameter iops is not supported for gp2 volumes.",
                Code::InvalidArgument,
            ),
            (
                "UnknownParameter",
                "The parameter Foo is not recognized",
                Code::InvalidArgument,
            ),
            (
                "UnsupportedOperation",
                "The operation is not supported.",
                Code::InvalidArgument,
            ),
            ("RequestLimitExceeded", "Request limit exceeded.", Code::Unavailable),
            ("InternalError", "An internal error has occurred.", Code::Internal),
        ];
        for (code, message, expected) in cases {
            let error = AttachVolumeError::generic(ErrorMetadata::builder().code(code).message(message).build());
            let response = Response::new(StatusCode::try_from(400).unwrap(), SdkBody::empty());
            let failure = classify(SdkError::service_error(error, response));
            assert_eq!(failure.code, code);
            let status = Status::from(ControllerError::from(failure.error));
            assert_eq!(status.code(), expected, "{code}: {message}");
        }
    }
}
