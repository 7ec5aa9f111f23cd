//! Choosing the availability zone of a new volume, from zone names or, as
//! the Go driver also takes them, zone ids (`topology.k8s.aws/zone-id`).

use ebs_csi_proto::v1::{Topology, TopologyRequirement};
use ebs_csi_proto::{
    TOPOLOGY_KEY_WELL_KNOWN_ZONE, TOPOLOGY_KEY_ZONE, TOPOLOGY_KEY_ZONE_ID, TOPOLOGY_KEYS_OUTPOST, outpost_segments,
};
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::ec2::{Ec2, Ec2Error, Zone};
use crate::error::ControllerError;

/// Picks zones: the first preferred one, else one of the requisite ones,
/// else one of the region's zones. Among several, the volume's name
/// chooses (its SHA-256), so volumes without a requirement spread across
/// zones, and a retried CreateVolume — after a timeout, or a restart of
/// the controller — asks EC2 for the same zone: its ClientToken then
/// returns the volume the first attempt made, where another zone would
/// be `IdempotentParameterMismatch` and, with the next token, a second
/// volume for one name.
#[derive(Debug, Default)]
pub struct ZonePicker {
    region_zones: OnceCell<Vec<Zone>>,
}

/// The zone named by a topology segment map (either key).
pub fn zone_of(topology: &Topology) -> Option<&str> {
    topology
        .segments
        .get(TOPOLOGY_KEY_ZONE)
        .or_else(|| topology.segments.get(TOPOLOGY_KEY_WELL_KNOWN_ZONE))
        .map(String::as_str)
}

/// The zone id named by a topology segment map.
fn zone_id_of(topology: &Topology) -> Option<&str> {
    topology.segments.get(TOPOLOGY_KEY_ZONE_ID).map(String::as_str)
}

/// Whether the CO's topologies carry zone ids (its nodes report them), so
/// that a volume's topology must too.
pub fn uses_zone_ids(requirement: Option<&TopologyRequirement>) -> bool {
    requirement.is_some_and(|r| r.requisite.iter().chain(&r.preferred).any(|t| zone_id_of(t).is_some()))
}

/// The Outpost a requirement names (the Go driver's `getOutpostArn`): the
/// first preferred, else requisite, topology with all the Outpost segments.
pub fn outpost_of(requirement: Option<&TopologyRequirement>) -> Option<String> {
    let r = requirement?;
    r.preferred.iter().chain(&r.requisite).find_map(|t| {
        let [id, account, region, partition] = TOPOLOGY_KEYS_OUTPOST.map(|k| t.segments.get(k));
        let arn = format!("arn:{}:outposts:{}:{}:outpost/{}", partition?, region?, account?, id?);
        outpost_segments(&arn).map(|_| arn)
    })
}

/// The topology of a volume in `zone`, under both zone keys; under the
/// zone id key when `zone_id` is given, and the Outpost segments for a
/// volume on one.
pub fn topology(zone: &str, zone_id: Option<&str>, outpost_arn: Option<&str>) -> Topology {
    let outpost = outpost_arn.and_then(outpost_segments).into_iter().flatten();
    Topology {
        segments: [
            (TOPOLOGY_KEY_ZONE.to_owned(), zone.to_owned()),
            (TOPOLOGY_KEY_WELL_KNOWN_ZONE.to_owned(), zone.to_owned()),
        ]
        .into_iter()
        .chain(zone_id.map(|id| (TOPOLOGY_KEY_ZONE_ID.to_owned(), id.to_owned())))
        .chain(outpost.map(|(k, v)| (k.to_owned(), v)))
        .collect(),
    }
}

/// Whether a volume in the zone `name` (with id `id`, where known) meets
/// `requirement`: a requisite topology, when there is one, must name the
/// zone (CSI spec, TopologyRequirement), by name or by id.
pub fn allows(requirement: Option<&TopologyRequirement>, name: &str, id: Option<&str>) -> bool {
    let requisite = requirement.map(|r| r.requisite.as_slice()).unwrap_or_default();
    requisite.is_empty()
        || requisite
            .iter()
            .any(|t| zone_of(t) == Some(name) || (id.is_some() && zone_id_of(t) == id))
}

/// CSI spec, CreateVolume: "unable to provision in the accessible topology".
fn no_zones() -> ControllerError {
    ControllerError::ResourceExhausted("no available zone of the region meets the topology requirement".into())
}

impl ZonePicker {
    /// The zone for a volume with these requirements: by name where a
    /// topology names one, else by id.
    ///
    /// # Errors
    /// The DescribeAvailabilityZones error when the region's zones are
    /// needed and cannot be listed; RESOURCE_EXHAUSTED when the region has
    /// none, or none with a zone id the requirement names.
    pub async fn pick<E: Ec2>(
        &self,
        name: &str,
        requirement: Option<&TopologyRequirement>,
        ec2: &E,
    ) -> Result<String, ControllerError> {
        let named = |topologies: &[Topology]| -> Vec<String> {
            topologies.iter().filter_map(zone_of).map(str::to_owned).collect()
        };
        let (preferred, requisite) =
            requirement.map_or((vec![], vec![]), |r| (named(&r.preferred), named(&r.requisite)));
        if let Some(zone) = preferred.first() {
            return Ok(zone.clone());
        }
        if !requisite.is_empty() {
            return Ok(by_name(name, &requisite));
        }
        let region = self.region_zones(ec2).await?;
        let name_of = |id: &str| region.iter().find(|z| z.id == id).map(|z| z.name.clone());
        let Some(r) = requirement.filter(|r| uses_zone_ids(Some(r))) else {
            let all: Vec<String> = region.iter().map(|z| z.name.clone()).collect();
            return if all.is_empty() {
                Err(no_zones())
            } else {
                Ok(by_name(name, &all))
            };
        };
        if let Some(zone) = r.preferred.iter().filter_map(zone_id_of).find_map(name_of) {
            return Ok(zone);
        }
        let candidates: Vec<String> = r.requisite.iter().filter_map(zone_id_of).filter_map(name_of).collect();
        if candidates.is_empty() {
            return Err(no_zones());
        }
        Ok(by_name(name, &candidates))
    }

    /// The region's available zones, listed once.
    ///
    /// # Errors
    /// The DescribeAvailabilityZones error.
    pub async fn region_zones<E: Ec2>(&self, ec2: &E) -> Result<&[Zone], Ec2Error> {
        self.region_zones
            .get_or_try_init(|| ec2.describe_availability_zones())
            .await
            .map(Vec::as_slice)
    }

    /// The region's zone named `name`, with its id.
    ///
    /// # Errors
    /// The DescribeAvailabilityZones error.
    pub async fn zone<E: Ec2>(&self, ec2: &E, name: &str) -> Result<Option<Zone>, Ec2Error> {
        Ok(self.region_zones(ec2).await?.iter().find(|z| z.name == name).cloned())
    }
}

/// One of `zones` (not empty), chosen by the SHA-256 of the volume's name.
fn by_name(name: &str, zones: &[String]) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let index = digest
        .iter()
        .fold(0usize, |acc, b| (acc * 256 + usize::from(*b)) % zones.len());
    zones[index].clone()
}
