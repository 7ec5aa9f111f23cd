//! Batching of Describe calls: lookups by id from concurrent callers
//! within a short window become one call (the Go driver uses 500 ms and at
//! most 500 ids). Ids that are not found come back as `None` to their own
//! caller only; the batch call filters by id, which EC2 answers without an
//! error for missing ids.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use super::{Ec2, Ec2Error, Instance, Modification, Selector, Snapshot, Volume, VolumeState};
use crate::tags::VOLUME_NAME;

type Fetch<V> =
    Arc<dyn Fn(Vec<String>) -> Pin<Box<dyn Future<Output = Result<Vec<(String, V)>, Ec2Error>> + Send>> + Send + Sync>;
type Waiter<V> = oneshot::Sender<Result<Option<V>, Ec2Error>>;

/// How batching behaves.
#[derive(Clone, Copy, Debug)]
pub struct BatchConfig {
    /// Off: every lookup is its own call.
    pub enabled: bool,
    /// How long the first lookup waits for others to join.
    pub window: Duration,
    /// Ids per call at most; a full batch is sent at once.
    pub max_ids: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            window: Duration::from_millis(500),
            max_ids: 500,
        }
    }
}

/// Merges concurrent lookups by id into one call of `fetch`.
pub struct Batcher<V> {
    config: BatchConfig,
    fetch: Fetch<V>,
    pending: Arc<Mutex<HashMap<String, Vec<Waiter<V>>>>>,
}

impl<V: Clone + Send + 'static> Batcher<V> {
    fn new(config: BatchConfig, fetch: Fetch<V>) -> Self {
        Self {
            config,
            fetch,
            pending: Arc::default(),
        }
    }

    /// Looks `id` up, together with whatever else is asked for in the window.
    ///
    /// # Errors
    /// The batch call's error, given to every caller in the batch.
    pub async fn get(&self, id: &str) -> Result<Option<V>, Ec2Error> {
        if !self.config.enabled {
            return Ok((self.fetch)(vec![id.to_owned()])
                .await?
                .into_iter()
                .find(|(k, _)| k == id)
                .map(|(_, v)| v));
        }
        let (tx, rx) = oneshot::channel();
        let (first, full) = {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            let first = pending.is_empty();
            pending.entry(id.to_owned()).or_default().push(tx);
            (first, pending.len() >= self.config.max_ids)
        };
        if full {
            tokio::spawn(flush(Arc::clone(&self.pending), Arc::clone(&self.fetch)));
        } else if first {
            let (pending, fetch, window) = (Arc::clone(&self.pending), Arc::clone(&self.fetch), self.config.window);
            tokio::spawn(async move {
                tokio::time::sleep(window).await;
                flush(pending, fetch).await;
            });
        }
        rx.await
            .unwrap_or_else(|_| Err(Ec2Error::Transport("batch dropped".into())))
    }
}

async fn flush<V: Clone>(pending: Arc<Mutex<HashMap<String, Vec<Waiter<V>>>>>, fetch: Fetch<V>) {
    let waiters = std::mem::take(&mut *pending.lock().unwrap_or_else(PoisonError::into_inner));
    if waiters.is_empty() {
        return;
    }
    let result = fetch(waiters.keys().cloned().collect()).await;
    let found: HashMap<String, V> = match &result {
        Ok(items) => items.iter().cloned().collect(),
        Err(_) => HashMap::new(),
    };
    for (id, senders) in waiters {
        for sender in senders {
            let answer = match &result {
                Ok(_) => Ok(found.get(&id).cloned()),
                Err(e) => Err(e.clone()),
            };
            let _ = sender.send(answer);
        }
    }
}

/// Batched lookups of volumes, instances, snapshots and modifications.
pub struct Describer {
    /// Volumes by id.
    pub volumes: Batcher<Volume>,
    /// Live volumes (not deleting, deleted or failed) by their
    /// `CSIVolumeName` tag: CreateVolume's idempotency lookup.
    pub volumes_by_name: Batcher<Volume>,
    /// Instances by id.
    pub instances: Batcher<Instance>,
    /// Snapshots by id.
    pub snapshots: Batcher<Snapshot>,
    /// The latest modification of each volume, by volume id.
    pub modifications: Batcher<Modification>,
}

impl Describer {
    /// Batchers over `ec2` with `config`.
    pub fn new<E: Ec2>(ec2: Arc<E>, config: BatchConfig) -> Self {
        let e = Arc::clone(&ec2);
        let volumes: Fetch<Volume> = Arc::new(move |ids| {
            let e = Arc::clone(&e);
            Box::pin(async move {
                Ok(e.describe_volumes(Selector::Ids(ids))
                    .await?
                    .into_iter()
                    .map(|v| (v.id.clone(), v))
                    .collect())
            })
        });
        let e = Arc::clone(&ec2);
        let volumes_by_name: Fetch<Volume> = Arc::new(move |names| {
            let e = Arc::clone(&e);
            Box::pin(async move {
                let found = e.describe_volumes(Selector::Tag(VOLUME_NAME.to_owned(), names)).await?;
                Ok(found
                    .into_iter()
                    .filter(|v| {
                        !matches!(
                            v.state,
                            VolumeState::Deleting | VolumeState::Deleted | VolumeState::Error
                        )
                    })
                    .filter_map(|v| Some((v.tags.get(VOLUME_NAME)?.clone(), v)))
                    .collect())
            })
        });
        let e = Arc::clone(&ec2);
        let instances: Fetch<Instance> = Arc::new(move |ids| {
            let e = Arc::clone(&e);
            Box::pin(async move {
                Ok(e.describe_instances(ids)
                    .await?
                    .into_iter()
                    .map(|i| (i.id.clone(), i))
                    .collect())
            })
        });
        let e = Arc::clone(&ec2);
        let snapshots: Fetch<Snapshot> = Arc::new(move |ids| {
            let e = Arc::clone(&e);
            Box::pin(async move {
                Ok(e.describe_snapshots(Selector::Ids(ids))
                    .await?
                    .into_iter()
                    .map(|s| (s.id.clone(), s))
                    .collect())
            })
        });
        let e = ec2;
        let modifications: Fetch<Modification> = Arc::new(move |ids| {
            let e = Arc::clone(&e);
            Box::pin(async move {
                Ok(e.describe_volumes_modifications(ids)
                    .await?
                    .into_iter()
                    .map(|m| (m.volume_id.clone(), m))
                    .collect())
            })
        });
        Self {
            volumes: Batcher::new(config, volumes),
            volumes_by_name: Batcher::new(config, volumes_by_name),
            instances: Batcher::new(config, instances),
            snapshots: Batcher::new(config, snapshots),
            modifications: Batcher::new(config, modifications),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn counting(calls: Arc<AtomicUsize>) -> Fetch<u32> {
        Arc::new(move |ids: Vec<String>| {
            calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Ok(ids.into_iter().filter(|id| id != "missing").map(|id| (id, 7)).collect()) })
        })
    }

    #[tokio::test]
    async fn merges_concurrent_lookups_and_isolates_missing_ids() {
        let calls = Arc::new(AtomicUsize::new(0));
        let config = BatchConfig {
            enabled: true,
            window: Duration::from_millis(50),
            max_ids: 500,
        };
        let batcher = Arc::new(Batcher::new(config, counting(Arc::clone(&calls))));
        let lookups = (0..20).map(|i| {
            let batcher = Arc::clone(&batcher);
            tokio::spawn(async move {
                batcher
                    .get(&if i == 3 {
                        "missing".to_owned()
                    } else {
                        format!("vol-{i}")
                    })
                    .await
            })
        });
        let results: Vec<_> = futures_join(lookups).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(results.iter().filter(|r| r.as_ref().unwrap().is_none()).count(), 1);
        assert_eq!(results.iter().filter(|r| *r.as_ref().unwrap() == Some(7)).count(), 19);
    }

    #[tokio::test]
    async fn sends_a_full_batch_at_once_and_can_be_disabled() {
        let calls = Arc::new(AtomicUsize::new(0));
        let config = BatchConfig {
            enabled: true,
            window: Duration::from_secs(60),
            max_ids: 2,
        };
        let batcher = Arc::new(Batcher::new(config, counting(Arc::clone(&calls))));
        let (a, b) = tokio::join!(batcher.get("a"), batcher.get("b"));
        assert_eq!((a.unwrap(), b.unwrap()), (Some(7), Some(7)));
        let off = Batcher::new(
            BatchConfig {
                enabled: false,
                ..config
            },
            counting(Arc::clone(&calls)),
        );
        assert_eq!(off.get("c").await.unwrap(), Some(7));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    async fn futures_join<T>(handles: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
        let mut out = Vec::new();
        for handle in handles.collect::<Vec<_>>() {
            out.push(handle.await.unwrap());
        }
        out
    }
}
