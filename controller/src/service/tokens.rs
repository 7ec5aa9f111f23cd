//! CreateVolume's ClientToken for each volume name.
//!
//! EC2 keeps a token's parameters for hours after a volume made with it
//! has gone (the Go driver measured 12 h): a volume that failed after
//! CreateVolume succeeded, retried with other parameters, meets
//! `IdempotentParameterMismatch` for that long. Like the Go driver, the
//! next attempt after a mismatch uses a new token, the name with `-2`,
//! then `-3`, … appended before hashing.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use sha2::{Digest, Sha256};

/// The suffix in use per name (names never mismatched are not stored).
#[derive(Debug, Default)]
pub(super) struct ClientTokens {
    suffixes: Mutex<HashMap<String, u32>>,
}

impl ClientTokens {
    /// The token for `name`: the hex SHA-256 (64 characters, EC2's limit)
    /// of the name, or of `name-N` after N-1 mismatches.
    pub(super) fn token(&self, name: &str) -> String {
        let suffixes = self.suffixes.lock().unwrap_or_else(PoisonError::into_inner);
        match suffixes.get(name) {
            Some(n) => hex_sha256(&format!("{name}-{n}")),
            None => hex_sha256(name),
        }
    }

    /// EC2 answered `IdempotentParameterMismatch` for `name`'s token: the
    /// next attempt uses the next one.
    pub(super) fn rotate(&self, name: &str) {
        let mut suffixes = self.suffixes.lock().unwrap_or_else(PoisonError::into_inner);
        let next = suffixes.get(name).map_or(2, |n| n + 1);
        suffixes.insert(name.to_owned(), next);
    }
}

fn hex_sha256(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mismatch_moves_the_name_to_its_next_token() {
        let tokens = ClientTokens::default();
        let first = tokens.token("pvc-1");
        assert_eq!(first.len(), 64);
        assert_eq!(first, hex_sha256("pvc-1"));
        tokens.rotate("pvc-1");
        assert_eq!(tokens.token("pvc-1"), hex_sha256("pvc-1-2"));
        tokens.rotate("pvc-1");
        assert_eq!(tokens.token("pvc-1"), hex_sha256("pvc-1-3"));
        assert_eq!(tokens.token("pvc-2"), hex_sha256("pvc-2"));
    }
}
