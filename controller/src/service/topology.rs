//! Choosing the availability zone of a new volume.

use std::sync::atomic::{AtomicUsize, Ordering};

use ebs_csi_proto::v1::{Topology, TopologyRequirement};
use ebs_csi_proto::{TOPOLOGY_KEY_WELL_KNOWN_ZONE, TOPOLOGY_KEY_ZONE};
use tokio::sync::OnceCell;

use crate::ec2::{Ec2, Ec2Error};

/// Picks zones: the first preferred one, else one of the requisite ones,
/// else one of the region's zones, rotating so volumes without a
/// requirement spread across zones instead of piling into the first.
#[derive(Debug, Default)]
pub struct ZonePicker {
    next: AtomicUsize,
    region_zones: OnceCell<Vec<String>>,
}

/// The zone named by a topology segment map (either key).
pub fn zone_of(topology: &Topology) -> Option<&str> {
    topology
        .segments
        .get(TOPOLOGY_KEY_ZONE)
        .or_else(|| topology.segments.get(TOPOLOGY_KEY_WELL_KNOWN_ZONE))
        .map(String::as_str)
}

/// The topology of a volume in `zone`, under both keys.
pub fn topology(zone: &str) -> Topology {
    Topology {
        segments: [
            (TOPOLOGY_KEY_ZONE.to_owned(), zone.to_owned()),
            (TOPOLOGY_KEY_WELL_KNOWN_ZONE.to_owned(), zone.to_owned()),
        ]
        .into(),
    }
}

/// Whether a volume in `zone` meets `requirement`: a requisite topology,
/// when there is one, must name the zone (CSI spec, TopologyRequirement).
pub fn allows(requirement: Option<&TopologyRequirement>, zone: &str) -> bool {
    let requisite: Vec<&str> = requirement
        .map(|r| r.requisite.iter().filter_map(zone_of).collect())
        .unwrap_or_default();
    requisite.is_empty() || requisite.contains(&zone)
}

impl ZonePicker {
    /// The zone for a volume with these requirements.
    ///
    /// # Errors
    /// The DescribeAvailabilityZones error when the region's zones are
    /// needed and cannot be listed (or the region has none).
    pub async fn pick<E: Ec2>(&self, requirement: Option<&TopologyRequirement>, ec2: &E) -> Result<String, Ec2Error> {
        if let Some(zone) = requirement.and_then(|r| r.preferred.iter().find_map(zone_of)) {
            return Ok(zone.to_owned());
        }
        let requisite: Vec<&str> = requirement
            .map(|r| r.requisite.iter().filter_map(zone_of).collect())
            .unwrap_or_default();
        if !requisite.is_empty() {
            return Ok(self.rotate(&requisite).to_owned());
        }
        let zones = self.region_zones(ec2).await?;
        let zones: Vec<&str> = zones.iter().map(String::as_str).collect();
        if zones.is_empty() {
            return Err(Ec2Error::Service {
                code: "NoZones".into(),
                message: "the region lists no available zone".into(),
            });
        }
        Ok(self.rotate(&zones).to_owned())
    }

    /// The region's available zones, listed once.
    ///
    /// # Errors
    /// The DescribeAvailabilityZones error.
    pub async fn region_zones<E: Ec2>(&self, ec2: &E) -> Result<&[String], Ec2Error> {
        self.region_zones
            .get_or_try_init(|| ec2.describe_availability_zones())
            .await
            .map(Vec::as_slice)
    }

    fn rotate<'a>(&self, zones: &[&'a str]) -> &'a str {
        zones[self.next.fetch_add(1, Ordering::Relaxed) % zones.len()]
    }
}
