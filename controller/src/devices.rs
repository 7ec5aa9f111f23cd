//! Device names for AttachVolume.
//!
//! EC2 wants the caller to name the device. The controller uses the Go
//! driver's 127 names, found by trial against EC2
//! (aws-ebs-csi-driver pkg/cloud/devicemanager/device_names.go):
//! `/dev/xvdaa`–`/dev/xvdbz`, `/dev/xvdda`–`/dev/xvddx` (the last two-letter
//! name EC2 accepts; `/dev/xvdc*` fail on some instance types), then
//! `/dev/xvdb`–`/dev/xvdz`, `/dev/sdb`–`/dev/sdz` and `/dev/sda2`. It skips
//! names in the instance's block-device mapping, names reserved by
//! attachments in flight and names EC2 refused on that instance, and
//! rotates instead of always reusing the first free name, so a name just
//! released (and perhaps still stale on the node) is not handed out again
//! at once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

/// Every name the allocator hands out, in order.
pub fn all_names() -> Vec<String> {
    let letters = |last: u8| (b'a'..=last).map(char::from);
    let two_letters = [('a', b'z'), ('b', b'z'), ('d', b'x')]
        .into_iter()
        .flat_map(move |(first, last)| letters(last).map(move |second| format!("/dev/xvd{first}{second}")));
    let xvd = letters(b'z').skip(1).map(|letter| format!("/dev/xvd{letter}"));
    let sd = letters(b'z').skip(1).map(|letter| format!("/dev/sd{letter}"));
    two_letters
        .chain(xvd)
        .chain(sd)
        .chain(["/dev/sda2".to_owned()])
        .collect()
}

#[derive(Debug, Default)]
struct InstanceNames {
    next: usize,
    reserved: HashSet<String>,
    refused: HashSet<String>,
}

/// Per-instance name state.
#[derive(Clone, Debug, Default)]
pub struct DeviceAllocator {
    instances: Arc<Mutex<HashMap<String, InstanceNames>>>,
}

/// A name reserved for one attachment until dropped.
#[derive(Debug)]
pub struct Reservation {
    allocator: DeviceAllocator,
    instance_id: String,
    /// The device name, e.g. `/dev/xvdba`.
    pub name: String,
}

impl DeviceAllocator {
    /// Reserves the next free name on `instance_id` after the last one
    /// handed out; `None` when every name is taken.
    pub fn allocate(&self, instance_id: &str, in_use: &[String]) -> Option<Reservation> {
        let names = all_names();
        let mut instances = self.instances.lock().unwrap_or_else(PoisonError::into_inner);
        let state = instances.entry(instance_id.to_owned()).or_default();
        let taken =
            |name: &String| in_use.contains(name) || state.reserved.contains(name) || state.refused.contains(name);
        let offset = (0..names.len()).find(|i| !taken(&names[(state.next + i) % names.len()]))?;
        let index = (state.next + offset) % names.len();
        state.next = index + 1;
        state.reserved.insert(names[index].clone());
        Some(Reservation {
            allocator: self.clone(),
            instance_id: instance_id.to_owned(),
            name: names[index].clone(),
        })
    }

    /// Remembers that EC2 refused `name` on `instance_id`.
    pub fn refuse(&self, instance_id: &str, name: &str) {
        let mut instances = self.instances.lock().unwrap_or_else(PoisonError::into_inner);
        instances
            .entry(instance_id.to_owned())
            .or_default()
            .refused
            .insert(name.to_owned());
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut instances = self.allocator.instances.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(state) = instances.get_mut(&self.instance_id) {
            state.reserved.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_and_skips_taken_names() {
        let names = all_names();
        assert_eq!(names.len(), 127);
        assert_eq!(
            [
                &names[0],
                &names[51],
                &names[52],
                &names[75],
                &names[76],
                &names[100],
                &names[101],
                &names[126]
            ],
            [
                "/dev/xvdaa",
                "/dev/xvdbz",
                "/dev/xvdda",
                "/dev/xvddx",
                "/dev/xvdb",
                "/dev/xvdz",
                "/dev/sdb",
                "/dev/sda2"
            ]
        );
        assert!(
            !names.iter().any(|n| n.starts_with("/dev/xvdc") && n.len() == 10),
            "no /dev/xvdc*"
        );
        let allocator = DeviceAllocator::default();
        let in_use = vec!["/dev/xvdaa".to_owned()];
        let first = allocator.allocate("i-1", &in_use).unwrap();
        assert_eq!(first.name, "/dev/xvdab");
        let second = allocator.allocate("i-1", &in_use).unwrap();
        assert_eq!(second.name, "/dev/xvdac");
        drop(first);
        assert_eq!(
            allocator.allocate("i-1", &in_use).unwrap().name,
            "/dev/xvdad",
            "rotates past a released name"
        );
        allocator.refuse("i-1", "/dev/xvdae");
        assert_eq!(allocator.allocate("i-1", &in_use).unwrap().name, "/dev/xvdaf");
        assert_eq!(
            allocator.allocate("i-2", &[]).unwrap().name,
            "/dev/xvdaa",
            "per instance"
        );
    }

    #[test]
    fn runs_out_when_every_name_is_taken() {
        let allocator = DeviceAllocator::default();
        let held: Vec<_> = (0..127).map(|_| allocator.allocate("i-1", &[]).unwrap()).collect();
        assert!(allocator.allocate("i-1", &[]).is_none());
        drop(held);
        assert!(allocator.allocate("i-1", &[]).is_some());
    }
}
