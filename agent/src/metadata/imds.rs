//! The instance metadata service (IMDSv2), through aws-config's IMDS
//! client, which honours `AWS_EC2_METADATA_SERVICE_ENDPOINT`. When the
//! instance's hop limit keeps the session token's answer from reaching
//! this network namespace, the client gives up after its 1 s read timeout
//! ("failed to load IMDS session token"). Its HTTP client goes to the
//! endpoint directly, never through a proxy the environment names: the
//! instance's metadata is answered only on the instance's own link-local
//! address (EC2 User Guide, "Instance metadata service": a node behind a
//! proxy excludes 169.254.169.254 from it).

use std::sync::LazyLock;

use aws_config::imds::Client;
use aws_config::provider_config::ProviderConfig;
use aws_smithy_http_client::Builder;
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};

use ebs_csi_kube::causes;

use super::Found;

/// One client for the process: it keeps its IMDSv2 session token, so
/// NodeGetInfo's read of the interfaces (every
/// `nodeAllocatableUpdatePeriodSeconds`) asks for no new token.
static CLIENT: LazyLock<Client> = LazyLock::new(|| {
    let http = Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
        .build_https();
    Client::builder()
        .configure(&ProviderConfig::default().with_http_client(http))
        .build()
});

/// A metadata path IMDS did not answer.
#[derive(Debug, thiserror::Error)]
#[error("reading {path}: {message}")]
pub struct ImdsError {
    path: &'static str,
    /// The client's error and its causes.
    message: String,
}

/// Reads the instance id, zone, zone id, type, network interfaces and boot
/// volumes.
///
/// # Errors
/// [`ImdsError`] naming the first required path that could not be read
/// (the zone id and the boot volumes are optional: without the one the
/// node reports no zone id, without the other only the root is reserved).
pub async fn read() -> Result<Found, ImdsError> {
    let client = &*CLIENT;
    let get = |path: &'static str| get(client, path);
    let instance_id = get("/latest/meta-data/instance-id").await?;
    let availability_zone = get("/latest/meta-data/placement/availability-zone").await?;
    let availability_zone_id = match get("/latest/meta-data/placement/availability-zone-id").await {
        Ok(id) => Some(id),
        Err(e) => {
            tracing::warn!(error = %e, "zone id unknown: topology.k8s.aws/zone-id is not reported");
            None
        }
    };
    // Only instances on an Outpost have it (EC2 User Guide, "Instance
    // metadata categories": outpost-arn).
    let outpost_arn = get("/latest/meta-data/outpost-arn").await.ok();
    let instance_type = get("/latest/meta-data/instance-type").await?;
    let network_interfaces = network_interfaces().await?;
    // Entries are `ami`, `root`, `ebsN`, `ephemeralN`, `swap` (EC2 User
    // Guide, "Instance metadata categories").
    let boot_volumes = match get("/latest/meta-data/block-device-mapping/").await {
        Ok(entries) => u32::try_from(entries.lines().filter(|l| l.trim().starts_with("ebs")).count()).ok(),
        Err(e) => {
            tracing::warn!(error = %e, "boot volumes unknown: only the root volume is reserved");
            None
        }
    };
    Ok(Found {
        instance_id: Some(instance_id),
        availability_zone: Some(availability_zone),
        availability_zone_id,
        outpost_arn,
        instance_type: Some(instance_type),
        network_interfaces: Some(network_interfaces),
        boot_volumes,
    })
}

/// The network interfaces attached now (one line per interface's MAC
/// address in `network/interfaces/macs/`; EC2 User Guide, "Instance
/// metadata categories"), at least one: an interface attached after the
/// instance started (the VPC CNI attaches them as pods come) is listed.
///
/// # Errors
/// [`ImdsError`] when IMDS does not answer.
pub async fn network_interfaces() -> Result<u32, ImdsError> {
    let macs = get(&CLIENT, "/latest/meta-data/network/interfaces/macs/").await?;
    Ok(u32::try_from(macs.lines().filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(1)
        .max(1))
}

/// The value at `path`, trimmed.
async fn get(client: &Client, path: &'static str) -> Result<String, ImdsError> {
    client
        .get(path)
        .await
        .map(|v| v.as_ref().trim().to_owned())
        .map_err(|e| ImdsError {
            path,
            message: causes(&e),
        })
}
