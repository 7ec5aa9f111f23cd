//! Batching of Describe calls: lookups by id from concurrent callers
//! become one call. A lookup in a quiet moment is sent after a short
//! linger, so a burst of callers lands in one call. Under load the calls
//! of one batcher keep apart: a new id waits until a gap has passed since
//! the last call, an id that was in the last call (a wait looking again)
//! until a whole window has, and each call carries everything asked for
//! by then. The Go driver instead holds every lookup for a fixed 500 ms
//! window (at most 500 ids). Ids that are not found come back as `None` to
//! their own caller only; the batch call filters by id, which EC2 answers
//! without an error for missing ids.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

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
    /// The least time between a call and the next that only looks again
    /// at ids it had.
    pub window: Duration,
    /// The least time between a call and the next that has a new id.
    pub gap: Duration,
    /// How long a lookup in a quiet moment waits for others to join.
    pub linger: Duration,
    /// Ids per call at most; a full batch is sent at once.
    pub max_ids: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            window: Duration::from_millis(200),
            gap: Duration::from_millis(100),
            linger: Duration::from_millis(10),
            max_ids: 500,
        }
    }
}

/// The lookups waiting for the next call, when it is due, and what the
/// last call was.
struct Queue<V> {
    waiters: HashMap<String, Vec<Waiter<V>>>,
    /// The next call's time and generation; a call scheduled earlier than
    /// planned makes the planned one stale.
    due: Option<(Instant, u64)>,
    generation: u64,
    last_call: Option<(Instant, HashSet<String>)>,
}

impl<V> Default for Queue<V> {
    fn default() -> Self {
        Self {
            waiters: HashMap::new(),
            due: None,
            generation: 0,
            last_call: None,
        }
    }
}

type Shared<V> = Arc<Mutex<Queue<V>>>;

/// Merges concurrent lookups by id into one call of `fetch`.
pub struct Batcher<V> {
    config: BatchConfig,
    fetch: Fetch<V>,
    queue: Shared<V>,
}

impl<V: Clone + Send + 'static> Batcher<V> {
    fn new(config: BatchConfig, fetch: Fetch<V>) -> Self {
        Self {
            config,
            fetch,
            queue: Arc::default(),
        }
    }

    /// Looks `id` up, together with whatever else is asked for until the
    /// next call.
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
        let call = {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.waiters.entry(id.to_owned()).or_default().push(tx);
            let now = Instant::now();
            let at = if queue.waiters.len() >= self.config.max_ids {
                now
            } else {
                let quiet = now + self.config.linger;
                queue.last_call.as_ref().map_or(quiet, |(last, ids)| {
                    let apart = if ids.contains(id) {
                        self.config.window
                    } else {
                        self.config.gap
                    };
                    quiet.max(*last + apart)
                })
            };
            (queue.due.is_none_or(|(due, _)| at < due)).then(|| {
                queue.generation += 1;
                queue.due = Some((at, queue.generation));
                (at, queue.generation)
            })
        };
        if let Some((at, generation)) = call {
            let (queue, fetch) = (Arc::clone(&self.queue), Arc::clone(&self.fetch));
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                flush(queue, fetch, generation).await;
            });
        }
        rx.await
            .unwrap_or_else(|_| Err(Ec2Error::Transport("batch dropped".into())))
    }
}

/// Makes the call of `generation`, unless an earlier one took its place.
async fn flush<V: Clone>(queue: Shared<V>, fetch: Fetch<V>, generation: u64) {
    let waiters = {
        let mut queue = queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.due.is_none_or(|(_, due)| due != generation) {
            return;
        }
        queue.due = None;
        let waiters = std::mem::take(&mut queue.waiters);
        queue.last_call = Some((Instant::now(), waiters.keys().cloned().collect()));
        waiters
    };
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
            window: Duration::from_millis(50),
            ..BatchConfig::default()
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
            window: Duration::from_secs(60),
            linger: Duration::from_secs(60),
            max_ids: 2,
            ..BatchConfig::default()
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

    /// A lookup in a quiet moment waits only the linger. Under load a
    /// wait looking again at its id waits a window after the last call,
    /// while a new id brings the call forward to a gap after it, and both
    /// ride that one call.
    #[tokio::test(start_paused = true)]
    async fn lingers_when_quiet_and_keeps_calls_apart_under_load() {
        let calls = Arc::new(AtomicUsize::new(0));
        let config = BatchConfig {
            window: Duration::from_millis(250),
            gap: Duration::from_millis(100),
            linger: Duration::from_millis(10),
            ..BatchConfig::default()
        };
        let batcher = Arc::new(Batcher::new(config, counting(Arc::clone(&calls))));
        let start = Instant::now();
        let elapsed = || start.elapsed().as_millis();
        batcher.get("a").await.unwrap();
        assert_eq!(elapsed(), 10, "quiet: the linger");
        let (again, new) = tokio::join!(batcher.get("a"), async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            batcher.get("b").await
        });
        assert_eq!((again.unwrap(), new.unwrap()), (Some(7), Some(7)));
        assert_eq!(elapsed(), 110, "the new id: a gap after the first call");
        batcher.get("b").await.unwrap();
        assert_eq!(elapsed(), 360, "looking again: a window after the last call");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let quiet = Instant::now();
        batcher.get("c").await.unwrap();
        assert_eq!(quiet.elapsed(), Duration::from_millis(10));
    }

    async fn futures_join<T>(handles: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
        let mut out = Vec::new();
        for handle in handles.collect::<Vec<_>>() {
            out.push(handle.await.unwrap());
        }
        out
    }
}
