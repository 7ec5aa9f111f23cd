//! The CSI v1 wire protocol (spec v1.12) as tonic/prost types, and what
//! both CSI services (node agent, controller) share.
//!
//! `v1` holds every message plus the generated `identity_server`,
//! `controller_server`, `node_server` and matching client modules.
//! The `secrets` fields (marked `csi_secret` in the proto) are plain maps in
//! the generated code, and prost's derived `Debug` prints them: never log a
//! request with `{:?}`.

pub mod authority;
pub mod connection;
pub mod endpoint;
pub mod fips;
pub mod format_context;
pub mod go_flags;
pub mod inflight;
pub mod listener;
pub mod metrics_http;
pub mod observed;
pub mod telemetry;
pub mod version;

/// Package `csi.v1`, generated at build time from `csi.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
}

/// Package `modify.v1`, the volume-modifier-for-k8s sidecar's service,
/// generated at build time from `modify.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod modify {
    tonic::include_proto!("modify.v1");
}

/// The name every CSI endpoint of this project reports in `GetPluginInfo`,
/// the same as the Go driver's so existing volumes keep working.
pub const DRIVER_NAME: &str = "ebs.csi.aws.com";

/// The Node label in which the controller's metadata labeler gives the
/// network interfaces attached to the node's instance (the Go driver's
/// `ENIsLabel`, `pkg/metadata/labeler.go`: `<driver name>/enis-count`).
pub const LABEL_ENIS: &str = "ebs.csi.aws.com/enis-count";

/// The Node label in which the controller's metadata labeler gives the EBS
/// volumes attached to the node's instance besides its root volume that no
/// PersistentVolume of this driver, or of the in-tree `awsElasticBlockStore`,
/// holds (the Go driver's `VolumesLabel`:
/// `<driver name>/non-csi-ebs-volumes-count`).
pub const LABEL_NON_CSI_VOLUMES: &str = "ebs.csi.aws.com/non-csi-ebs-volumes-count";

/// Topology key written by the Go driver since its first release.
pub const TOPOLOGY_KEY_ZONE: &str = "topology.ebs.csi.aws.com/zone";

/// The well-known Kubernetes zone label, also reported for drop-in use.
pub const TOPOLOGY_KEY_WELL_KNOWN_ZONE: &str = "topology.kubernetes.io/zone";

/// The zone id (`use1-az1`: the same physical zone in every account), the
/// label the AWS cloud controller manager gives nodes; the Go driver
/// creates a volume in the zone with this id when a topology names it.
pub const TOPOLOGY_KEY_ZONE_ID: &str = "topology.k8s.aws/zone-id";

/// The segments of an AWS Outpost, as the Go driver's node reports them
/// for an instance on one and its controller reads them back into the
/// Outpost's ARN, `arn:<partition>:outposts:<region>:<account>:outpost/<id>`
/// (in this order: id, account, region, partition).
pub const TOPOLOGY_KEYS_OUTPOST: [&str; 4] = [
    "topology.ebs.csi.aws.com/outpost-id",
    "topology.ebs.csi.aws.com/account-id",
    "topology.ebs.csi.aws.com/region",
    "topology.ebs.csi.aws.com/partition",
];

/// [`TOPOLOGY_KEYS_OUTPOST`]'s segments of an Outpost ARN; `None` for
/// anything else.
pub fn outpost_segments(arn: &str) -> Option<[(&'static str, String); 4]> {
    let [scheme, partition, service, region, account, resource] =
        <[&str; 6]>::try_from(arn.splitn(6, ':').collect::<Vec<_>>()).ok()?;
    let id = resource.strip_prefix("outpost/")?;
    (scheme == "arn" && service == "outposts" && id.starts_with("op-")).then(|| {
        let [k_id, k_account, k_region, k_partition] = TOPOLOGY_KEYS_OUTPOST;
        [
            (k_id, id.to_owned()),
            (k_account, account.to_owned()),
            (k_region, region.to_owned()),
            (k_partition, partition.to_owned()),
        ]
    })
}

/// The node's operating system, as the Go driver's node reports it
/// (`kubernetes.io/os`, the well-known label; value `linux`), so
/// StorageClasses that select on it keep matching.
pub const TOPOLOGY_KEY_OS: &str = "kubernetes.io/os";
