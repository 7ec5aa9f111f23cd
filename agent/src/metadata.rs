//! This node's identity in EC2: from flags, or else from the first of the
//! configured sources (`--metadata-sources`) that knows it.
//!
//! - [`imds`]: the instance metadata service. Complete, but a pod that is
//!   not on the host network cannot reach it when the instance's IMDSv2
//!   hop limit is 1 (EKS's default for managed node groups).
//! - [`kubernetes`]: this node's Node object (its `spec.providerID` and
//!   well-known labels). Costs the agent a Kubernetes token allowed to get
//!   Nodes.
//! - [`dmi`]: the SMBIOS tables the kernel exposes world-readable under
//!   `/sys/class/dmi/id`. Costs nothing, works on every Nitro instance, but
//!   gives no availability zone: it completes only with
//!   `--availability-zone`.
//!
//! Network interfaces and boot volumes are known from IMDS, and from the
//! Node's labels the controller's metadata labeler writes
//! (`metadata-labeler`); the other sources report one interface and no boot
//! volume besides the root.

pub mod dmi;
pub mod imds;
pub mod kubernetes;

use std::fmt;
use std::path::PathBuf;

/// What NodeGetInfo reports about the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeMetadata {
    /// EC2 instance id, the CSI node id (ControllerPublishVolume attaches
    /// to it).
    pub instance_id: String,
    /// Availability zone, e.g. `us-east-1a`.
    pub availability_zone: String,
    /// The zone's id, the same physical zone in every account, e.g.
    /// `use1-az1`; reported as `topology.k8s.aws/zone-id` where known.
    pub availability_zone_id: Option<String>,
    /// The ARN of the AWS Outpost the instance runs on, if it does;
    /// reported as the Go driver's Outpost segments.
    pub outpost_arn: Option<String>,
    /// Instance type, e.g. `m5.large`.
    pub instance_type: String,
    /// Attached network interfaces at start (they share attachment slots
    /// on most Nitro types), when read from IMDS or the metadata labeler's
    /// label. Without either one is assumed.
    pub network_interfaces: Option<u32>,
    /// The interfaces came from IMDS, which NodeGetInfo asks again.
    pub interfaces_from_imds: bool,
    /// EBS volumes besides the root that the instance was launched or last
    /// started with (IMDS `block-device-mapping/ebsN`); 0 when not read.
    pub boot_volumes: u32,
}

/// What one source knows; `None` where it does not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// EC2 instance id.
    pub instance_id: Option<String>,
    /// Availability zone.
    pub availability_zone: Option<String>,
    /// Availability zone id.
    pub availability_zone_id: Option<String>,
    /// Outpost ARN.
    pub outpost_arn: Option<String>,
    /// Instance type.
    pub instance_type: Option<String>,
    /// Attached network interfaces.
    pub network_interfaces: Option<u32>,
    /// EBS volumes besides the root at launch.
    pub boot_volumes: Option<u32>,
}

impl Found {
    /// `self` where it has a value, `other` elsewhere.
    fn or(self, other: Self) -> Self {
        Self {
            instance_id: self.instance_id.or(other.instance_id),
            availability_zone: self.availability_zone.or(other.availability_zone),
            availability_zone_id: self.availability_zone_id.or(other.availability_zone_id),
            outpost_arn: self.outpost_arn.or(other.outpost_arn),
            instance_type: self.instance_type.or(other.instance_type),
            network_interfaces: self.network_interfaces.or(other.network_interfaces),
            boot_volumes: self.boot_volumes.or(other.boot_volumes),
        }
    }

    /// The node's metadata if id, zone and type are all known; else the
    /// first missing field's name.
    fn complete(self) -> Result<NodeMetadata, &'static str> {
        Ok(NodeMetadata {
            instance_id: self.instance_id.ok_or("instance id")?,
            availability_zone: self.availability_zone.ok_or("availability zone")?,
            availability_zone_id: self.availability_zone_id,
            outpost_arn: self.outpost_arn,
            instance_type: self.instance_type.ok_or("instance type")?,
            network_interfaces: self.network_interfaces,
            interfaces_from_imds: false,
            boot_volumes: self.boot_volumes.unwrap_or(0),
        })
    }
}

/// A place the node's metadata can be read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The instance metadata service (IMDSv2).
    Imds,
    /// This node's Node object in the Kubernetes API.
    Kubernetes,
    /// The kernel's SMBIOS (DMI) attributes.
    Dmi,
    /// The Go driver's `metadata-labeler`: this node's Node object, as
    /// [`Source::Kubernetes`], with the network interface and volume counts
    /// the controller's metadata labeler puts in its labels
    /// (`ebs-csi-controller metadata-labeler`).
    MetadataLabeler,
}

impl Source {
    /// Parses one `--metadata-sources` entry: `imds`, `kubernetes`, `dmi`
    /// or the Go driver's `metadata-labeler`.
    ///
    /// # Errors
    /// A message naming the accepted values.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "imds" => Ok(Self::Imds),
            "kubernetes" => Ok(Self::Kubernetes),
            "dmi" => Ok(Self::Dmi),
            "metadata-labeler" => Ok(Self::MetadataLabeler),
            other => Err(format!(
                "unknown metadata source {other:?}: imds, kubernetes, dmi or metadata-labeler"
            )),
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Imds => "imds",
            Self::Kubernetes => "kubernetes",
            Self::Dmi => "dmi",
            Self::MetadataLabeler => "metadata-labeler",
        })
    }
}

/// Where the sources look, besides their fixed addresses.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The sources to try, in order (`--metadata-sources`).
    pub sources: Vec<Source>,
    /// Where the `kubernetes` source finds the API server.
    pub api: kubernetes::ApiSource,
    /// The DMI attribute directory (`/sys/class/dmi/id`).
    pub dmi_dir: PathBuf,
}

/// Why one source did not give the node's metadata.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// IMDS did not answer a path.
    #[error(transparent)]
    Imds(#[from] imds::ImdsError),
    /// The Kubernetes API did not give this node's Node object.
    #[error(transparent)]
    Kubernetes(#[from] kubernetes::KubernetesError),
    /// The DMI attributes could not be read or are not an EC2 instance's.
    #[error(transparent)]
    Dmi(#[from] dmi::DmiError),
    /// The source answered without this field and no flag gave it.
    #[error("it does not know the {0}")]
    Incomplete(&'static str),
}

/// No source gave the node's metadata: each one tried, with its reason.
#[derive(Debug, thiserror::Error)]
#[error("no metadata source knows this node: {}", .0.iter().map(|(s, e)| format!("{s}: {e}")).collect::<Vec<_>>().join("; "))]
pub struct MetadataError(Vec<(Source, SourceError)>);

/// Resolves the node's metadata: `flags` first (no source is contacted
/// when they name id, zone and type), then each source in
/// `settings.sources` until one completes them.
///
/// # Errors
/// [`MetadataError`] listing every source tried and why it failed.
pub async fn resolve(flags: Found, settings: &Settings) -> Result<NodeMetadata, MetadataError> {
    if let Ok(metadata) = flags.clone().complete() {
        return Ok(metadata);
    }
    let mut failures = Vec::new();
    for &source in &settings.sources {
        let found = match source {
            Source::Imds => imds::read().await.map_err(SourceError::from),
            Source::Kubernetes | Source::MetadataLabeler => {
                let counts = source == Source::MetadataLabeler;
                kubernetes::read(&settings.api, counts).await.map_err(SourceError::from)
            }
            Source::Dmi => dmi::read(&settings.dmi_dir).map_err(SourceError::from),
        };
        let outcome = found.and_then(|found| flags.clone().or(found).complete().map_err(SourceError::Incomplete));
        match outcome {
            Ok(metadata) => {
                tracing::info!(%source, "node metadata read");
                return Ok(NodeMetadata {
                    interfaces_from_imds: source == Source::Imds && metadata.network_interfaces.is_some(),
                    ..metadata
                });
            }
            Err(e) => {
                // Not a warning: the next source may answer (a pod without
                // IMDS, hop limit 1, reads the Node object), and when none
                // does the error lists every source's failure.
                tracing::info!(%source, error = %e, "node metadata source failed, trying the next");
                failures.push((source, e));
            }
        }
    }
    Err(MetadataError(failures))
}

#[cfg(test)]
#[path = "metadata_tests.rs"]
mod tests;
