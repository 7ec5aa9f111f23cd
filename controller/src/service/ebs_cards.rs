//! The EBS card a volume is attached on, for instance types with several
//! (EC2 User Guide, "Amazon EBS volume limits": instances with multiple
//! EBS cards take `EbsCardIndex` in AttachVolume). Like the Go driver, the
//! card with the fewest EBS volumes in the instance's block-device mapping;
//! the number of cards from DescribeInstanceTypes, kept per type.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::ec2::{Ec2, Instance};

/// EBS cards per instance type, as EC2 reported them.
#[derive(Debug, Default)]
pub struct EbsCards {
    known: Mutex<HashMap<String, Option<i32>>>,
}

impl EbsCards {
    /// The card for one more volume on `instance`: `None` (EC2's default)
    /// for types with one card, or when EC2 cannot say how many it has.
    pub async fn for_next_volume<E: Ec2>(&self, ec2: &E, instance: &Instance) -> Option<i32> {
        let known = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&instance.instance_type)
            .copied();
        let cards = match known {
            Some(cards) => cards,
            None => match ec2.ebs_cards(&instance.instance_type).await {
                Ok(cards) => {
                    self.known
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(instance.instance_type.clone(), cards);
                    cards
                }
                Err(e) => {
                    tracing::warn!(instance_type = %instance.instance_type, error = %e, "EBS cards unknown: EC2's default card");
                    None
                }
            },
        };
        let cards = cards.filter(|n| *n > 1)?;
        (0..cards).min_by_key(|card| instance.ebs_cards_in_use.iter().filter(|used| *used == card).count())
    }
}
