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
pub mod inflight;
pub mod metrics_http;
pub mod observed;

/// Package `csi.v1`, generated at build time from `csi.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
}

/// The name every CSI endpoint of this project reports in `GetPluginInfo`,
/// the same as the Go driver's so existing volumes keep working.
pub const DRIVER_NAME: &str = "ebs.csi.aws.com";

/// Topology key written by the Go driver since its first release.
pub const TOPOLOGY_KEY_ZONE: &str = "topology.ebs.csi.aws.com/zone";

/// The well-known Kubernetes zone label, also reported for drop-in use.
pub const TOPOLOGY_KEY_WELL_KNOWN_ZONE: &str = "topology.kubernetes.io/zone";

/// The node's operating system, as the Go driver's node reports it
/// (`kubernetes.io/os`, the well-known label; value `linux`), so
/// StorageClasses that select on it keep matching.
pub const TOPOLOGY_KEY_OS: &str = "kubernetes.io/os";
