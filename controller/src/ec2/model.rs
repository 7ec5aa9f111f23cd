//! An in-memory EC2 for unit tests: the behaviours moto lacks (DESIGN.md
//! §5, §10) — state changes that take time, with spread; eventual
//! consistency; ClientToken semantics with `IdempotentParameterMismatch`,
//! attachment limits, Multi-Attach rules, refused device names, the
//! modification rules (one at a time, four a day: [`Behaviour::optimize_delay`])
//! and throttling (EC2's documented request token buckets,
//! [`super::limits`]).
//!
//! Eventual consistency as the Amazon EC2 Developer Guide describes it
//! ("Eventual consistency in the Amazon EC2 API"): a volume, snapshot or
//! modification just created is left out of Describe calls for a
//! while (by id, EC2 answers `InvalidVolume.NotFound`; the controller's
//! filtered calls simply miss it), and other calls naming it answer
//! `NotFound`; after a change (attach, detach, tags, modification,
//! delete) Describe calls still show the volume as it was for a while.
//! Each state change and each lag takes its nominal time times a factor
//! drawn from 0.5–1.5, from a seeded generator.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::limits::{Bucket, default_bucket};
use super::{
    Attachment, AttachmentState, CreateSnapshotInput, CreateVolumeInput, Ec2, Ec2Error, Initializing, Instance,
    Modification, ModificationState, ModifyVolumeInput, Selector, Snapshot, SnapshotLock, SnapshotState, Tags, Volume,
    VolumeHealth, VolumeState, Zone,
};

/// How the model behaves.
#[derive(Clone, Debug)]
pub struct Behaviour {
    /// `creating` → `available` after about this long (EC2 API
    /// Reference, CreateVolume: the answer says `creating`).
    pub create_delay: Duration,
    /// New volumes end in `error` instead.
    pub creations_fail: bool,
    /// `attaching` → `attached` after about this long; `None`: never.
    pub attach_delay: Option<Duration>,
    /// `detaching` → gone after about this long.
    pub detach_delay: Duration,
    /// A modification is `optimizing` for about this long, then
    /// `completed`. EC2 API Reference, ModifyVolume: "you must wait for
    /// that modification to reach the completed state before you can
    /// initiate another modification for the same volume", and "up to four
    /// times within a rolling 24-hour period"; the model refuses the one
    /// with `IncorrectModificationState`, the other with
    /// `VolumeModificationRateExceeded`, each with EC2's message.
    pub optimize_delay: Duration,
    /// How long, about, a new resource stays out of Describe calls, and
    /// a changed one shows its earlier state there.
    pub visibility_lag: Duration,
    /// Seeds the spread of every delay and lag.
    pub seed: u64,
    /// DescribeVolumeStatus reports every volume impaired.
    pub volumes_impaired: bool,
    /// DescribeVolumeStatus reports every volume still initializing.
    pub initializing: Option<Initializing>,
    /// DescribeInstanceTypes reports this many EBS cards for every type
    /// (`EbsInfo.MaximumEbsCards`, present on types with several).
    pub ebs_cards: Option<i32>,
    /// Attachments per instance, root volume included.
    pub attachment_limit: usize,
    /// Device names AttachVolume refuses.
    pub refused_names: Vec<String>,
    /// The account has EBS encryption by default on: every new volume is
    /// encrypted, whatever CreateVolume's `Encrypted` says (Amazon EBS User
    /// Guide, "Encryption by default").
    pub encrypted_by_default: bool,
    /// Calls draw on EC2's default request token buckets
    /// ([`super::limits::default_bucket`]), refilled every whole second
    /// since the model was made ("a set number of tokens is added back to
    /// it every second"), and one that finds its bucket empty is answered
    /// `RequestLimitExceeded`.
    pub request_limits: bool,
    /// The share of calls EC2 answers 500 `InternalError` (EC2 API
    /// Reference, "Error codes"). The model plays the SDK's part too: its
    /// standard retry sends such a call again after a backoff drawn from
    /// 0–1 s, doubling per attempt, at most 3 attempts
    /// (`RetryConfig::adaptive()`'s defaults in aws-smithy-types); the
    /// third failure is the caller's `InternalError`.
    pub server_errors: f64,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            create_delay: Duration::from_millis(300),
            creations_fail: false,
            attach_delay: Some(Duration::from_millis(300)),
            detach_delay: Duration::from_millis(300),
            // EC2 optimizes for minutes to hours (Amazon EBS User Guide,
            // "Monitor the progress of volume modifications").
            optimize_delay: Duration::from_secs(3600),
            visibility_lag: Duration::from_millis(200),
            seed: 1,
            volumes_impaired: false,
            initializing: None,
            ebs_cards: None,
            attachment_limit: 28,
            refused_names: Vec::new(),
            encrypted_by_default: false,
            request_limits: false,
            server_errors: 0.0,
        }
    }
}

/// EC2's modifications per volume within a rolling window (EC2 API
/// Reference, ModifyVolume: "up to four times within a rolling 24-hour
/// period").
const MODIFICATIONS_PER_WINDOW: usize = 4;
/// See [`MODIFICATIONS_PER_WINDOW`].
const MODIFICATION_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// A volume as EC2 keeps it, and when its Describe calls show what.
struct Record {
    volume: Volume,
    /// `creating` ends then.
    ready_at: Instant,
    /// Left out of Describe calls until then.
    visible_at: Instant,
    /// Describe calls show this earlier state until the moment given.
    earlier: Option<(Volume, Instant)>,
    /// DeleteVolume took it: gone from Describe calls once `earlier` has
    /// passed, kept for the answer to its client token.
    deleted: bool,
}

impl Record {
    /// What a Describe call answers at `now`.
    fn shown(&self, now: Instant) -> Option<&Volume> {
        match &self.earlier {
            _ if now < self.visible_at => None,
            Some((earlier, until)) if now < *until => Some(earlier),
            _ => (!self.deleted).then_some(&self.volume),
        }
    }
}

#[derive(Default)]
struct State {
    volumes: BTreeMap<String, Record>,
    /// When each (volume, instance) attachment becomes `attached`.
    attached_at: HashMap<(String, String), Instant>,
    /// When each (volume, instance) detachment ends.
    detached_at: HashMap<(String, String), Instant>,
    tokens: HashMap<String, (CreateVolumeInput, String)>,
    instances: HashMap<String, Instance>,
    /// Snapshots, each visible from the moment given.
    snapshots: BTreeMap<String, (Snapshot, Instant)>,
    /// Each volume's last modification, visible from the first moment
    /// given, `completed` from the second.
    modifications: HashMap<String, (Modification, Instant, Instant)>,
    /// When each volume's modifications began, for EC2's four a day.
    modified_at: HashMap<String, Vec<Instant>>,
    rng: fastrand::Rng,
    ebs_cards_asked: Vec<Option<i32>>,
    calls: HashMap<&'static str, usize>,
    throttled_calls: usize,
    server_errors: usize,
    buckets: HashMap<&'static str, ServerBucket>,
    log: Vec<(Duration, bool)>,
    next_id: u64,
}

/// One action's bucket as EC2 keeps it: full at first, refilled in whole
/// seconds.
struct ServerBucket {
    tokens: f64,
    seconds: u64,
}

impl ServerBucket {
    /// Takes a token `elapsed` after the model was made, if there is one.
    fn take(&mut self, limit: Bucket, elapsed: Duration) -> bool {
        let seconds = elapsed.as_secs();
        #[allow(clippy::cast_precision_loss, reason = "seconds of a test run")]
        let refill = (seconds - self.seconds) as f64 * limit.refill_per_second;
        self.tokens = (self.tokens + refill).min(limit.capacity);
        self.seconds = seconds;
        let taken = self.tokens >= 1.0;
        if taken {
            self.tokens -= 1.0;
        }
        taken
    }
}

/// The model.
pub struct Model {
    behaviour: Behaviour,
    state: Mutex<State>,
    made: Instant,
}

impl State {
    /// A new `pending` snapshot of `volume_id`, kept out of Describe calls
    /// for about `lag` (EC2 API Reference, CreateSnapshot's answer).
    fn new_snapshot(&mut self, volume_id: &str, size_gib: i32, tags: Tags, lag: Duration) -> Snapshot {
        self.next_id += 1;
        let snapshot = Snapshot {
            id: format!("snap-{:017x}", self.next_id),
            volume_id: volume_id.into(),
            size_gib,
            state: SnapshotState::Pending,
            start_time_seconds: 0,
            tags,
        };
        let visible_at = self.after(lag);
        self.snapshots
            .insert(snapshot.id.clone(), (snapshot.clone(), visible_at));
        snapshot
    }

    /// About `nominal` from now: times a factor drawn from 0.5–1.5.
    fn after(&mut self, nominal: Duration) -> Instant {
        Instant::now() + nominal.mul_f64(0.5 + self.rng.f64())
    }

    /// The volume `id` for a call that names it: one DeleteVolume took or
    /// that is not visible yet is `NotFound`, as EC2 answers.
    fn live(&mut self, id: &str) -> Result<&mut Record, Ec2Error> {
        let now = Instant::now();
        self.volumes
            .get_mut(id)
            .filter(|r| !r.deleted && now >= r.visible_at)
            .ok_or_else(|| Model::missing(id))
    }
}

impl Model {
    /// An empty region with `behaviour`.
    pub fn new(behaviour: Behaviour) -> Self {
        let state = State {
            rng: fastrand::Rng::with_seed(behaviour.seed),
            ..State::default()
        };
        Self {
            behaviour,
            state: Mutex::new(state),
            made: Instant::now(),
        }
    }

    /// Before a change of `id`: Describe calls keep showing the volume as
    /// it is now for about the visibility lag (or longer, if an earlier
    /// change still shows).
    fn changing(&self, state: &mut State, id: &str) {
        let until = state.after(self.behaviour.visibility_lag);
        let now = Instant::now();
        if let Some(record) = state.volumes.get_mut(id) {
            match &mut record.earlier {
                Some((_, shown_until)) if now < *shown_until => *shown_until = until.max(*shown_until),
                earlier => *earlier = Some((record.volume.clone(), until)),
            }
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds an instance with only a root volume.
    pub fn add_instance(&self, id: &str, zone: &str) {
        let instance = Instance {
            id: id.into(),
            zone: zone.into(),
            device_names: vec!["/dev/xvda".into()],
            instance_type: "m5.large".into(),
            ebs_cards_in_use: vec![0],
            data_volume_ids: Vec::new(),
            network_interfaces: 1,
        };
        self.state().instances.insert(id.into(), instance);
    }

    /// The `EbsCardIndex` of each AttachVolume, in order.
    pub fn ebs_cards_asked(&self) -> Vec<Option<i32>> {
        self.state().ebs_cards_asked.clone()
    }

    /// Records a ClientToken as used by an earlier request with other
    /// parameters (whose volume failed or was deleted).
    pub fn burn_token(&self, token: &str) {
        let input = CreateVolumeInput {
            size_gib: -1,
            ..CreateVolumeInput::default()
        };
        self.state().tokens.insert(token.into(), (input, "vol-gone".into()));
    }

    /// Makes the next `count` calls fail with `RequestLimitExceeded`.
    pub fn throttle(&self, count: usize) {
        self.state().throttled_calls = count;
    }

    /// How many calls of `api` were made.
    pub fn calls(&self, api: &str) -> usize {
        self.state().calls.get(api).copied().unwrap_or_default()
    }

    /// How many calls were answered `RequestLimitExceeded`.
    pub fn throttled(&self) -> usize {
        self.state().log.iter().filter(|(_, throttled)| *throttled).count()
    }

    /// Every call: when, after the model was made, and whether it was
    /// throttled.
    pub fn call_log(&self) -> Vec<(Duration, bool)> {
        self.state().log.clone()
    }

    /// How many calls were made, all APIs together.
    pub fn total_calls(&self) -> usize {
        self.state().calls.values().sum()
    }

    /// The ids of the volumes EC2 has now (DeleteVolume took none of them).
    pub fn volumes(&self) -> Vec<String> {
        let state = self.state();
        state
            .volumes
            .values()
            .filter(|r| !r.deleted)
            .map(|r| r.volume.id.clone())
            .collect()
    }

    /// The ids of the snapshots EC2 has now.
    pub fn snapshots(&self) -> Vec<String> {
        self.state().snapshots.keys().cloned().collect()
    }

    /// The tags of snapshot `id` (none if there is no such snapshot).
    pub fn snapshot_tags(&self, id: &str) -> Tags {
        self.state()
            .snapshots
            .get(id)
            .map(|(s, _)| s.tags.clone())
            .unwrap_or_default()
    }

    /// The volume as EC2 has it now (not as a Describe call may show it).
    pub fn volume(&self, id: &str) -> Option<Volume> {
        let mut state = self.state();
        self.advance(&mut state);
        state.volumes.get(id).filter(|r| !r.deleted).map(|r| r.volume.clone())
    }

    /// [`Model::call`] through the SDK's retry of 500 answers
    /// ([`Behaviour::server_errors`]).
    async fn sdk_call(&self, api: &'static str) -> Result<std::sync::MutexGuard<'_, State>, Ec2Error> {
        const ATTEMPTS: u32 = 3;
        let share = self.behaviour.server_errors;
        let mut attempt = 1;
        loop {
            let backoff = {
                let mut state = self.call(api)?;
                if share == 0.0 || state.rng.f64() >= share {
                    return Ok(state);
                }
                state.server_errors += 1;
                if attempt == ATTEMPTS {
                    return Err(Ec2Error::Service {
                        code: "InternalError".into(),
                        message: "An internal error has occurred.".into(),
                    });
                }
                Duration::from_secs_f64(state.rng.f64() * f64::from(1u32 << (attempt - 1)))
            };
            tokio::time::sleep(backoff).await;
            attempt += 1;
        }
    }

    /// How many calls were answered 500 `InternalError`.
    pub fn server_errors(&self) -> usize {
        self.state().server_errors
    }

    /// Counts a call and applies throttling.
    fn call(&self, api: &'static str) -> Result<std::sync::MutexGuard<'_, State>, Ec2Error> {
        let mut state = self.state();
        *state.calls.entry(api).or_default() += 1;
        let forced = state.throttled_calls > 0;
        state.throttled_calls = state.throttled_calls.saturating_sub(1);
        let limited = !forced && self.behaviour.request_limits && {
            let action = match api {
                "DryRun" => "DescribeAvailabilityZones",
                _ => api.trim_end_matches("/DryRun"),
            };
            let limit = default_bucket(action);
            let bucket = state.buckets.entry(action).or_insert(ServerBucket {
                tokens: limit.capacity,
                seconds: 0,
            });
            !bucket.take(limit, self.made.elapsed())
        };
        state.log.push((self.made.elapsed(), forced || limited));
        if forced || limited {
            // EC2 API Reference, "Error codes": RequestLimitExceeded.
            return Err(Ec2Error::Throttled(format!("{api}: Request limit exceeded.")));
        }
        self.advance(&mut state);
        Ok(state)
    }

    /// Moves every state change whose time has come.
    fn advance(&self, state: &mut State) {
        let now = Instant::now();
        let State {
            volumes,
            attached_at,
            detached_at,
            ..
        } = state;
        for record in volumes.values_mut() {
            let volume = &mut record.volume;
            if volume.state == VolumeState::Creating && now >= record.ready_at {
                volume.state = if self.behaviour.creations_fail {
                    VolumeState::Error
                } else {
                    VolumeState::Available
                };
            }
            for a in &mut volume.attachments {
                let key = (volume.id.clone(), a.instance_id.clone());
                if a.state == AttachmentState::Attaching && attached_at.get(&key).is_some_and(|t| now >= *t) {
                    a.state = AttachmentState::Attached;
                }
                if a.state == AttachmentState::Detaching && detached_at.get(&key).is_some_and(|t| now >= *t) {
                    a.state = AttachmentState::Detached;
                }
            }
            volume.attachments.retain(|a| a.state != AttachmentState::Detached);
            if matches!(volume.state, VolumeState::InUse | VolumeState::Available) {
                volume.state = if volume.attachments.is_empty() {
                    VolumeState::Available
                } else {
                    VolumeState::InUse
                };
            }
        }
    }

    fn missing(id: &str) -> Ec2Error {
        Ec2Error::NotFound(format!("The resource '{id}' does not exist"))
    }
}

fn matches(selector: &Selector, id: &str, tags: &Tags, volume_id: &str) -> bool {
    match selector {
        Selector::Ids(ids) => ids.iter().any(|i| i == id),
        Selector::Tag(k, values) => tags.get(k).is_some_and(|v| values.contains(v)),
        Selector::TagKey(k) => tags.contains_key(k),
        Selector::SourceVolume(v) => volume_id == v,
    }
}

/// gp3's throughput range in MiB/s and its IOPS when none are asked (EC2
/// API Reference, CreateVolume: `Throughput`, "Valid Range: Minimum value
/// of 125. Maximum value of 2000"; `Iops`, gp3 "3,000").
const GP3_THROUGHPUT: (i32, i32) = (125, 2_000);
/// See [`GP3_THROUGHPUT`].
const GP3_BASELINE_IOPS: i32 = 3_000;
/// gp3's most throughput per provisioned IOPS, MiB/s (Amazon EBS User
/// Guide, "General Purpose SSD volumes": "0.25 MiB/s per provisioned IOPS").
const GP3_THROUGHPUT_PER_IOPS: f64 = 0.25;

/// EC2's refusal of `throughput` MiB/s on a `volume_type` volume of `iops`,
/// checked as EC2 checks it, each message as EC2 gives it: throughput on
/// another type than gp3 (`InvalidParameterCombination`, quoted in
/// runs-on/runs-on#426), out of gp3's range (`InvalidParameterValue`,
/// "Volume throughput o…" as gardener/gardener-extension-provider-aws#590
/// quotes it, in the form of EC2's "Volume iops of … is too high; maximum
/// is …"), above 0.25 MiB/s per IOPS (quoted in runs-on/runs-on#260).
fn throughput_refusal(volume_type: &str, iops: Option<i32>, throughput: Option<i32>) -> Option<Ec2Error> {
    let throughput = throughput?;
    if volume_type != "gp3" {
        return Some(Ec2Error::InvalidParameter(
            "throughput can only be specified for volumeType gp3.".to_owned(),
        ));
    }
    let (min, max) = GP3_THROUGHPUT;
    if throughput < min {
        return Some(Ec2Error::InvalidParameter(format!(
            "Volume throughput of {throughput} is too low; minimum is {min}"
        )));
    }
    if throughput > max {
        return Some(Ec2Error::InvalidParameter(format!(
            "Volume throughput of {throughput} is too high; maximum is {max}"
        )));
    }
    let ratio = f64::from(throughput) / f64::from(iops.unwrap_or(GP3_BASELINE_IOPS));
    (ratio > GP3_THROUGHPUT_PER_IOPS).then(|| {
        Ec2Error::InvalidParameter(format!(
            "Throughput (MiBps) to iops ratio of {ratio:.6} is too high; maximum is {GP3_THROUGHPUT_PER_IOPS:.6} MiBps per iops"
        ))
    })
}

/// Whether `volume` is attached (or attaching) to `instance_id`.
fn attached_to(volume: &Volume, instance_id: &str) -> bool {
    volume
        .attachments
        .iter()
        .any(|a| a.instance_id == instance_id && a.state != AttachmentState::Detached)
}

impl Ec2 for Model {
    async fn create_volume(&self, input: CreateVolumeInput) -> Result<Volume, Ec2Error> {
        let mut state = self.sdk_call("CreateVolume").await?;
        if let Some(refusal) = throughput_refusal(&input.volume_type, input.iops, input.throughput) {
            return Err(refusal);
        }
        let request = CreateVolumeInput {
            client_token: String::new(),
            ..input.clone()
        };
        if let Some((earlier, id)) = state.tokens.get(&input.client_token) {
            if *earlier != request {
                return Err(Ec2Error::IdempotentParameterMismatch(
                    "ClientToken reused with other parameters".into(),
                ));
            }
            // EC2 answers a repeat with the volume in its state now,
            // visible or not yet, deleted or not ("Ensuring idempotency
            // in Amazon EC2 API requests": "the result might contain
            // updated information").
            let id = id.clone();
            return state
                .volumes
                .get(&id)
                .map(|r| Volume {
                    state: if r.deleted {
                        VolumeState::Deleted
                    } else {
                        r.volume.state.clone()
                    },
                    ..r.volume.clone()
                })
                .ok_or_else(|| Self::missing(&id));
        }
        state.next_id += 1;
        let id = format!("vol-{:017x}", state.next_id);
        let volume = Volume {
            id: id.clone(),
            size_gib: input.size_gib,
            state: VolumeState::Creating,
            zone: input.zone,
            volume_type: input.volume_type,
            iops: input.iops,
            throughput: input.throughput,
            encrypted: input.encrypted || self.behaviour.encrypted_by_default,
            kms_key_id: input.kms_key_id,
            snapshot_id: input.snapshot_id,
            multi_attach: input.multi_attach,
            outpost_arn: input.outpost_arn,
            tags: input.tags,
            attachments: Vec::new(),
        };
        state.tokens.insert(input.client_token, (request, id.clone()));
        let record = Record {
            volume: volume.clone(),
            ready_at: state.after(self.behaviour.create_delay),
            visible_at: state.after(self.behaviour.visibility_lag),
            earlier: None,
            deleted: false,
        };
        state.volumes.insert(id, record);
        Ok(volume)
    }

    async fn copy_volume(&self, source_volume_id: &str, mut input: CreateVolumeInput) -> Result<Volume, Ec2Error> {
        input.zone = self
            .sdk_call("CopyVolumes")
            .await?
            .live(source_volume_id)?
            .volume
            .zone
            .clone();
        self.create_volume(input).await
    }

    async fn describe_volume_status(&self, volume_id: &str) -> Result<Option<VolumeHealth>, Ec2Error> {
        let mut state = self.sdk_call("DescribeVolumeStatus").await?;
        let impaired = self.behaviour.volumes_impaired;
        let initializing = self.behaviour.initializing;
        Ok(state.live(volume_id).is_ok().then(|| VolumeHealth {
            impaired,
            detail: format!(
                "volume status {}",
                if impaired { "impaired; io-enabled: failed" } else { "ok" }
            ),
            initializing,
        }))
    }

    async fn delete_volume(&self, volume_id: &str) -> Result<(), Ec2Error> {
        let mut state = self.sdk_call("DeleteVolume").await?;
        if !state.live(volume_id)?.volume.attachments.is_empty() {
            return Err(Ec2Error::IncorrectState(format!("Volume {volume_id} is in use")));
        }
        self.changing(&mut state, volume_id);
        state.live(volume_id)?.deleted = true;
        Ok(())
    }

    async fn describe_volumes(&self, selector: Selector) -> Result<Vec<Volume>, Ec2Error> {
        let state = self.sdk_call("DescribeVolumes").await?;
        let now = Instant::now();
        Ok(state
            .volumes
            .values()
            .filter_map(|r| r.shown(now))
            .filter(|v| matches(&selector, &v.id, &v.tags, &v.id))
            .cloned()
            .collect())
    }

    async fn attach_volume(
        &self,
        volume_id: &str,
        instance_id: &str,
        device: &str,
        ebs_card: Option<i32>,
    ) -> Result<(), Ec2Error> {
        let mut state = self.sdk_call("AttachVolume").await?;
        if self.behaviour.refused_names.iter().any(|n| n == device) {
            return Err(Ec2Error::DeviceNameRefused(format!(
                "Invalid value '{device}' for unixDevice. Attachment point {device} is already in use"
            )));
        }
        let attached_to_instance = state
            .volumes
            .values()
            .filter(|r| !r.deleted && r.volume.attachments.iter().any(|a| a.instance_id == instance_id))
            .count();
        let instance = state
            .instances
            .get(instance_id)
            .cloned()
            .ok_or_else(|| Self::missing(instance_id))?;
        if attached_to_instance + instance.device_names.len() >= self.behaviour.attachment_limit {
            return Err(Ec2Error::AttachmentLimitExceeded(format!(
                "instance {instance_id} has no attachment slot left"
            )));
        }
        let volume = &state.live(volume_id)?.volume;
        if volume.zone != instance.zone {
            return Err(Ec2Error::IncorrectState("InvalidVolume.ZoneMismatch".into()));
        }
        if volume.state == VolumeState::Creating || (!volume.attachments.is_empty() && !volume.multi_attach) {
            return Err(Ec2Error::IncorrectState(format!("vol {volume_id} is not available")));
        }
        self.changing(&mut state, volume_id);
        let volume = &mut state.live(volume_id)?.volume;
        volume.attachments.push(Attachment {
            instance_id: instance_id.into(),
            device: device.into(),
            state: AttachmentState::Attaching,
        });
        volume.state = VolumeState::InUse;
        let key = (volume_id.to_owned(), instance_id.to_owned());
        match self.behaviour.attach_delay {
            Some(delay) => {
                let at = state.after(delay);
                state.attached_at.insert(key, at);
            }
            None => drop(state.attached_at.remove(&key)),
        }
        if let Some(instance) = state.instances.get_mut(instance_id) {
            instance.ebs_cards_in_use.push(ebs_card.unwrap_or(0));
        }
        state.ebs_cards_asked.push(ebs_card);
        Ok(())
    }

    /// `EbsInfo.MaximumEbsCards` as [`Behaviour::ebs_cards`] says.
    async fn ebs_cards(&self, _instance_type: &str) -> Result<Option<i32>, Ec2Error> {
        self.sdk_call("DescribeInstanceTypes")
            .await
            .map(|_| self.behaviour.ebs_cards)
    }

    async fn detach_volume(&self, volume_id: &str, instance_id: &str) -> Result<(), Ec2Error> {
        let mut state = self.sdk_call("DetachVolume").await?;
        let volume = &state.live(volume_id)?.volume;
        // EC2's answers: a volume attached nowhere is `IncorrectState`
        // "Volume 'vol-…' is in the 'available' state." (the response
        // captured in kubernetes-sigs/aws-ebs-csi-driver#1801); one attached
        // elsewhere is `InvalidAttachment.NotFound` (EC2 API Reference,
        // "Error codes").
        if volume.attachments.is_empty() {
            return Err(Ec2Error::IncorrectState(format!(
                "Volume '{volume_id}' is in the 'available' state."
            )));
        }
        if !volume.attachments.iter().any(|a| a.instance_id == instance_id) {
            return Err(Ec2Error::NotFound(format!(
                "The volume {volume_id} is not attached to instance {instance_id}"
            )));
        }
        self.changing(&mut state, volume_id);
        let at = state.after(self.behaviour.detach_delay);
        let volume = &mut state.live(volume_id)?.volume;
        for a in volume.attachments.iter_mut().filter(|a| a.instance_id == instance_id) {
            a.state = AttachmentState::Detaching;
        }
        state.detached_at.insert((volume_id.into(), instance_id.into()), at);
        Ok(())
    }

    async fn describe_instances(&self, ids: Vec<String>) -> Result<Vec<Instance>, Ec2Error> {
        let state = self.sdk_call("DescribeInstances").await?;
        let data_volumes = |id: &str| {
            let attached = state
                .volumes
                .values()
                .filter(|r| !r.deleted && attached_to(&r.volume, id));
            attached.map(|r| r.volume.id.clone()).collect()
        };
        Ok(ids
            .iter()
            .filter_map(|id| state.instances.get(id).cloned())
            .map(|instance| Instance {
                data_volume_ids: data_volumes(&instance.id),
                ..instance
            })
            .collect())
    }

    async fn create_snapshot(&self, volume_id: &str, input: CreateSnapshotInput) -> Result<Snapshot, Ec2Error> {
        let mut state = self.sdk_call("CreateSnapshot").await?;
        let size_gib = state.live(volume_id)?.volume.size_gib;
        Ok(state.new_snapshot(volume_id, size_gib, input.tags, self.behaviour.visibility_lag))
    }

    async fn create_snapshots(
        &self,
        instance_id: &str,
        excluded_volume_ids: Vec<String>,
        tags: Tags,
    ) -> Result<Vec<Snapshot>, Ec2Error> {
        let mut state = self.sdk_call("CreateSnapshots").await?;
        if !state.instances.contains_key(instance_id) {
            return Err(Ec2Error::NotFound(format!(
                "The instance ID '{instance_id}' does not exist"
            )));
        }
        let sources: Vec<(String, i32)> = state
            .volumes
            .values()
            .filter(|r| !r.deleted && attached_to(&r.volume, instance_id))
            .filter(|r| !excluded_volume_ids.contains(&r.volume.id))
            .map(|r| (r.volume.id.clone(), r.volume.size_gib))
            .collect();
        let lag = self.behaviour.visibility_lag;
        let made = sources
            .into_iter()
            .map(|(volume_id, size_gib)| state.new_snapshot(&volume_id, size_gib, tags.clone(), lag))
            .collect();
        Ok(made)
    }

    async fn lock_snapshot(&self, snapshot_id: &str, _lock: &SnapshotLock) -> Result<(), Ec2Error> {
        let state = self.sdk_call("LockSnapshot").await?;
        let now = Instant::now();
        state
            .snapshots
            .get(snapshot_id)
            .filter(|(_, visible_at)| now >= *visible_at)
            .map(drop)
            .ok_or_else(|| Ec2Error::NotFound(format!("The snapshot '{snapshot_id}' does not exist.")))
    }

    async fn enable_fast_snapshot_restores(
        &self,
        _snapshot_id: &str,
        _zones: &[String],
    ) -> Result<Vec<String>, Ec2Error> {
        self.sdk_call("EnableFastSnapshotRestores").await.map(|_| Vec::new())
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), Ec2Error> {
        let mut state = self.sdk_call("DeleteSnapshot").await?;
        state
            .snapshots
            .remove(snapshot_id)
            .map(drop)
            .ok_or_else(|| Self::missing(snapshot_id))
    }

    async fn describe_snapshots(&self, selector: Selector) -> Result<Vec<Snapshot>, Ec2Error> {
        let state = self.sdk_call("DescribeSnapshots").await?;
        let now = Instant::now();
        Ok(state
            .snapshots
            .values()
            .filter(|(s, visible_at)| now >= *visible_at && matches(&selector, &s.id, &s.tags, &s.volume_id))
            .map(|(s, _)| s.clone())
            .collect())
    }

    async fn modify_volume(&self, volume_id: &str, input: ModifyVolumeInput) -> Result<(), Ec2Error> {
        let mut state = self.sdk_call("ModifyVolume").await?;
        let now = Instant::now();
        if state
            .modifications
            .get(volume_id)
            .is_some_and(|(_, _, completed_at)| now < *completed_at)
        {
            // The message as EC2 gives it (AWS Knowledge Center,
            // "cloudformation-ebs-volume-error").
            return Err(Ec2Error::IncorrectState(format!(
                "IncorrectModificationState: Volume {volume_id} cannot be modified in modification state OPTIMIZING"
            )));
        }
        let began = state.modified_at.entry(volume_id.into()).or_default();
        began.retain(|at| now.duration_since(*at) < MODIFICATION_WINDOW);
        if began.len() >= MODIFICATIONS_PER_WINDOW {
            // EC2's message, as users quote it (dev.to, "AWS EBS root
            // volume resize: bypassing the 6-hour modification limit").
            return Err(Ec2Error::IncorrectState(
                "VolumeModificationRateExceeded: You've reached the maximum modification rate per volume limit. \
                 Wait at least 6 hours between modifications per EBS volume."
                    .to_owned(),
            ));
        }
        // EC2 judges the volume the modification would leave: its
        // throughput kept where its type is.
        let volume = &state.live(volume_id)?.volume;
        let kept = volume.throughput.filter(|_| input.volume_type.is_none());
        let volume_type = input.volume_type.as_deref().unwrap_or(&volume.volume_type);
        if let Some(refusal) = throughput_refusal(volume_type, input.iops.or(volume.iops), input.throughput.or(kept)) {
            return Err(refusal);
        }
        state.modified_at.entry(volume_id.into()).or_default().push(now);
        self.changing(&mut state, volume_id);
        let volume = &mut state.live(volume_id)?.volume;
        volume.size_gib = input.size_gib.unwrap_or(volume.size_gib);
        volume.volume_type = input.volume_type.unwrap_or_else(|| volume.volume_type.clone());
        volume.iops = input.iops.or(volume.iops);
        volume.throughput = input.throughput.or(volume.throughput);
        let modification = Modification {
            volume_id: volume_id.into(),
            state: ModificationState::Optimizing,
            target_size_gib: Some(volume.size_gib),
        };
        let visible_at = state.after(self.behaviour.visibility_lag);
        let completed_at = state.after(self.behaviour.optimize_delay);
        state
            .modifications
            .insert(volume_id.into(), (modification, visible_at, completed_at));
        Ok(())
    }

    async fn describe_volumes_modifications(&self, ids: Vec<String>) -> Result<Vec<Modification>, Ec2Error> {
        let state = self.sdk_call("DescribeVolumesModifications").await?;
        let now = Instant::now();
        Ok(ids
            .iter()
            .filter_map(|id| state.modifications.get(id))
            .filter(|(_, visible_at, _)| now >= *visible_at)
            .map(|(m, _, completed_at)| Modification {
                state: if now < *completed_at {
                    m.state
                } else {
                    ModificationState::Completed
                },
                ..m.clone()
            })
            .collect())
    }

    async fn create_tags(&self, resource_id: &str, tags: Tags) -> Result<(), Ec2Error> {
        let mut state = self.sdk_call("CreateTags").await?;
        state.live(resource_id)?;
        self.changing(&mut state, resource_id);
        state.live(resource_id)?.volume.tags.extend(tags);
        Ok(())
    }

    async fn delete_tags(&self, resource_id: &str, keys: Vec<String>) -> Result<(), Ec2Error> {
        let mut state = self.sdk_call("DeleteTags").await?;
        state.live(resource_id)?;
        self.changing(&mut state, resource_id);
        state.live(resource_id)?.volume.tags.retain(|k, _| !keys.contains(k));
        Ok(())
    }

    /// us-east-1's first three zones with the ids of one account (EC2 User
    /// Guide, "Availability Zone IDs": ids are the same in every account,
    /// names are mapped to them per account).
    async fn describe_availability_zones(&self) -> Result<Vec<Zone>, Ec2Error> {
        drop(self.sdk_call("DescribeAvailabilityZones").await?);
        let zone = |name: &str, id: &str| Zone {
            name: name.into(),
            id: id.into(),
        };
        Ok(vec![
            zone("us-east-1a", "use1-az6"),
            zone("us-east-1b", "use1-az1"),
            zone("us-east-1c", "use1-az2"),
        ])
    }

    /// EC2 names no maximum here (as for a dry run that would succeed):
    /// the documented one stands.
    async fn max_iops(
        &self,
        _volume_type: &str,
        _zone: &str,
        _size_gib: i32,
        _tags: &Tags,
    ) -> Result<Option<i32>, Ec2Error> {
        self.sdk_call("CreateVolume/DryRun").await.map(|_| None)
    }

    async fn dry_run(&self) -> Result<(), Ec2Error> {
        self.sdk_call("DryRun").await.map(drop)
    }
}

mod tests {
    use super::*;

    /// How many of `n` DescribeInstances calls in a row get through.
    async fn answered(model: &Model, n: usize) -> usize {
        let mut ok = 0;
        for _ in 0..n {
            ok += usize::from(model.describe_instances(Vec::new()).await.is_ok());
        }
        ok
    }

    /// EC2's example ("Request throttling for the Amazon EC2 API"): a
    /// non-mutating bucket of 100 tokens is empty after 100 calls, refills
    /// by 20 each second, and never holds more than 100.
    #[tokio::test(start_paused = true)]
    async fn a_bucket_empties_and_refills_as_ec2_documents() {
        let model = Model::new(Behaviour {
            request_limits: true,
            ..Behaviour::default()
        });
        assert_eq!(answered(&model, 120).await, 100);
        tokio::time::sleep(Duration::from_millis(999)).await;
        assert_eq!(answered(&model, 1).await, 0, "refill comes in whole seconds");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(answered(&model, 30).await, 20);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(answered(&model, 150).await, 100);
        assert_eq!(model.throttled(), 20 + 1 + 10 + 50);
        assert_eq!(model.calls("DescribeVolumes"), 0);
    }

    /// The model judges throughput as EC2 does, at its limits: the type,
    /// the range's two ends, the ratio to the IOPS asked or gp3's baseline.
    #[test]
    fn throughput_is_judged_as_ec2_judges_it() {
        let refused = |t: &str, iops, throughput| throughput_refusal(t, iops, Some(throughput)).map(|e| e.to_string());
        assert_eq!(throughput_refusal("gp2", None, None).map(|e| e.to_string()), None);
        assert_eq!(
            refused("io2", Some(1_000), 250).as_deref(),
            Some("invalid parameter: throughput can only be specified for volumeType gp3.")
        );
        assert_eq!(refused("gp3", None, 125), None);
        assert_eq!(refused("gp3", None, 750), None, "0.25 MiB/s per IOPS at 3,000 IOPS");
        assert_eq!(refused("gp3", Some(8_000), 2_000), None);
        assert_eq!(
            refused("gp3", None, 124).as_deref(),
            Some("invalid parameter: Volume throughput of 124 is too low; minimum is 125")
        );
        assert_eq!(
            refused("gp3", Some(80_000), 2_001).as_deref(),
            Some("invalid parameter: Volume throughput of 2001 is too high; maximum is 2000")
        );
        assert_eq!(
            refused("gp3", None, 751).as_deref(),
            Some(
                "invalid parameter: Throughput (MiBps) to iops ratio of 0.250333 is too high; maximum is 0.250000 MiBps per iops"
            )
        );
    }
}
