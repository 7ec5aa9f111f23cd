//! Leader election on a Lease (coordination.k8s.io/v1), as client-go's
//! `tools/leaderelection` does it with csi-lib-utils' defaults
//! (`leaderelection/leader_election.go`: lease 15 s, renew deadline 10 s,
//! retry period 5 s), so that of the controller's replicas one labels the
//! Nodes.
//!
//! A holder's lease is taken over only once its record has not changed for
//! the lease's duration as this process observed it (client-go's rule: no
//! clock of another machine is compared with ours). Every write carries
//! the `resourceVersion` read, so of two candidates one wins (409 for the
//! other).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_smithy_types::DateTime;
use aws_smithy_types::date_time::Format;
use ebs_csi_kube::{ApiClient, Bytes, KubernetesError};
use serde_json::{Value, json};

/// How long a lease holds without being renewed.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long the leader keeps trying to renew before it gives up.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often a candidate tries, and the leader renews.
pub const RETRY_PERIOD: Duration = Duration::from_secs(5);

/// The leader could not renew its lease within [`RENEW_DEADLINE`]: another
/// may hold it now.
#[derive(Debug, thiserror::Error)]
#[error("the lease {name} was not renewed for {} s: {last}", RENEW_DEADLINE.as_secs())]
pub struct LostLease {
    /// The lease's name.
    pub name: String,
    /// The last attempt's failure.
    pub last: String,
}

/// One Lease, and this process as its candidate.
pub struct Lease<'a> {
    api: &'a ApiClient,
    namespace: String,
    name: String,
    identity: String,
}

/// The record of another holder last seen, and when it was first seen so.
struct Observed {
    resource_version: String,
    since: Instant,
}

impl<'a> Lease<'a> {
    /// The Lease `name` in `namespace`, for the candidate `identity` (the
    /// pod's name, as client-go's).
    pub fn new(api: &'a ApiClient, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            api,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
        }
    }

    /// Waits until this candidate holds the lease, trying every
    /// [`RETRY_PERIOD`].
    pub async fn acquire(&self) {
        let mut observed = None;
        loop {
            match self.try_hold(&mut observed).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(error) => tracing::warn!(lease = %self.name, %error, "the lease could not be read or written"),
            }
            tokio::time::sleep(RETRY_PERIOD).await;
        }
    }

    /// Renews the lease every [`RETRY_PERIOD`] while this candidate holds
    /// it; returns when it could not for [`RENEW_DEADLINE`].
    pub async fn hold(&self) -> LostLease {
        let mut observed = None;
        loop {
            tokio::time::sleep(RETRY_PERIOD).await;
            let deadline = Instant::now() + RENEW_DEADLINE;
            loop {
                let last = match self.try_hold(&mut observed).await {
                    Ok(true) => break,
                    Ok(false) => "another candidate holds it".to_owned(),
                    Err(error) => error.to_string(),
                };
                if Instant::now() >= deadline {
                    return LostLease {
                        name: self.name.clone(),
                        last,
                    };
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    /// One attempt to take or renew the lease: whether this candidate
    /// holds it now.
    async fn try_hold(&self, observed: &mut Option<Observed>) -> Result<bool, KubernetesError> {
        let collection = format!("/apis/coordination.k8s.io/v1/namespaces/{}/leases", self.namespace);
        let path = format!("{collection}/{}", self.name);
        let now = micro_time(SystemTime::now());
        let current: Value = match self.api.get(&path).await {
            Ok(body) => serde_json::from_slice(&body)?,
            Err(KubernetesError::Refused { code: 404, .. }) => {
                let lease = json!({
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self.spec(&now, &now, 0),
                });
                return conflict_is_no(self.api.create(&collection, &lease).await);
            }
            Err(error) => return Err(error),
        };
        let spec = &current["spec"];
        let holder = spec["holderIdentity"].as_str().unwrap_or_default();
        let ours = holder == self.identity;
        if !ours && !holder.is_empty() && !self.expired(&current, observed) {
            return Ok(false);
        }
        let transitions = spec["leaseTransitions"].as_i64().unwrap_or(0) + i64::from(!ours);
        let acquired = match spec["acquireTime"].as_str() {
            Some(time) if ours => time.to_owned(),
            _ => now.clone(),
        };
        let mut lease = current;
        lease["spec"] = self.spec(&acquired, &now, transitions);
        conflict_is_no(self.api.replace(&path, &lease).await)
    }

    /// Whether another holder's record has stayed as `current` is for the
    /// lease's duration since this process first saw it so.
    fn expired(&self, current: &Value, observed: &mut Option<Observed>) -> bool {
        let version = current["metadata"]["resourceVersion"].as_str().unwrap_or_default();
        let duration = current["spec"]["leaseDurationSeconds"]
            .as_u64()
            .map_or(LEASE_DURATION, Duration::from_secs);
        match observed {
            Some(seen) if seen.resource_version == version => seen.since.elapsed() >= duration,
            _ => {
                *observed = Some(Observed {
                    resource_version: version.to_owned(),
                    since: Instant::now(),
                });
                false
            }
        }
    }

    fn spec(&self, acquired: &str, renewed: &str, transitions: i64) -> Value {
        json!({
            "holderIdentity": self.identity,
            "leaseDurationSeconds": LEASE_DURATION.as_secs(),
            "acquireTime": acquired,
            "renewTime": renewed,
            "leaseTransitions": transitions,
        })
    }
}

/// A write's outcome: written, or refused with 409 because another wrote
/// first.
fn conflict_is_no(written: Result<Bytes, KubernetesError>) -> Result<bool, KubernetesError> {
    match written {
        Ok(_) => Ok(true),
        Err(KubernetesError::Refused { code: 409, .. }) => Ok(false),
        Err(error) => Err(error),
    }
}

/// `time` as a Kubernetes MicroTime (RFC 3339 with six fractional digits,
/// UTC: apimachinery's `RFC3339Micro`).
fn micro_time(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = DateTime::from_secs(i64::try_from(since.as_secs()).unwrap_or(i64::MAX))
        .fmt(Format::DateTime)
        .unwrap_or_default();
    let whole = seconds.strip_suffix('Z').unwrap_or(&seconds);
    format!("{whole}.{:06}Z", since.subsec_micros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_times_have_six_digits() {
        let time = UNIX_EPOCH + Duration::new(1_796_000_000, 1_234_567);
        assert_eq!(micro_time(time), "2026-11-30T00:53:20.001234Z");
        assert_eq!(micro_time(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
    }
}
