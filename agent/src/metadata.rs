//! This node's identity in EC2: from flags, or else from the instance
//! metadata service (IMDSv2, through aws-config's IMDS client, which honours
//! `AWS_EC2_METADATA_SERVICE_ENDPOINT`).

use aws_config::imds::Client;

/// What NodeGetInfo reports about the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeMetadata {
    /// EC2 instance id, the CSI node id (ControllerPublishVolume attaches
    /// to it).
    pub instance_id: String,
    /// Availability zone, e.g. `us-east-1a`.
    pub availability_zone: String,
    /// Instance type, e.g. `m5.large`.
    pub instance_type: String,
    /// Attached network interfaces (they share attachment slots on most
    /// Nitro types); 1 when not read from IMDS.
    pub network_interfaces: u32,
    /// EBS volumes besides the root that the instance was launched or last
    /// started with (IMDS `block-device-mapping/ebsN`); 0 when not read.
    pub boot_volumes: u32,
}

/// Values given on the command line; each missing one is read from IMDS.
#[derive(Clone, Debug, Default)]
pub struct MetadataFlags {
    /// `--node-id`.
    pub instance_id: Option<String>,
    /// `--availability-zone`.
    pub availability_zone: Option<String>,
    /// `--instance-type`.
    pub instance_type: Option<String>,
}

/// Why the node metadata could not be had.
#[derive(Debug, thiserror::Error)]
#[error("reading {path} from the instance metadata service: {source}")]
pub struct MetadataError {
    path: &'static str,
    source: aws_config::imds::client::error::ImdsError,
}

/// Resolves the node's metadata: flags first, IMDS for the rest. IMDS is
/// not contacted at all when every flag is given.
///
/// # Errors
/// [`MetadataError`] naming the first IMDS path that could not be read.
pub async fn resolve(flags: MetadataFlags) -> Result<NodeMetadata, MetadataError> {
    if let (Some(instance_id), Some(availability_zone), Some(instance_type)) = (
        flags.instance_id.clone(),
        flags.availability_zone.clone(),
        flags.instance_type.clone(),
    ) {
        return Ok(NodeMetadata {
            instance_id,
            availability_zone,
            instance_type,
            network_interfaces: 1,
            boot_volumes: 0,
        });
    }
    let client = Client::builder().build();
    let get = |path: &'static str| {
        let client = client.clone();
        async move {
            client
                .get(path)
                .await
                .map(|v| v.as_ref().trim().to_owned())
                .map_err(|source| MetadataError { path, source })
        }
    };
    let instance_id = match flags.instance_id {
        Some(id) => id,
        None => get("/latest/meta-data/instance-id").await?,
    };
    let availability_zone = match flags.availability_zone {
        Some(zone) => zone,
        None => get("/latest/meta-data/placement/availability-zone").await?,
    };
    let instance_type = match flags.instance_type {
        Some(t) => t,
        None => get("/latest/meta-data/instance-type").await?,
    };
    let macs = get("/latest/meta-data/network/interfaces/macs/").await?;
    let network_interfaces = u32::try_from(macs.lines().filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(1)
        .max(1);
    // Entries are `ami`, `root`, `ebsN`, `ephemeralN`, `swap` (EC2 User
    // Guide, "Instance metadata categories").
    let boot_volumes = match get("/latest/meta-data/block-device-mapping/").await {
        Ok(entries) => u32::try_from(entries.lines().filter(|l| l.trim().starts_with("ebs")).count()).unwrap_or(0),
        Err(e) => {
            tracing::warn!(error = %e, "boot volumes unknown: only the root volume is reserved");
            0
        }
    };
    Ok(NodeMetadata {
        instance_id,
        availability_zone,
        instance_type,
        network_interfaces,
        boot_volumes,
    })
}
