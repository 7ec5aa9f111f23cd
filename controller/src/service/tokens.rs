//! CreateVolume's ClientToken for each volume name.
//!
//! EC2 keeps a token's parameters for hours after a volume made with it
//! has gone (the Go driver measured 12 h): a volume that failed after
//! CreateVolume succeeded, retried with other parameters, meets
//! `IdempotentParameterMismatch` for that long. Like the Go driver, the
//! next attempt after a mismatch uses a new token, the name with `-2`,
//! then `-3`, … appended before hashing.
//!
//! A token also outlives DeleteVolume: EC2 answers it with the deleted
//! volume, so a name used again after its volume was deleted (csi-sanity
//! reuses names; so does a StatefulSet's claim, deleted and made again)
//! needs the next token too. The volumes made here are remembered with
//! their names until DeleteVolume names them; the volumes deleted here for
//! a while after, since DescribeVolumes may still list one as it was
//! (Amazon EC2 Developer Guide, "Eventual consistency in the Amazon EC2
//! API").

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// How long a volume deleted here is remembered: longer than EC2 takes to
/// list a deleted volume as `deleting` (seconds, in practice).
const DELETED_REMEMBERED: Duration = Duration::from_secs(600);

/// The tokens in use, per volume name.
#[derive(Debug, Default)]
pub(super) struct ClientTokens {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The suffix in use per name (names whose token never moved are not
    /// stored).
    suffixes: HashMap<String, u32>,
    /// The name each volume made here was created for, by volume id.
    made: HashMap<String, String>,
    /// When each volume deleted here in the last DELETED_REMEMBERED was
    /// deleted, by volume id.
    deleted: HashMap<String, Instant>,
}

impl State {
    fn rotate(&mut self, name: &str) {
        let next = self.suffixes.get(name).map_or(2, |n| n + 1);
        self.suffixes.insert(name.to_owned(), next);
    }
}

impl ClientTokens {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The token for `name`: the hex SHA-256 (64 characters, EC2's limit)
    /// of the name, or of `name-N` after the token moved N-1 times.
    pub(super) fn token(&self, name: &str) -> String {
        match self.state().suffixes.get(name) {
            Some(n) => hex_sha256(&format!("{name}-{n}")),
            None => hex_sha256(name),
        }
    }

    /// EC2 answered `IdempotentParameterMismatch` for `name`'s token, or
    /// the token names a volume that failed or was deleted: the next
    /// attempt uses the next one.
    pub(super) fn rotate(&self, name: &str) {
        self.state().rotate(name);
    }

    /// CreateVolume or CopyVolumes made `volume_id` for `name` with the
    /// name's token.
    pub(super) fn made(&self, volume_id: &str, name: &str) {
        self.state().made.insert(volume_id.to_owned(), name.to_owned());
    }

    /// DeleteVolume deleted `volume_id` (or found it gone): if it was made
    /// here, its name's next CreateVolume uses the next token.
    pub(super) fn deleted(&self, volume_id: &str) {
        let mut state = self.state();
        if let Some(name) = state.made.remove(volume_id) {
            state.rotate(&name);
        }
        let now = Instant::now();
        state
            .deleted
            .retain(|_, at| now.duration_since(*at) < DELETED_REMEMBERED);
        state.deleted.insert(volume_id.to_owned(), now);
    }

    /// Whether DeleteVolume deleted `volume_id` here lately (a listing
    /// that still shows it is stale).
    pub(super) fn deleted_here(&self, volume_id: &str) -> bool {
        self.state().deleted.contains_key(volume_id)
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

    #[test]
    fn deleting_a_volume_made_here_moves_its_name_to_the_next_token() {
        let tokens = ClientTokens::default();
        tokens.made("vol-1", "pvc-1");
        tokens.deleted("vol-2");
        assert_eq!(tokens.token("pvc-1"), hex_sha256("pvc-1"), "another volume");
        assert!(!tokens.deleted_here("vol-1"));
        tokens.deleted("vol-1");
        assert!(tokens.deleted_here("vol-1"));
        assert_eq!(tokens.token("pvc-1"), hex_sha256("pvc-1-2"));
        tokens.deleted("vol-1");
        assert_eq!(tokens.token("pvc-1"), hex_sha256("pvc-1-2"), "forgotten once deleted");
    }
}
