//! EC2's API request limits: a token bucket per action, per account and
//! Region. A call takes one token; a call that finds the bucket empty is
//! answered `RequestLimitExceeded`; the bucket refills at a fixed rate up to
//! its capacity. The defaults are EC2's (Amazon EC2 Developer Guide,
//! "Request throttling for the Amazon EC2 API": the tables "Request token
//! bucket sizes and refill rates" and "Uncategorized actions"); an account
//! can have them raised, which `--ec2-request-limits` then states.

use std::collections::HashMap;

/// One action's bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    /// Tokens the bucket holds at most: the burst, in calls.
    pub capacity: f64,
    /// Tokens added per second: the sustained rate, in calls per second.
    pub refill_per_second: f64,
}

impl Bucket {
    const fn new(capacity: f64, refill_per_second: f64) -> Self {
        Self {
            capacity,
            refill_per_second,
        }
    }
}

/// The default bucket of the EC2 action `action` (e.g. `AttachVolume`).
pub fn default_bucket(action: &str) -> Bucket {
    match action {
        // "Uncategorized actions": buckets of their own.
        "CreateVolume" | "DeleteVolume" | "CreateSnapshot" | "DeleteSnapshot" => Bucket::new(100.0, 5.0),
        "CreateTags" | "DeleteTags" => Bucket::new(100.0, 10.0),
        // "Non-mutating actions". Every Describe call here has a filter, so
        // none draws on the smaller "unfiltered and unpaginated" bucket
        // (50, refill 10) that DescribeVolumes, DescribeInstances and
        // DescribeSnapshots use without one.
        _ if ["Describe", "Get", "List", "Search"]
            .iter()
            .any(|p| action.starts_with(p)) =>
        {
            Bucket::new(100.0, 20.0)
        }
        // "Mutating actions": AttachVolume, DetachVolume, ModifyVolume,
        // CopyVolumes, LockSnapshot, EnableFastSnapshotRestores, …
        _ => Bucket::new(50.0, 5.0),
    }
}

/// The buckets of every action: EC2's defaults, with the account's raised
/// limits where stated.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Limits {
    raised: HashMap<String, Bucket>,
}

impl Limits {
    /// Parses `Action=CAPACITY/REFILL` pairs separated by commas, e.g.
    /// `AttachVolume=100/10,CreateVolume=200/10`; empty: the defaults.
    ///
    /// # Errors
    /// A message naming the pair that is not of that form, or whose numbers
    /// are not positive.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut raised = HashMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let invalid = || format!("{pair:?} is not Action=CAPACITY/REFILL with positive numbers");
            let (action, numbers) = pair.split_once('=').ok_or_else(invalid)?;
            let (capacity, refill) = numbers.split_once('/').ok_or_else(invalid)?;
            let number = |n: &str| n.trim().parse::<f64>().ok().filter(|n| *n > 0.0 && n.is_finite());
            let bucket = Bucket::new(
                number(capacity).ok_or_else(invalid)?,
                number(refill).ok_or_else(invalid)?,
            );
            raised.insert(action.trim().to_owned(), bucket);
        }
        Ok(Self { raised })
    }

    /// The bucket of `action`.
    pub fn bucket(&self, action: &str) -> Bucket {
        self.raised
            .get(action)
            .copied()
            .unwrap_or_else(|| default_bucket(action))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_ec2s_tables_and_raised_limits_override_them() {
        let limits = Limits::parse(" AttachVolume=100/10 , DeleteTags=200/20.5").unwrap();
        for (action, capacity, refill) in [
            ("CreateVolume", 100.0, 5.0),
            ("DeleteSnapshot", 100.0, 5.0),
            ("CreateTags", 100.0, 10.0),
            ("DescribeVolumes", 100.0, 20.0),
            ("DescribeInstanceTypes", 100.0, 20.0),
            ("DetachVolume", 50.0, 5.0),
            ("ModifyVolume", 50.0, 5.0),
            ("AttachVolume", 100.0, 10.0),
            ("DeleteTags", 200.0, 20.5),
        ] {
            assert_eq!(limits.bucket(action), Bucket::new(capacity, refill), "{action}");
        }
    }

    #[test]
    fn a_malformed_limit_is_refused_by_name() {
        for text in [
            "AttachVolume",
            "AttachVolume=10",
            "AttachVolume=0/5",
            "AttachVolume=10/-1",
            "A=x/1",
        ] {
            let pair = text;
            assert_eq!(
                Limits::parse(text),
                Err(format!("{pair:?} is not Action=CAPACITY/REFILL with positive numbers"))
            );
        }
    }
}
