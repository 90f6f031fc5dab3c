//! The reducer: applies log records in sequence order to the model, then
//! re-evaluates every node the record touched (level-triggered: the whole
//! observed state decides, never the event alone) and every node whose timer
//! is due.

use std::collections::{BTreeMap, VecDeque};

use lockstep_schemas::{
    Action, ConditionStatus, Domain, Event, EventId, EventRecord, IssuedAction, KubeNode, KubePod,
    KubeScaleTarget, OutcomeResult, PodCondition, Policy, Removal, ScaleTargetRef, SlurmJob,
    SlurmNode, SlurmPartition, Taint, TaintSpec, Target,
};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::drain::{self, Cause, Ownership, SlurmSide};
use crate::health::{self, min_wake};
use crate::maintenance;
use crate::model::{
    domain_index, pod_key, slurm_name_of_pod, KubeEntry, Model, Origin, PodEntry, Seen,
};
use crate::retired::{self, Retired};
use crate::scaling::{self, PodFacts, ScaleCtl, ScaleIn, Victim, VictimKind};
use crate::slot::{reconcile_keyed, Flight, Issue, Slot, Step};
use crate::sorted;
use crate::stale::{self, ObjectKey, Tombstones};
use crate::timers::{Timers, Wake, WakeOf};
use crate::topology::{self, TopologyWant};
use crate::units::{after_ms, after_s, ms};
use lockstep_schemas::{Phase, Rule, Transition};

// `Engine::stats`: counts for metrics, read-only (a child module, so that it
// reads the private state without widening it).
#[path = "stats.rs"]
mod stats;

/// What applying records produced. Reuse one across calls; [`Output::clear`]
/// between batches.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Output {
    /// State transitions, in order.
    pub transitions: Vec<Transition>,
    /// Actions issued, in order.
    pub actions: Vec<IssuedAction>,
}

impl Output {
    /// Empties both lists, keeping their capacity.
    pub fn clear(&mut self) {
        self.transitions.clear();
        self.actions.clear();
    }
}

/// The phase of a node and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Status {
    phase: Phase,
    rule: Rule,
    cause: Option<Cause>,
}

impl Default for Status {
    fn default() -> Self {
        Self {
            phase: Phase::Unknown,
            rule: Rule::Observed,
            cause: None,
        }
    }
}

/// Per Slurm node: its status, the causes in force with their origins, the
/// state slot, and damping history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct NodeCtl {
    status: Status,
    causes: Vec<(Cause, Origin)>,
    state_slot: Slot,
    /// Log times of recent health drains (flap damping), bounded.
    health_drains: VecDeque<u64>,
    /// Whether the last drain cause was a health cause (resume hysteresis).
    last_cause_health: bool,
    /// Slurm -> Kubernetes health damping.
    #[serde(default, skip_serializing_if = "health::SlurmHealth::is_default")]
    slurm_health: health::SlurmHealth,
    /// When and by which event the last cause cleared (resume hysteresis,
    /// and the cause of the resume in the audit trail).
    cleared: Option<Origin>,
    features_slot: Slot,
    topology_slot: Slot,
    /// Why the node's topology label cannot be used, while it cannot.
    topology_issue: Option<String>,
}

/// Per Kubernetes node under maintenance (`maintenance`): the reservation
/// Slurm confirmed, the slots of the reservation and of the drain
/// conditions. Kept apart from the node's entry: a reservation outlives the
/// Node object, and is removed after it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct MaintCtl {
    /// The `SlurmReserve` whose success Slurm reported last; `None` once an
    /// `SlurmUnreserve` succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reserved: Option<Action>,
    reservation_slot: Slot,
    /// Condition type -> slot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    condition_slots: Vec<(String, Slot)>,
}

impl MaintCtl {
    fn is_idle(&self) -> bool {
        self.reserved.is_none()
            && self.reservation_slot.current.is_none()
            && self.condition_slots.is_empty()
    }
}

/// Record being applied.
struct Ctx<'a> {
    seq: u64,
    now_ms: u64,
    event: &'a EventId,
}

/// The reducer.
///
/// Feed it records in sequence order with [`Engine::apply`]; read what it
/// decided from the [`Output`]. The same records give the same state hash,
/// transitions and action ids, however they are batched.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Engine {
    policy: Policy,
    last_seq: u64,
    now_ms: u64,
    model: Model,
    #[serde(with = "sorted")]
    ctl: FxHashMap<String, NodeCtl>,
    timers: Timers,
    /// Log times of recent health drains, cluster-wide (rate bound).
    health_drains: VecDeque<u64>,
    /// Log times of nodes recently shown unhealthy in Kubernetes,
    /// cluster-wide (rate bound of the Slurm -> Kubernetes direction).
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    slurm_marks: VecDeque<u64>,
    /// Slots whose object vanished while their action was in flight. Kept
    /// until the outcome or the timeout, so an object that comes back does
    /// not get a second action racing the first.
    orphans: BTreeMap<Target, Slot>,
    /// Per scale target.
    scale: BTreeMap<ScaleTargetRef, ScaleCtl>,
    /// Slurm nodes on their way out (scale-in, rolling replacement).
    victims: BTreeMap<String, Victim>,
    /// Slurm node -> since when it runs no job (log time).
    #[serde(with = "sorted")]
    idle_since: FxHashMap<String, u64>,
    /// Deleted objects and the version they were deleted at, so that an
    /// older observation re-delivered later does not bring them back.
    #[serde(default, skip_serializing_if = "Tombstones::is_empty")]
    tombstones: Tombstones,
    /// Names earlier policies made lockstep set that the current one does
    /// not: cleaned up, and drains under old prefixes still owned.
    #[serde(default, skip_serializing_if = "Retired::is_empty")]
    retired: Retired,
    /// Kubernetes node -> its maintenance (reservation, drain conditions).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    maintenance: BTreeMap<String, MaintCtl>,
    // Derived, for scaling's fast path: rebuilt after a restore (the first
    // evaluation then scans), so neither serialized nor hashed.
    /// Slurm nodes that run or finish a job.
    #[serde(skip)]
    busy_nodes: rustc_hash::FxHashSet<String>,
    /// Per scale rule: busy nodes among its pods, kept current between scans.
    #[serde(skip)]
    scale_busy: Vec<u32>,
    /// Per scale rule: the last scan found pods of an old revision.
    #[serde(skip)]
    scale_rollout: Vec<bool>,
    /// Slurm node -> the scale rule its pod belongs to, as of the last scan
    /// (pods do not change between scans: a change forces one).
    #[serde(skip)]
    scale_rule_of: FxHashMap<String, usize>,
    /// Pods, targets or visibility changed since the last scan.
    #[serde(skip, default = "yes")]
    scale_scan_needed: bool,
    /// `--policy` replays: ignore `PolicyChanged` records.
    #[serde(skip)]
    pinned: bool,
    #[serde(skip)]
    dirty: Vec<Wake>,
    #[serde(skip)]
    scratch_causes: Vec<Cause>,
    #[serde(skip)]
    scratch_names: Vec<String>,
}

/// Errors restoring a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The bytes are not an engine snapshot of this version.
    #[error("engine snapshot does not decode")]
    Decode(#[source] rmp_serde::decode::Error),
}

impl Engine {
    /// A reducer with nothing applied yet.
    pub fn new(policy: Policy) -> Self {
        let mut model = Model::new();
        model.rebuild_indexes(&policy);
        Self {
            policy,
            last_seq: 0,
            now_ms: 0,
            model,
            ctl: FxHashMap::default(),
            timers: Timers::default(),
            health_drains: VecDeque::new(),
            slurm_marks: VecDeque::new(),
            orphans: BTreeMap::new(),
            scale: BTreeMap::new(),
            victims: BTreeMap::new(),
            idle_since: FxHashMap::default(),
            tombstones: Tombstones::default(),
            retired: Retired::default(),
            maintenance: BTreeMap::new(),
            busy_nodes: rustc_hash::FxHashSet::default(),
            scale_busy: Vec::new(),
            scale_rollout: Vec::new(),
            scale_rule_of: FxHashMap::default(),
            scale_scan_needed: true,
            pinned: false,
            dirty: Vec::new(),
            scratch_causes: Vec::new(),
            scratch_names: Vec::new(),
        }
    }

    /// Keeps this policy whatever `PolicyChanged` records say: "what would
    /// this policy have done".
    pub fn pin_policy(&mut self) {
        self.pinned = true;
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The log time of the engine's next timer (a grace period ending, an
    /// action's timeout or retry, scaling's next look): the first record at
    /// or after it, a `Tick` if nothing else, lets it fire. `None`: nothing
    /// is waiting on time, so a quiet log needs no `Tick` at all.
    pub fn next_wake_ms(&self) -> Option<u64> {
        self.timers.next()
    }

    fn ownership(&self) -> Ownership<'_> {
        Ownership {
            prefix: &self.policy.drain.reason_prefix,
            earlier_prefixes: &self.retired.prefixes,
            slurm_user: self.policy.drain.slurm_user.as_deref(),
        }
    }

    /// Sequence of the last applied record (0 before the first).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The reducer's clock: the largest append time seen (ms).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Every known Slurm node's phase, by name.
    pub fn phases(&self) -> Vec<(String, Phase)> {
        let mut v: Vec<_> = self
            .ctl
            .iter()
            .map(|(n, c)| (n.clone(), c.status.phase))
            .collect();
        v.sort();
        v
    }

    /// One Slurm node's phase.
    pub fn phase(&self, node: &str) -> Phase {
        self.ctl
            .get(node)
            .map_or(Phase::Unknown, |c| c.status.phase)
    }

    /// Targets with an action sent and no outcome yet, sorted.
    pub fn pending(&self) -> Vec<(Target, lockstep_schemas::ActionId)> {
        let mut v = Vec::new();
        let mut add = |slot: &Slot| {
            if let Some(f) = slot.pending() {
                v.push((f.action.target(), f.id.clone()));
            }
        };
        for c in self.ctl.values() {
            add(&c.state_slot);
        }
        for p in self.model.pods.values() {
            p.condition_slots.iter().for_each(|(_, s)| add(s));
        }
        for k in self.model.kube_nodes.values() {
            k.taint_slots.iter().for_each(|(_, s)| add(s));
        }
        self.orphans.values().for_each(&mut add);
        self.victims.values().for_each(|v| add(&v.delete_slot));
        self.scale.values().for_each(|c| add(&c.slot));
        for m in self.maintenance.values() {
            add(&m.reservation_slot);
            m.condition_slots.iter().for_each(|(_, s)| add(s));
        }
        for c in self.ctl.values() {
            add(&c.features_slot);
            add(&c.topology_slot);
        }
        v.sort();
        v
    }

    /// Number of Slurm nodes, Kubernetes nodes, pods and jobs in the model.
    pub fn sizes(&self) -> [usize; 4] {
        [
            self.model.slurm_nodes.len(),
            self.model.kube_nodes.len(),
            self.model.pods.len(),
            self.model.jobs.len(),
        ]
    }

    /// The Kubernetes node a Slurm node runs on, if known.
    pub fn placement(&self, node: &str) -> Option<String> {
        self.model.placement(node, &self.policy).map(str::to_owned)
    }

    /// `namespace/name` of the pod that runs a Slurm node, if any.
    pub fn pod_key_of(&self, node: &str) -> Option<String> {
        self.model.pod_of(node).map(|(k, _)| k.to_owned())
    }

    /// Jobs holding a Slurm node.
    pub fn jobs_on(&self, node: &str) -> u32 {
        self.model.jobs_on(node)
    }

    /// The whole state as named-field MessagePack, maps in key order.
    pub fn snapshot(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("engine state always encodes")
    }

    /// Rebuilds an engine from [`Engine::snapshot`].
    pub fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let mut e: Self = rmp_serde::from_slice(bytes).map_err(SnapshotError::Decode)?;
        e.model.rebuild_indexes(&e.policy);
        e.tombstones.rebuild();
        e.timers.rebuild();
        e.rebuild_busy();
        Ok(e)
    }

    /// SHA-256 of the snapshot, in hex: equal on every machine for the same log.
    pub fn hash(&self) -> String {
        let digest = Sha256::digest(self.snapshot());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Applies one record.
    ///
    /// # Panics
    /// If `rec.seq` does not follow the last applied sequence: log readers
    /// reject such input, so reaching here is a bug.
    pub fn apply(&mut self, rec: &EventRecord, out: &mut Output) {
        assert!(
            rec.seq > self.last_seq,
            "sequence numbers must go up: {} after {}",
            rec.seq,
            self.last_seq
        );
        self.last_seq = rec.seq;
        // One clock for all sources, and it never goes back.
        self.now_ms = self.now_ms.max(rec.time_ms);
        let ctx = Ctx {
            seq: rec.seq,
            now_ms: self.now_ms,
            event: &rec.envelope.id,
        };
        self.dirty.clear();
        self.handle_event(&rec.envelope.event, &ctx);
        while let Some(wake) = self.timers.pop_due(ctx.now_ms) {
            self.dirty.push(wake);
        }
        if self.dirty.is_empty() {
            return;
        }
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for wake in &dirty {
            match wake {
                Wake::Slurm(n) => self.eval_slurm(n, &ctx, out),
                Wake::Kube(n) => self.eval_kube(n, &ctx, out),
                Wake::Scale => self.eval_scaling(&ctx, out),
                Wake::Maint(n) => self.eval_maintenance(n, &ctx, out),
            }
        }
        // Kubernetes nodes whose Slurm nodes changed what lockstep shows of
        // them while being evaluated just now.
        let mut later = std::mem::take(&mut self.dirty);
        later.sort_unstable();
        later.dedup();
        for wake in &later {
            match wake {
                Wake::Kube(n) => self.eval_kube(n, &ctx, out),
                Wake::Maint(n) => self.eval_maintenance(n, &ctx, out),
                Wake::Slurm(_) | Wake::Scale => {}
            }
        }
        dirty.clear();
        self.dirty = dirty;
    }

    /// Marks a Slurm node and the Kubernetes node under it for evaluation.
    fn touch_slurm(&mut self, name: &str) {
        self.dirty.push(Wake::Slurm(name.to_owned()));
        if let Some(k) = self.model.placement(name, &self.policy) {
            self.dirty.push(Wake::Kube(k.to_owned()));
            if self.policy.maintenance.enabled {
                self.dirty.push(Wake::Maint(k.to_owned()));
            }
        }
    }

    /// A Slurm node started or stopped running jobs: the drain conditions
    /// of the Kubernetes node under it may change (maintenance rows 4-5).
    fn touch_drain_progress(&mut self, name: &str) {
        let m = &self.policy.maintenance;
        if m.enabled && m.node_conditions {
            if let Some(k) = self.model.placement(name, &self.policy) {
                self.dirty.push(Wake::Maint(k.to_owned()));
            }
        }
    }

    /// Marks a Kubernetes node and the Slurm nodes on it for evaluation.
    fn touch_kube(&mut self, name: &str) {
        let mut names = std::mem::take(&mut self.scratch_names);
        names.clear();
        self.model.slurm_nodes_on(name, &self.policy, &mut names);
        self.dirty.extend(names.drain(..).map(Wake::Slurm));
        self.scratch_names = names;
        self.dirty.push(Wake::Kube(name.to_owned()));
        if self.policy.maintenance.enabled || self.maintenance.contains_key(name) {
            self.dirty.push(Wake::Maint(name.to_owned()));
        }
    }

    fn touch_all(&mut self) {
        let mut names: Vec<String> = self.model.slurm_nodes.keys().cloned().collect();
        names.extend(self.ctl.keys().cloned());
        self.dirty.extend(names.into_iter().map(Wake::Slurm));
        let kube: Vec<String> = self.model.kube_nodes.keys().cloned().collect();
        if self.policy.maintenance.enabled {
            self.dirty.extend(kube.iter().cloned().map(Wake::Maint));
        }
        self.dirty.extend(kube.into_iter().map(Wake::Kube));
        let maint: Vec<String> = self.maintenance.keys().cloned().collect();
        self.dirty.extend(maint.into_iter().map(Wake::Maint));
    }

    /// The object an event observes or deletes, and the version the model
    /// holds of it (`None`: not held).
    fn held(&self, event: &Event) -> Option<(ObjectKey, Option<u64>)> {
        let m = &self.model;
        Some(match event {
            Event::SlurmNode(SlurmNode { name, .. }) | Event::SlurmNodeGone { name, .. } => (
                ObjectKey::SlurmNode(name.clone()),
                m.slurm_nodes.get(name).map(|s| s.obs.version),
            ),
            Event::SlurmJob(SlurmJob { job_id, .. }) | Event::SlurmJobGone { job_id, .. } => (
                ObjectKey::SlurmJob(*job_id),
                m.jobs.get(job_id).map(|s| s.obs.version),
            ),
            Event::SlurmPartition(SlurmPartition { name, .. })
            | Event::SlurmPartitionGone { name, .. } => (
                ObjectKey::SlurmPartition(name.clone()),
                m.partitions.get(name).map(|s| s.obs.version),
            ),
            Event::KubeNode(KubeNode { name, .. }) | Event::KubeNodeGone { name, .. } => (
                ObjectKey::KubeNode(name.clone()),
                m.kube_nodes.get(name).map(|k| k.obs.version),
            ),
            Event::KubePod(KubePod {
                namespace, name, ..
            })
            | Event::KubePodGone {
                namespace, name, ..
            } => {
                let key = pod_key(namespace, name);
                let held = m.pods.get(&key).map(|p| p.obs.version);
                (ObjectKey::Pod(key), held)
            }
            Event::KubeScaleTarget(KubeScaleTarget { target, .. })
            | Event::KubeScaleTargetGone { target, .. } => (
                ObjectKey::ScaleTarget(target.clone()),
                m.scale_targets.get(target).map(|t| t.obs.version),
            ),
            _ => return None,
        })
    }

    /// Whether an observation or deletion is older than what the model holds
    /// (or than the deletion of the object it observes): then it changes
    /// nothing. An observation that is applied to an object not held lifts
    /// its tombstone; a deletion that is applied leaves one.
    fn stale(&mut self, event: &Event, now_ms: u64) -> bool {
        let Some((key, held)) = self.held(event) else {
            return false;
        };
        let version = event.version();
        if stale::older_than_held(version, held) {
            return true;
        }
        let gone = matches!(
            event,
            Event::SlurmNodeGone { .. }
                | Event::SlurmJobGone { .. }
                | Event::SlurmPartitionGone { .. }
                | Event::KubeNodeGone { .. }
                | Event::KubePodGone { .. }
                | Event::KubeScaleTargetGone { .. }
        );
        if held.is_none() && stale::buried(version, self.tombstones.version(&key, now_ms)) {
            // Deleted since: an observation, or an older deletion, of it.
            return true;
        }
        if gone {
            self.tombstones
                .bury(key, version.max(held.unwrap_or(0)), now_ms);
        } else if held.is_none() {
            self.tombstones.lift(&key);
        }
        false
    }

    fn handle_event(&mut self, event: &Event, ctx: &Ctx<'_>) {
        if self.stale(event, ctx.now_ms) {
            return;
        }
        match event {
            Event::SlurmNode(node) => {
                let gen = self.gen(Domain::SlurmNodes);
                match self.model.slurm_nodes.get_mut(&node.name) {
                    // Only the version moved (a relist): nothing to decide.
                    Some(seen) if seen.obs.same_but_version(node) => {
                        seen.obs.version = node.version;
                        seen.gen = gen;
                    }
                    Some(seen) => {
                        // Jobs flip nodes between IDLE, MIXED and ALLOCATED
                        // all the time; no rule reads that, so such a change
                        // only updates the model.
                        let relevant = drain::decision_differs(&seen.obs, node);
                        let own = Ownership {
                            prefix: &self.policy.drain.reason_prefix,
                            earlier_prefixes: &self.retired.prefixes,
                            slurm_user: self.policy.drain.slurm_user.as_deref(),
                        };
                        let side_changed =
                            SlurmSide::of(&seen.obs, &own) != SlurmSide::of(node, &own);
                        let busy_changed =
                            scaling::slurm_busy(&seen.obs) != scaling::slurm_busy(node);
                        seen.obs.clone_from(node);
                        seen.gen = gen;
                        if side_changed {
                            self.touch_slurm(&node.name);
                        } else if relevant
                            || (busy_changed && !self.policy.scaling.busy_label.is_empty())
                        {
                            self.dirty.push(Wake::Slurm(node.name.clone()));
                        }
                        if busy_changed {
                            self.update_busy(&node.name);
                            self.touch_drain_progress(&node.name);
                        }
                        // Drains and known nodes matter to scaling only for
                        // victims and scale-in, which always scan.
                        if relevant || busy_changed {
                            self.schedule_scaling(ctx.now_ms);
                        }
                    }
                    None => {
                        self.model.slurm_nodes.insert(
                            node.name.clone(),
                            Seen {
                                obs: node.clone(),
                                gen,
                            },
                        );
                        if self.model.jobs_on(&node.name) == 0 {
                            self.idle_since.insert(node.name.clone(), ctx.now_ms);
                        }
                        self.update_busy(&node.name);
                        self.touch_slurm(&node.name);
                        self.schedule_scaling(ctx.now_ms);
                    }
                }
            }
            Event::SlurmNodeGone { name, .. } => self.remove_slurm_node(name),
            Event::SlurmJob(job) => {
                let gen = self.gen(Domain::SlurmJobs);
                let mut flipped = std::mem::take(&mut self.scratch_names);
                flipped.clear();
                self.model.upsert_job(job, gen, &mut flipped);
                self.jobs_flipped(&mut flipped, ctx.now_ms);
                self.scratch_names = flipped;
                self.schedule_scaling(ctx.now_ms);
            }
            Event::SlurmJobGone { job_id, .. } => self.remove_job(*job_id),
            Event::SlurmPartition(p) => {
                // No rule reads partitions yet; kept for the audit trail.
                let gen = self.gen(Domain::SlurmPartitions);
                self.model.partitions.insert(
                    p.name.clone(),
                    Seen {
                        obs: p.clone(),
                        gen,
                    },
                );
            }
            Event::SlurmPartitionGone { name, .. } => {
                self.model.partitions.remove(name);
            }
            Event::KubeNode(node) => {
                let gen = self.gen(Domain::KubeNodes);
                let now = ctx.now_ms;
                let new = !self.model.kube_nodes.contains_key(&node.name);
                if new {
                    let taint_slots = adopt(&mut self.orphans, |t| match t {
                        Target::NodeTaint { node: n, key } if *n == node.name => Some(key.clone()),
                        _ => None,
                    });
                    self.model.kube_nodes.insert(
                        node.name.clone(),
                        KubeEntry {
                            obs: node.clone(),
                            gen,
                            not_ready_since: None,
                            taint_slots,
                            unseen_labels: Vec::new(),
                        },
                    );
                }
                let entry = self
                    .model
                    .kube_nodes
                    .get_mut(&node.name)
                    .expect("inserted above");
                entry.gen = gen;
                // The same version is the same object: a copy that looked
                // for fewer labels was taken under an earlier policy (a late
                // re-delivery of it) and says less than the one held.
                if !new
                    && node.version != 0
                    && node.version == entry.obs.version
                    && !stale::reads_at_least(&node.read_labels, &entry.obs.read_labels)
                {
                    return;
                }
                let ready = node.ready == ConditionStatus::True;
                let spell_changed = ready == entry.not_ready_since.is_some();
                // The labels the policy started to read are usable once an
                // observation looked for them; one taken under the earlier
                // policy (a stale re-delivery) did not, and changes nothing.
                let before = entry.unseen_labels.len();
                match &node.read_labels {
                    Some(read) => entry.unseen_labels.retain(|l| !read.contains(l)),
                    None => entry.unseen_labels.clear(),
                }
                let labels_seen = entry.unseen_labels.len() != before;
                // A node seen for the first time is news even though its
                // entry was just made from it: the Slurm nodes on it must
                // be looked at with its labels and cordon.
                if !new && entry.obs.same_but_version(node) && !spell_changed && !labels_seen {
                    entry.obs.version = node.version;
                    return;
                }
                entry.obs.clone_from(node);
                // Its host is back once a node of that name is Ready.
                if ready {
                    self.model.kube_gone.remove(&node.name);
                }
                let entry = self
                    .model
                    .kube_nodes
                    .get_mut(&node.name)
                    .expect("inserted above");
                if ready {
                    entry.not_ready_since = None;
                } else if entry.not_ready_since.is_none() {
                    entry.not_ready_since = Some(Origin {
                        ms: now,
                        seq: ctx.seq,
                        event: ctx.event.clone(),
                    });
                }
                self.touch_kube(&node.name);
            }
            Event::KubeNodeGone { name, .. } => self.remove_kube_node(name, ctx),
            Event::KubePod(pod) => {
                let gen = self.gen(Domain::KubePods);
                let key = pod_key(&pod.namespace, &pod.name);
                let old = match self.model.pods.get_mut(&key) {
                    Some(e) if e.obs.same_but_version(pod) => {
                        e.obs.version = pod.version;
                        e.gen = gen;
                        return;
                    }
                    Some(e) => {
                        e.gen = gen;
                        Some(e.obs.clone())
                    }
                    None => None,
                };
                if let Some(old) = &old {
                    self.unindex_pod(&key, old);
                }
                if old.is_none() {
                    let condition_slots = adopt(&mut self.orphans, |t| match t {
                        Target::PodCondition {
                            namespace,
                            pod: p,
                            condition,
                        } if *namespace == pod.namespace && *p == pod.name => {
                            Some(condition.clone())
                        }
                        Target::PodLabel {
                            namespace,
                            pod: p,
                            key,
                        } if *namespace == pod.namespace && *p == pod.name => {
                            Some(format!("label:{key}"))
                        }
                        _ => None,
                    });
                    self.model.pods.insert(
                        key.clone(),
                        PodEntry {
                            obs: pod.clone(),
                            gen,
                            condition_slots,
                        },
                    );
                } else if let Some(entry) = self.model.pods.get_mut(&key) {
                    entry.obs.clone_from(pod);
                }
                let pod = pod.clone();
                self.index_pod(&key, &pod);
                self.scaling_needs_scan(ctx.now_ms);
            }
            Event::KubePodGone {
                namespace, name, ..
            } => {
                self.remove_pod(&pod_key(namespace, name), ctx);
                self.scaling_needs_scan(ctx.now_ms);
            }
            Event::KubeScaleTarget(t) => {
                let gen = self.gen(Domain::KubeScaleTargets);
                let same = self
                    .model
                    .scale_targets
                    .get(&t.target)
                    .is_some_and(|held| held.obs.same_but_version(t));
                self.model.scale_targets.insert(
                    t.target.clone(),
                    Seen {
                        obs: t.clone(),
                        gen,
                    },
                );
                if !same {
                    self.scaling_needs_scan(ctx.now_ms);
                }
            }
            Event::KubeScaleTargetGone { target, .. } => {
                self.model.scale_targets.remove(target);
                self.scaling_needs_scan(ctx.now_ms);
            }
            Event::SyncStarted { domain } => {
                let s = &mut self.model.sync[domain_index(*domain)];
                s.gen += 1;
                s.listing = true;
            }
            Event::SyncDone { domain } => self.finish_sync(*domain, ctx),
            Event::ConnectorStatus {
                connector, visible, ..
            } => {
                let flag = match connector {
                    lockstep_schemas::Connector::Slurm => &mut self.model.slurm_visible,
                    lockstep_schemas::Connector::Kubernetes => &mut self.model.kube_visible,
                };
                if *flag != *visible {
                    *flag = *visible;
                    self.touch_all();
                    self.scaling_needs_scan(ctx.now_ms);
                }
            }
            Event::Tick => {}
            Event::ActionOutcome(o) => self.handle_outcome(o, ctx.now_ms),
            Event::PolicyChanged(policy) => {
                if self.pinned || **policy == self.policy {
                    return;
                }
                let old = std::mem::replace(&mut self.policy, (**policy).clone());
                self.retired.policy_changed(&old, &self.policy);
                let added = retired::newly_read_labels(&old, &self.policy);
                if !added.is_empty() {
                    for entry in self.model.kube_nodes.values_mut() {
                        for l in &added {
                            if !entry.unseen_labels.contains(l) {
                                entry.unseen_labels.push(l.clone());
                            }
                        }
                    }
                }
                self.model.rebuild_indexes(&self.policy);
                self.rebuild_busy();
                self.touch_all();
                self.scaling_needs_scan(ctx.now_ms);
            }
        }
    }

    fn gen(&self, d: Domain) -> u32 {
        self.model.sync[domain_index(d)].gen
    }

    fn index_pod(&mut self, key: &str, pod: &lockstep_schemas::KubePod) {
        self.model.index_pod(key, pod, &self.policy, true);
        if let Some(s) = slurm_name_of_pod(pod, &self.policy) {
            self.touch_slurm(s);
        }
    }

    /// Removes a pod's claim; touches its Slurm node and the node it was on.
    fn unindex_pod(&mut self, key: &str, pod: &lockstep_schemas::KubePod) {
        if let Some(s) = slurm_name_of_pod(pod, &self.policy) {
            let s = s.to_owned();
            self.touch_slurm(&s);
            self.model.index_pod(key, pod, &self.policy, false);
            self.touch_slurm(&s);
        }
    }

    /// Forgets a pod that is gone, however it went (a delete observed from
    /// its start, a force delete, a relist that no longer lists it).
    fn remove_pod(&mut self, key: &str, ctx: &Ctx<'_>) {
        if let Some(entry) = self.model.pods.get(key) {
            let pod = entry.obs.clone();
            self.unindex_pod(key, &pod);
            if let Some(entry) = self.model.pods.remove(key) {
                for (_, slot) in entry.condition_slots {
                    self.park(slot);
                }
            }
            self.note_pod_lost(&pod, ctx);
            if let Some(kube) = &pod.node_name {
                self.forget_gone_kube_node(kube);
            }
            self.scaling_needs_scan(self.now_ms);
        }
    }

    /// A pod gone without a `deleting` phase seen first (a force delete, a
    /// delete while the watch was down) is as much a loss as any other: its
    /// Slurm node's slurmd is gone with it. Drain row 4 (`drain.pod_missing`)
    /// holds while a pod loss is among the causes before; this makes it one,
    /// dated by the event that showed the pod gone.
    fn note_pod_lost(&mut self, pod: &lockstep_schemas::KubePod, ctx: &Ctx<'_>) {
        let policy = &self.policy;
        if policy.mapping.mode != lockstep_schemas::MappingMode::Pod
            || !policy.drain.on_pod_disruption
        {
            return;
        }
        let Some(slurm) = slurm_name_of_pod(pod, policy) else {
            return;
        };
        let Some(ctl) = self.ctl.get_mut(slurm) else {
            return;
        };
        if !ctl.causes.iter().any(|(c, _)| c.is_pod_loss()) {
            ctl.causes.push((
                Cause::PodMissing,
                Origin {
                    ms: ctx.now_ms,
                    seq: ctx.seq,
                    event: ctx.event.clone(),
                },
            ));
        }
    }

    /// Keeps a vanished object's slot while its action is in flight.
    fn park(&mut self, slot: Slot) {
        park(
            &mut self.orphans,
            slot,
            self.now_ms,
            ms(self.policy.actions.timeout_s),
        );
    }

    fn remove_slurm_node(&mut self, name: &str) {
        if self.model.slurm_nodes.remove(name).is_some() {
            self.update_busy(name);
            self.touch_slurm(name);
            if let Some(kube) = self.model.placement(name, &self.policy) {
                let kube = kube.to_owned();
                self.forget_gone_kube_node(&kube);
            }
            self.schedule_scaling(self.now_ms);
        }
    }

    /// Forgets a Kubernetes node that was deleted (or is missing from a
    /// relist) and remembers that its host is gone (health row 6).
    fn remove_kube_node(&mut self, name: &str, ctx: &Ctx<'_>) {
        if let Some(entry) = self.model.kube_nodes.remove(name) {
            self.timers.set(WakeOf::Kube(name), None);
            for (_, slot) in entry.taint_slots {
                self.park(slot);
            }
            let gone = &mut self.model.kube_gone;
            gone.entry(name.to_owned()).or_insert_with(|| Origin {
                ms: ctx.now_ms,
                seq: ctx.seq,
                event: ctx.event.clone(),
            });
            if gone.len() > crate::model::KUBE_NODES_GONE_MAX {
                let oldest = gone
                    .iter()
                    .min_by_key(|(n, o)| (o.seq, (*n).clone()))
                    .map(|(n, _)| n.clone());
                if let Some(n) = oldest {
                    gone.remove(&n);
                }
            }
            self.touch_kube(name);
        }
    }

    /// A deleted Kubernetes node is forgotten once no Slurm node is on it:
    /// nothing can be kept out for it any more.
    fn forget_gone_kube_node(&mut self, kube: &str) {
        if !self.model.kube_gone.contains_key(kube) {
            return;
        }
        let mut names = std::mem::take(&mut self.scratch_names);
        names.clear();
        self.model.slurm_nodes_on(kube, &self.policy, &mut names);
        let host_mode = self.policy.mapping.mode == lockstep_schemas::MappingMode::Host;
        let empty = if host_mode {
            !self.model.slurm_nodes.contains_key(kube)
        } else {
            names.is_empty()
        };
        self.scratch_names = names;
        if empty {
            self.model.kube_gone.remove(kube);
        }
    }

    fn remove_job(&mut self, job_id: u64) {
        let mut flipped = std::mem::take(&mut self.scratch_names);
        flipped.clear();
        self.model.remove_job(job_id, &mut flipped);
        self.jobs_flipped(&mut flipped, self.now_ms);
        self.scratch_names = flipped;
        self.schedule_scaling(self.now_ms);
    }

    /// Nodes whose jobs went from none to some or back: their idle clock,
    /// and their busy label.
    fn jobs_flipped(&mut self, flipped: &mut Vec<String>, now_ms: u64) {
        let label = !self.policy.scaling.busy_label.is_empty();
        for node in flipped.drain(..) {
            if self.model.jobs_on(&node) == 0 {
                self.idle_since.insert(node.clone(), now_ms);
            } else {
                self.idle_since.remove(&node);
            }
            self.update_busy(&node);
            self.touch_drain_progress(&node);
            if label {
                self.dirty.push(Wake::Slurm(node));
            }
        }
    }

    /// Keeps `busy_nodes` and the per-rule busy counts current. Without
    /// scale targets there is nothing to keep: the set is rebuilt when a
    /// policy brings some.
    fn update_busy(&mut self, node: &str) {
        if self.policy.scaling.targets.is_empty() {
            return;
        }
        let busy = self.model.jobs_on(node) > 0
            || self
                .model
                .slurm_nodes
                .get(node)
                .is_some_and(|n| scaling::slurm_busy(&n.obs));
        if busy == self.busy_nodes.contains(node) {
            return;
        }
        if busy {
            self.busy_nodes.insert(node.to_owned());
        } else {
            self.busy_nodes.remove(node);
        }
        let rule = self.scale_rule_of.get(node).copied();
        if let Some(count) = rule.and_then(|r| self.scale_busy.get_mut(r)) {
            *count = if busy {
                *count + 1
            } else {
                count.saturating_sub(1)
            };
        }
    }

    /// Rebuilds the busy set from the model. Busy: running a job (whether
    /// Slurm's node list has the node yet or not) or finishing one.
    fn rebuild_busy(&mut self) {
        self.busy_nodes.clear();
        let mut names: Vec<String> = self.model.slurm_nodes.keys().cloned().collect();
        names.extend(self.model.nodes_with_jobs());
        for n in names {
            self.update_busy(&n);
        }
    }

    /// Something scaling reads beyond job counts changed: the next
    /// evaluation scans the targets' pods.
    fn scaling_needs_scan(&mut self, now_ms: u64) {
        self.scale_scan_needed = true;
        self.schedule_scaling(now_ms);
    }

    /// Scaling looks again within `evaluate_every_s`; changes in between are
    /// taken together.
    fn schedule_scaling(&mut self, now_ms: u64) {
        if self.policy.scaling.targets.is_empty() {
            return;
        }
        let at = after_s(now_ms, self.policy.scaling.evaluate_every_s);
        if self.timers.get(WakeOf::Scale).is_some_and(|t| t <= at) {
            return;
        }
        self.timers.set(WakeOf::Scale, Some(at));
    }

    /// Everything of the domain not listed since `SyncStarted` is gone.
    fn finish_sync(&mut self, domain: Domain, ctx: &Ctx<'_>) {
        if domain == Domain::SlurmNodes {
            // Level-triggered after every relist (after a restart, a restore,
            // a lost watch): each drain lockstep owns is looked at again, so
            // one whose cause no longer holds is resumed even when nothing
            // else about its node changed.
            let own = self.ownership();
            let owned: Vec<String> = self
                .model
                .slurm_nodes
                .iter()
                .filter(|(_, s)| SlurmSide::of(&s.obs, &own).owned_out())
                .map(|(n, _)| n.clone())
                .collect();
            self.dirty.extend(owned.into_iter().map(Wake::Slurm));
        }
        let state = self.model.sync[domain_index(domain)];
        if !state.listing {
            // A log cut in the middle of a listing: we did not see its start,
            // so we cannot tell what was listed. Keep everything.
            return;
        }
        self.model.sync[domain_index(domain)].listing = false;
        let gen = state.gen;
        fn stale<K: Clone + Ord, V>(
            m: &FxHashMap<K, V>,
            gen: u32,
            g: impl Fn(&V) -> u32,
        ) -> Vec<K> {
            let mut v: Vec<K> = m
                .iter()
                .filter(|(_, e)| g(e) < gen)
                .map(|(k, _)| k.clone())
                .collect();
            v.sort();
            v
        }
        match domain {
            // Gone by absence: the version last held dates the deletion.
            Domain::SlurmNodes => {
                for n in stale(&self.model.slurm_nodes, gen, |e| e.gen) {
                    let v = self.model.slurm_nodes[&n].obs.version;
                    self.tombstones
                        .bury(ObjectKey::SlurmNode(n.clone()), v, self.now_ms);
                    self.remove_slurm_node(&n);
                }
            }
            Domain::SlurmJobs => {
                for j in stale(&self.model.jobs, gen, |e| e.gen) {
                    let v = self.model.jobs[&j].obs.version;
                    self.tombstones.bury(ObjectKey::SlurmJob(j), v, self.now_ms);
                    self.remove_job(j);
                }
            }
            Domain::SlurmPartitions => {
                for p in stale(&self.model.partitions, gen, |e| e.gen) {
                    let v = self.model.partitions[&p].obs.version;
                    self.tombstones
                        .bury(ObjectKey::SlurmPartition(p.clone()), v, self.now_ms);
                    self.model.partitions.remove(&p);
                }
            }
            Domain::KubeNodes => {
                for n in stale(&self.model.kube_nodes, gen, |e| e.gen) {
                    let v = self.model.kube_nodes[&n].obs.version;
                    self.tombstones
                        .bury(ObjectKey::KubeNode(n.clone()), v, self.now_ms);
                    self.remove_kube_node(&n, ctx);
                }
            }
            Domain::KubePods => {
                for k in stale(&self.model.pods, gen, |e| e.gen) {
                    let v = self.model.pods[&k].obs.version;
                    self.tombstones
                        .bury(ObjectKey::Pod(k.clone()), v, self.now_ms);
                    self.remove_pod(&k, ctx);
                }
            }
            Domain::KubeScaleTargets => {
                for t in stale(&self.model.scale_targets, gen, |e| e.gen) {
                    let v = self.model.scale_targets[&t].obs.version;
                    self.tombstones
                        .bury(ObjectKey::ScaleTarget(t.clone()), v, self.now_ms);
                    self.model.scale_targets.remove(&t);
                    self.scaling_needs_scan(self.now_ms);
                }
            }
        }
    }

    fn handle_outcome(&mut self, o: &lockstep_schemas::ActionOutcome, now_ms: u64) {
        let policy = &self.policy.actions;
        if let Some(slot) = self.orphans.get_mut(&o.target) {
            slot.handle_outcome(&o.action_id, &o.result, now_ms, policy);
            if slot.pending().is_none() {
                self.orphans.remove(&o.target);
            }
            return;
        }
        match &o.target {
            Target::SlurmNodeState { node } => {
                if let Some(c) = self.ctl.get_mut(node) {
                    if c.state_slot
                        .handle_outcome(&o.action_id, &o.result, now_ms, policy)
                    {
                        self.touch_slurm(node);
                    }
                }
            }
            Target::PodCondition {
                namespace,
                pod,
                condition,
            } => self.pod_slot_outcome(namespace, pod, condition, o, now_ms),
            Target::NodeTaint { node, key } => {
                let Some(entry) = self.model.kube_nodes.get_mut(node) else {
                    return;
                };
                let Some((_, slot)) = entry.taint_slots.iter_mut().find(|(k, _)| k == key) else {
                    return;
                };
                if slot.handle_outcome(&o.action_id, &o.result, now_ms, policy) {
                    self.dirty.push(Wake::Kube(node.clone()));
                }
            }
            Target::SlurmNodeFeatures { node } | Target::SlurmNodeTopology { node } => {
                if let Some(c) = self.ctl.get_mut(node) {
                    let slot = match &o.target {
                        Target::SlurmNodeFeatures { .. } => &mut c.features_slot,
                        _ => &mut c.topology_slot,
                    };
                    if slot.handle_outcome(&o.action_id, &o.result, now_ms, policy) {
                        self.touch_slurm(node);
                    }
                }
            }
            Target::PodLabel {
                namespace,
                pod,
                key,
            } => self.pod_slot_outcome(namespace, pod, &format!("label:{key}"), o, now_ms),
            Target::Pod { namespace, pod } => {
                let pk = pod_key(namespace, pod);
                let mut changed = false;
                for v in self.victims.values_mut().filter(|v| v.pod_key == pk) {
                    changed |=
                        v.delete_slot
                            .handle_outcome(&o.action_id, &o.result, now_ms, policy);
                }
                if changed {
                    self.schedule_scaling(now_ms);
                }
            }
            Target::Scale { target } => {
                if let Some(c) = self.scale.get_mut(target) {
                    if c.slot
                        .handle_outcome(&o.action_id, &o.result, now_ms, policy)
                    {
                        self.schedule_scaling(now_ms);
                    }
                }
            }
            Target::SlurmReservation { .. } => {
                let found = self.maintenance.iter_mut().find(|(_, m)| {
                    m.reservation_slot
                        .current
                        .as_ref()
                        .is_some_and(|c| c.id == o.action_id)
                });
                let Some((kube, m)) = found else { return };
                let action = m
                    .reservation_slot
                    .current
                    .as_ref()
                    .map(|c| c.action.clone());
                if m.reservation_slot
                    .handle_outcome(&o.action_id, &o.result, now_ms, policy)
                {
                    // Slurm's word is the only observation of a reservation.
                    if matches!(
                        o.result,
                        OutcomeResult::Succeeded | OutcomeResult::AlreadyDone
                    ) {
                        m.reserved = match action {
                            Some(a @ Action::SlurmReserve { .. }) => Some(a),
                            _ => None,
                        };
                    }
                    let kube = kube.clone();
                    self.dirty.push(Wake::Maint(kube));
                }
            }
            Target::NodeCondition { node, condition } => {
                let Some(m) = self.maintenance.get_mut(node) else {
                    return;
                };
                let Some((_, slot)) = m.condition_slots.iter_mut().find(|(k, _)| k == condition)
                else {
                    return;
                };
                if slot.handle_outcome(&o.action_id, &o.result, now_ms, policy) {
                    self.dirty.push(Wake::Maint(node.clone()));
                }
            }
        }
    }

    /// Re-evaluates one Kubernetes node's maintenance (`maintenance` rows 1,
    /// 2, 4-6): its reservation, and the drain conditions lockstep shows.
    fn eval_maintenance(&mut self, kube: &str, ctx: &Ctx<'_>, out: &mut Output) {
        if !self.model.kube_visible || !self.model.slurm_visible {
            return;
        }
        let policy = &self.policy;
        let mp = &policy.maintenance;
        let node = self.model.kube_nodes.get(kube).map(|e| &e.obs);
        let mut names = std::mem::take(&mut self.scratch_names);
        names.clear();
        if node.is_some() {
            self.model.slurm_nodes_on(kube, policy, &mut names);
            names.retain(|n| self.model.slurm_nodes.contains_key(n));
            names.sort();
        }
        let now = ctx.now_ms;
        let ctl = self.maintenance.get(kube);
        let reserved = ctl.and_then(|m| m.reserved.as_ref());
        let (want, mut wake) = maintenance::reservation(kube, node, mp, &names, reserved, now);
        let reservation = maintenance::reservation_step(want, reserved);
        let rule = match &reservation {
            Some(Action::SlurmUnreserve { .. }) => Rule::Release,
            _ => Rule::Reserve,
        };
        // Rows 4-6: how lockstep's drain of the node's Slurm nodes stands.
        let mut conditions: Vec<(String, Option<Action>)> = Vec::new();
        if mp.enabled && mp.node_conditions {
            let own = self.ownership();
            let mut all_out = !names.is_empty();
            let mut busy = false;
            for n in &names {
                let s = &self.model.slurm_nodes[n].obs;
                all_out &= SlurmSide::of(s, &own).owned_out();
                busy |= self.model.jobs_on(n) > 0 || scaling::slurm_busy(s);
            }
            let progress = match (all_out, busy) {
                (false, _) => maintenance::DrainProgress::NotDraining,
                (true, true) => maintenance::DrainProgress::Draining,
                (true, false) => maintenance::DrainProgress::Drained,
            };
            for t in [
                lockstep_schemas::DRAIN_IN_PROGRESS,
                lockstep_schemas::DRAINED,
            ] {
                let shown = node.and_then(|n| n.conditions.iter().find(|c| c.type_ == t));
                let want = node
                    .and(maintenance::drain_condition(t, progress, shown))
                    .map(|condition| Action::KubeSetNodeCondition {
                        node: kube.to_owned(),
                        condition,
                    });
                conditions.push((t.to_owned(), want));
            }
        }
        self.scratch_names = names;
        if reservation.is_none()
            && conditions.iter().all(|(_, w)| w.is_none())
            && self.maintenance.get(kube).is_none_or(MaintCtl::is_idle)
            && wake.is_none()
            && self.timers.get(WakeOf::Maint(kube)).is_none()
        {
            return;
        }
        let m = self.maintenance.entry(kube.to_owned()).or_default();
        let issue = |rule: Rule| Issue {
            seq: ctx.seq,
            now_ms: now,
            cause: ctx.event,
            rule: rule.name(),
        };
        let (_, w) = m.reservation_slot.reconcile(
            reservation,
            &issue(rule),
            &policy.actions,
            &mut out.actions,
        );
        if let Some(w) = w {
            min_wake(&mut wake, w);
        }
        for (t, want) in conditions {
            if let Some(w) = reconcile_keyed(
                &mut m.condition_slots,
                &t,
                want,
                &issue(Rule::DrainConditions),
                &policy.actions,
                &mut out.actions,
            ) {
                min_wake(&mut wake, w);
            }
        }
        self.timers.set(WakeOf::Maint(kube), wake);
        if wake.is_none() && m.is_idle() {
            self.maintenance.remove(kube);
        }
    }

    /// Records an outcome in one of a pod's slots (a condition type, or
    /// `label:<key>`), and has its Slurm node looked at again.
    fn pod_slot_outcome(
        &mut self,
        namespace: &str,
        pod: &str,
        slot_key: &str,
        o: &lockstep_schemas::ActionOutcome,
        now_ms: u64,
    ) {
        let Some(entry) = self.model.pods.get_mut(&pod_key(namespace, pod)) else {
            return;
        };
        let Some((_, slot)) = entry
            .condition_slots
            .iter_mut()
            .find(|(k, _)| k == slot_key)
        else {
            return;
        };
        if slot.handle_outcome(&o.action_id, &o.result, now_ms, &self.policy.actions) {
            let pod = entry.obs.clone();
            if let Some(s) = slurm_name_of_pod(&pod, &self.policy) {
                self.touch_slurm(s);
            }
        }
    }

    /// Re-evaluates one Slurm node: its causes, what Slurm should show, what
    /// its pod should show, and its phase.
    fn eval_slurm(&mut self, name: &str, ctx: &Ctx<'_>, out: &mut Output) {
        let policy = &self.policy;
        let view = self.model.view(name, policy);
        let now = ctx.now_ms;
        let mut wake = None;
        let mut causes = std::mem::take(&mut self.scratch_causes);
        causes.clear();
        let previous: &[(Cause, Origin)] = self.ctl.get(name).map_or(&[], |c| &c.causes);
        let mut prev_causes: Vec<Cause> = Vec::new();
        if !previous.is_empty() {
            prev_causes.extend(previous.iter().map(|(c, _)| c.clone()));
        }
        drain::causes(
            &view,
            &policy.drain,
            policy.mapping.mode,
            &prev_causes,
            &mut causes,
        );
        if let Some(window) = maintenance::drain_window(
            view.kube.map(|k| &k.obs),
            &policy.maintenance,
            now,
            &mut wake,
        ) {
            causes.push(Cause::Maintenance(window));
        }
        health::causes(&view, &policy.health, now, &mut causes, &mut wake);
        if let Some(v) = self.victims.get(name) {
            match v.kind {
                // Until the replica count drops, a pod its controller
                // recreates meanwhile is on its way out too.
                VictimKind::ScaleIn => causes.push(Cause::ScaleIn),
                // A replacement is done once the old pod is gone.
                VictimKind::Replace => {
                    if view.pod.is_some_and(|p| p.obs.uid == v.uid) {
                        causes.push(Cause::Replace);
                    }
                }
            }
        }

        let Some(slurm) = view.slurm else {
            // Slurm does not know this node: nothing to drain or resume.
            if let Some(ctl) = self.ctl.remove(name) {
                let status = Status {
                    phase: Phase::Unknown,
                    rule: Rule::Gone,
                    cause: None,
                };
                if ctl.status != status {
                    out.transitions.push(Transition {
                        seq: ctx.seq,
                        time_ms: now,
                        node: name.to_owned(),
                        from: ctl.status.phase,
                        to: Phase::Unknown,
                        rule: Rule::Gone,
                        cause: ctx.event.clone(),
                        detail: "slurm no longer reports the node".to_owned(),
                    });
                }
                self.timers.set(WakeOf::Slurm(name), None);
                self.park(ctl.state_slot);
            }
            self.scratch_causes = causes;
            return;
        };
        let side = SlurmSide::of(
            slurm,
            &Ownership {
                prefix: &policy.drain.reason_prefix,
                earlier_prefixes: &self.retired.prefixes,
                slurm_user: policy.drain.slurm_user.as_deref(),
            },
        );
        if !self.ctl.contains_key(name) {
            let mut ctl = NodeCtl::default();
            if let Some(slot) = self.orphans.remove(&Target::SlurmNodeState {
                node: name.to_owned(),
            }) {
                ctl.state_slot = slot;
            }
            self.ctl.insert(name.to_owned(), ctl);
        }
        let ctl = self.ctl.get_mut(name).expect("inserted above");

        // Slurm -> Kubernetes: what lockstep shows of Slurm's health, damped
        // like the other direction (health::slurm_health_step).
        let shown_before = ctl.slurm_health.shown;
        // What Kubernetes already shows for a node Slurm still reports
        // unhealthy (set before a restart or an upgrade) is kept, not
        // flipped to healthy for the length of a grace period.
        let hc = policy.health.slurm_health_condition.as_str();
        let pod_shows = !hc.is_empty()
            && view.pod.is_some_and(|p| {
                p.obs
                    .conditions
                    .iter()
                    .any(|c| c.type_ == hc && c.status == ConditionStatus::False)
            });
        if side.unhealthy && pod_shows && !ctl.slurm_health.shown {
            ctl.slurm_health.shown = true;
            ctl.slurm_health.unhealthy_since.get_or_insert(now);
        }
        if self.model.slurm_visible {
            if let Some(at) = health::slurm_health_step(
                &mut ctl.slurm_health,
                side.unhealthy,
                now,
                &policy.health,
                &mut self.slurm_marks,
            ) {
                min_wake(&mut wake, at);
            }
        }
        let shown = ctl.slurm_health.shown;

        // Causes keep their origin while they hold.
        let had_causes = !ctl.causes.is_empty();
        if !ctl.causes.iter().map(|(c, _)| c).eq(causes.iter()) {
            let mut next = Vec::with_capacity(causes.len());
            for c in &causes {
                let origin = ctl
                    .causes
                    .iter()
                    .find(|(old, _)| old == c)
                    .map(|(_, o)| o.clone())
                    .or_else(|| match c {
                        Cause::NotReady => view.kube.and_then(|k| k.not_ready_since.clone()),
                        Cause::KubeNodeGone => view.kube_gone.cloned(),
                        _ => None,
                    })
                    .unwrap_or_else(|| Origin {
                        ms: now,
                        seq: ctx.seq,
                        event: ctx.event.clone(),
                    });
                next.push((c.clone(), origin));
            }
            ctl.causes = next;
        }
        if !causes.is_empty() {
            ctl.cleared = None;
        } else if had_causes {
            ctl.cleared = Some(Origin {
                ms: now,
                seq: ctx.seq,
                event: ctx.event.clone(),
            });
        }
        // The event behind what happens now: the origin of the cause in
        // force, or, while lockstep's drain waits to be lifted, the event that
        // cleared its cause.
        let cause_event: &EventId = match (ctl.causes.first(), &ctl.cleared) {
            (Some((_, o)), _) => &o.event,
            (None, Some(o)) if side.owned_out() => &o.event,
            _ => ctx.event,
        };

        // What Slurm should show.
        let mut want = None;
        let mut act = true;
        let (phase, mut rule) = if let Some(primary) = causes.first() {
            ctl.last_cause_health = primary.is_health();
            let down =
                primary.is_health() && policy.health.action == lockstep_schemas::HealthAction::Down;
            let reason = format!("{} {}", policy.drain.reason_prefix, primary.describe(&view));
            let shown = if down {
                side.down
            } else {
                side.drained || (side.down && side.owned)
            };
            // A cause that names itself rewrites only lockstep's own reason:
            // a drain somebody else set already keeps the node out, and its
            // reason is theirs (replacing it would make it lockstep's, to be
            // resumed later).
            let satisfied = shown
                && (!primary.names_itself()
                    || !side.owned
                    || slurm.reason.as_deref() == Some(&reason));
            if satisfied {
                (Phase::Drained, primary.rule())
            } else {
                // Drained for a cause that still holds, and Slurm no longer
                // shows it: someone removed lockstep's drain early. (Not a
                // drain that only needs to say its new cause.)
                let reapply = (ctl.status.phase == Phase::Drained
                    && ctl.status.cause.is_some()
                    && !shown)
                    || (ctl.status.phase == Phase::Draining && ctl.status.rule == Rule::Reapplied);
                let mut rule = if reapply {
                    Rule::Reapplied
                } else {
                    primary.rule()
                };
                let action = if down {
                    Action::SlurmDown {
                        node: name.to_owned(),
                        reason,
                    }
                } else {
                    Action::SlurmDrain {
                        node: name.to_owned(),
                        reason,
                    }
                };
                let already = ctl
                    .state_slot
                    .current
                    .as_ref()
                    .is_some_and(|f| f.action == action);
                if primary.is_health() && !already {
                    if let Some(at) = health::rate_limited(
                        &mut self.health_drains,
                        now,
                        policy.health.drains_per_minute_max,
                    ) {
                        rule = Rule::RateLimited;
                        act = false;
                        min_wake(&mut wake, at);
                    }
                }
                want = Some(action);
                (Phase::Draining, rule)
            }
        } else {
            if side.owned_out() {
                let hold = if ctl.last_cause_health {
                    let resume_at = after_s(
                        ctl.cleared.as_ref().map_or(0, |o| o.ms),
                        policy.health.resume_after_s,
                    );
                    match health::flap_hold(&ctl.health_drains, now, &policy.health) {
                        Some(until) => Some((Rule::FlapHold, until.max(resume_at))),
                        None if now < resume_at => Some((Rule::ResumeDelayed, resume_at)),
                        None => None,
                    }
                } else {
                    None
                };
                match hold {
                    Some((rule, until)) => {
                        min_wake(&mut wake, until);
                        act = false;
                        (Phase::Resuming, rule)
                    }
                    None => {
                        want = Some(Action::SlurmResume {
                            node: name.to_owned(),
                        });
                        (Phase::Resuming, Rule::CauseCleared)
                    }
                }
            } else if side.foreign_drain() {
                (Phase::ForeignDrain, Rule::ForeignDrain)
            } else if side.unhealthy {
                (Phase::SlurmUnhealthy, Rule::SlurmUnhealthy)
            } else {
                (Phase::InService, Rule::Observed)
            }
        };

        let mut gave_up = None;
        if !self.model.slurm_visible {
            rule = Rule::SlurmInvisible;
        } else if act {
            let before = out.actions.len();
            let issue = Issue {
                seq: ctx.seq,
                now_ms: now,
                cause: cause_event,
                rule: rule.name(),
            };
            let (step, w) =
                ctl.state_slot
                    .reconcile(want, &issue, &policy.actions, &mut out.actions);
            if let Some(w) = w {
                min_wake(&mut wake, w);
            }
            if let Step::GaveUp { attempts, error } = step {
                rule = Rule::GaveUp;
                gave_up = Some(format!("gave up after {attempts} attempts: {error}"));
            }
            let new_health_out = out.actions[before..].iter().any(|a| {
                a.attempt == 1
                    && matches!(
                        a.action,
                        Action::SlurmDrain { .. } | Action::SlurmDown { .. }
                    )
            }) && causes.first().is_some_and(Cause::is_health);
            if new_health_out {
                let window_ms = ms(policy.health.flap_window_s);
                let bound = policy.health.flaps_max as usize + 1;
                health::record(&mut ctl.health_drains, now, window_ms, bound);
                health::record(
                    &mut self.health_drains,
                    now,
                    60_000,
                    policy.health.drains_per_minute_max as usize,
                );
            }
        } else if matches!(ctl.state_slot.current, Some(ref f) if f.flight != Flight::Sent) {
            // Held (rate bound, damping): forget a finished action so the
            // next attempt starts fresh.
            ctl.state_slot.current = None;
        }

        // Phase and the rule behind it.
        let status = Status {
            phase,
            rule,
            cause: causes.first().cloned(),
        };
        if status != ctl.status {
            let detail = gave_up
                .unwrap_or_else(|| detail(&status, &view, slurm, policy, ctl.health_drains.len()));
            out.transitions.push(Transition {
                seq: ctx.seq,
                time_ms: now,
                node: name.to_owned(),
                from: ctl.status.phase,
                to: phase,
                rule,
                cause: cause_event.clone(),
                detail,
            });
            ctl.status = status;
        }

        // Features and topology from the labels of the node under it.
        if self.model.slurm_visible {
            let kube_obs = view.kube.map(|k| &k.obs);
            let unseen = view.kube.map_or(&[][..], |k| &k.unseen_labels);
            let features = topology::features_want(
                slurm,
                kube_obs,
                &policy.topology,
                unseen,
                &self.retired.feature_prefixes,
            )
            .map(|features| Action::SlurmSetFeatures {
                node: name.to_owned(),
                features,
            });
            let issue = Issue {
                seq: ctx.seq,
                now_ms: now,
                cause: ctx.event,
                rule: Rule::Features.name(),
            };
            let (_, w) =
                ctl.features_slot
                    .reconcile(features, &issue, &policy.actions, &mut out.actions);
            if let Some(w) = w {
                min_wake(&mut wake, w);
            }
            let kube_named = view.kube_name.zip(kube_obs);
            let (topology, issue_now) =
                match topology::topology_want(slurm, kube_named, &policy.topology, unseen) {
                    TopologyWant::Leave => (None, None),
                    TopologyWant::Set(topology) => (
                        Some(Action::SlurmSetTopology {
                            node: name.to_owned(),
                            topology,
                        }),
                        None,
                    ),
                    TopologyWant::Invalid(why) => (None, Some(why)),
                };
            let issue = Issue {
                seq: ctx.seq,
                now_ms: now,
                cause: ctx.event,
                rule: Rule::Topology.name(),
            };
            let (_, w) =
                ctl.topology_slot
                    .reconcile(topology, &issue, &policy.actions, &mut out.actions);
            if let Some(w) = w {
                min_wake(&mut wake, w);
            }
            if issue_now != ctl.topology_issue {
                let (rule, detail) = match &issue_now {
                    Some(why) => (
                        Rule::TopologyInvalid,
                        format!("{why}; slurm's topology is left as it is"),
                    ),
                    None => (Rule::Topology, "topology label usable again".to_owned()),
                };
                out.transitions.push(Transition {
                    seq: ctx.seq,
                    time_ms: now,
                    node: name.to_owned(),
                    from: ctl.status.phase,
                    to: ctl.status.phase,
                    rule,
                    cause: ctx.event.clone(),
                    detail,
                });
                ctl.topology_issue = issue_now;
            }
        }

        // What the pod should show (Slurm -> Kubernetes): conditions and the
        // busy label. (slot key, wanted action or None when it shows it, rule)
        let mut pod_wants: Vec<(String, Option<Action>, &'static str)> = Vec::new();
        let mut pod_key_owned = None;
        if let (Some(key), Some(pod)) = (view.pod_key, view.pod) {
            if self.model.kube_visible {
                let set = |condition: PodCondition| Action::KubeSetPodCondition {
                    namespace: pod.obs.namespace.clone(),
                    pod: pod.obs.name.clone(),
                    condition,
                };
                let fd = policy.drain.foreign_drain_condition.as_str();
                if !fd.is_empty() {
                    let wanted = side.foreign_drain().then(|| {
                        (
                            ConditionStatus::True,
                            "SlurmDrain",
                            slurm.reason.as_deref().unwrap_or(""),
                        )
                    });
                    let want = condition_want(&pod.obs.conditions, fd, wanted, "SlurmNotDrained");
                    if want.is_some() || pod.has_slot(fd) {
                        pod_wants.push((fd.to_owned(), want.map(set), Rule::ForeignDrain.name()));
                    }
                }
                let hc = policy.health.slurm_health_condition.as_str();
                if !hc.is_empty() {
                    // While shown after Slurm recovered (hysteresis, flap
                    // hold), the condition keeps what it said.
                    let kept = pod
                        .obs
                        .conditions
                        .iter()
                        .find(|c| c.type_ == hc && c.status == ConditionStatus::False)
                        .map(|c| {
                            (
                                ConditionStatus::False,
                                c.reason.as_str(),
                                c.message.as_str(),
                            )
                        });
                    let wanted = match (shown, side.unhealthy) {
                        (false, _) => None,
                        (true, true) => Some((
                            ConditionStatus::False,
                            drain::unhealthy_reason(slurm),
                            slurm.reason.as_deref().unwrap_or(""),
                        )),
                        // Held, not newly shown (a new pod of a node that
                        // recovered meanwhile shows nothing).
                        (true, false) => kept,
                    };
                    let want = condition_want_health(&pod.obs.conditions, hc, wanted);
                    if want.is_some() || pod.has_slot(hc) {
                        pod_wants.push((hc.to_owned(), want.map(set), Rule::SlurmUnhealthy.name()));
                    }
                }
                let label = policy.scaling.busy_label.as_str();
                if !label.is_empty() {
                    let busy = self.model.jobs_on(name) > 0 || scaling::slurm_busy(slurm);
                    let present = pod.obs.labels.get(label).map(String::as_str);
                    let value = match (busy, present) {
                        (true, Some("true")) | (false, None) => None,
                        (true, _) => Some(Some("true".to_owned())),
                        (false, Some(_)) => Some(None),
                    };
                    let slot_key = format!("label:{label}");
                    if value.is_some() || pod.has_slot(&slot_key) {
                        let want = value.map(|value| Action::KubeLabelPod {
                            namespace: pod.obs.namespace.clone(),
                            pod: pod.obs.name.clone(),
                            key: label.to_owned(),
                            value,
                        });
                        pod_wants.push((slot_key, want, Rule::Busy.name()));
                    }
                }
                // What lockstep set under names the policy no longer has. A
                // condition cannot be removed (the actions set conditions),
                // so it says Unknown: lockstep no longer keeps it current.
                for ty in &self.retired.conditions {
                    let present = pod.obs.conditions.iter().find(|c| c.type_ == *ty);
                    let want = present
                        .filter(|c| {
                            !(c.status == ConditionStatus::Unknown && c.reason == NOT_MANAGED)
                        })
                        .map(|_| {
                            set(PodCondition {
                                type_: ty.clone(),
                                status: ConditionStatus::Unknown,
                                reason: NOT_MANAGED.to_owned(),
                                message: "lockstep no longer manages this condition".to_owned(),
                            })
                        });
                    if want.is_some() || pod.has_slot(ty) {
                        pod_wants.push((ty.clone(), want, Rule::Retired.name()));
                    }
                }
                for label in &self.retired.labels {
                    let slot_key = format!("label:{label}");
                    let want = pod
                        .obs
                        .labels
                        .contains_key(label)
                        .then(|| Action::KubeLabelPod {
                            namespace: pod.obs.namespace.clone(),
                            pod: pod.obs.name.clone(),
                            key: label.clone(),
                            value: None,
                        });
                    if want.is_some() || pod.has_slot(&slot_key) {
                        pod_wants.push((slot_key, want, Rule::Retired.name()));
                    }
                }
                if !pod_wants.is_empty() {
                    pod_key_owned = Some(key.to_owned());
                }
            }
        }
        if let Some(key) = pod_key_owned {
            let entry = self
                .model
                .pods
                .get_mut(&key)
                .expect("pod seen in this view");
            for (slot_key, want, rule) in pod_wants {
                let issue = Issue {
                    seq: ctx.seq,
                    now_ms: now,
                    cause: ctx.event,
                    rule,
                };
                if let Some(w) = reconcile_keyed(
                    &mut entry.condition_slots,
                    &slot_key,
                    want,
                    &issue,
                    &policy.actions,
                    &mut out.actions,
                ) {
                    min_wake(&mut wake, w);
                }
            }
        }

        self.scratch_causes = causes;
        self.timers.set(WakeOf::Slurm(name), wake);
        if shown != shown_before {
            // The taint of the Kubernetes node under it follows.
            if let Some(k) = self.model.placement(name, &self.policy) {
                self.dirty.push(Wake::Kube(k.to_owned()));
            }
        }
    }

    /// Re-evaluates every scale target: desired replicas, scale-up, picking,
    /// draining and deleting victims, lowering replicas, rolling replacement.
    fn eval_scaling(&mut self, ctx: &Ctx<'_>, out: &mut Output) {
        let now = ctx.now_ms;
        let rules = self.policy.scaling.targets.clone();
        // Victims of targets no longer scaled are dropped (their drains lift).
        let stale: Vec<String> = self
            .victims
            .iter()
            .filter(|(_, v)| !rules.iter().any(|r| r.target == v.target))
            .map(|(n, _)| n.clone())
            .collect();
        let timeout_ms = ms(self.policy.actions.timeout_s);
        for n in stale {
            if let Some(v) = self.victims.remove(&n) {
                park(&mut self.orphans, v.delete_slot, now, timeout_ms);
            }
            self.touch_slurm(&n);
        }
        let mut wake: Option<u64> = None;
        // A victim picked now may already be DRAINED (its node was drained
        // for another cause): no change of it will come to bring scaling
        // back, so the next evaluation is due anyway.
        let mut added_victims = false;
        let visible = self.model.slurm_visible && self.model.kube_visible;
        let scan_all =
            std::mem::take(&mut self.scale_scan_needed) || self.scale_busy.len() != rules.len();
        if scan_all {
            self.scale_busy = vec![0; rules.len()];
            self.scale_rollout = vec![true; rules.len()];
            self.scale_rule_of.clear();
        }
        for (index, rule) in rules.iter().enumerate() {
            let Some(target) = self
                .model
                .scale_targets
                .get(&rule.target)
                .map(|t| t.obs.clone())
            else {
                continue;
            };
            let current = target.replicas;
            // Fast path: nothing but job counts changed since the last scan,
            // no victims, no rollout, and no scale-in wanted: only the
            // replica count can need a change, and the busy count is current.
            if !scan_all
                && !self.scale_rollout[index]
                && !self.victims.values().any(|v| v.target == rule.target)
            {
                let pending = self.model.pending_nodes(&rule.partition);
                let desired = scaling::desired(
                    self.scale_busy[index],
                    pending,
                    rule.min_replicas,
                    rule.max_replicas,
                );
                if desired >= current {
                    let ctl = self.scale.entry(rule.target.clone()).or_default();
                    ctl.desired = Some(desired);
                    ctl.blocked = None;
                    reconcile_replicas(
                        ctl,
                        rule,
                        current,
                        desired,
                        None,
                        ctx,
                        &self.policy.actions,
                        &mut wake,
                        out,
                    );
                    continue;
                }
            }
            // The target's pods, with what scaling needs to know of each.
            let removal = self.policy.scaling.removal_of(&rule.target);
            let idle_ms = ms(rule.idle_before_scale_down_s);
            let cost_key = scaling::COST_LABEL;
            let mut pods: Vec<PodFacts> = Vec::new();
            let mut idle_at: Vec<u64> = Vec::new();
            for (key, entry) in &self.model.pods {
                let p = &entry.obs;
                let owned = p.namespace == rule.target.namespace
                    && p.owner
                        .as_ref()
                        .is_some_and(|o| scaling::owned_by(&rule.target, &o.kind, &o.name));
                if !owned {
                    continue;
                }
                let Some(slurm) = slurm_name_of_pod(p, &self.policy) else {
                    continue;
                };
                let node = self.model.slurm_nodes.get(slurm).map(|n| &n.obs);
                let jobs = self.model.jobs_on(slurm);
                let busy = jobs > 0 || node.is_some_and(scaling::slurm_busy);
                let idle_enough = match self.idle_since.get(slurm).copied() {
                    Some(t) if after_ms(t, idle_ms) <= now => true,
                    Some(t) => {
                        if !busy && !self.victims.contains_key(slurm) {
                            idle_at.push(after_ms(t, idle_ms));
                        }
                        false
                    }
                    None => false,
                };
                pods.push(PodFacts {
                    key,
                    name: &p.name,
                    uid: &p.uid,
                    slurm,
                    jobs,
                    busy,
                    known: node.is_some(),
                    drained: node.is_some_and(|n| scaling::drained(n, jobs)),
                    deleting: p.deleting,
                    serving: p.running_and_ready() && p.node_name.is_some(),
                    idle_enough,
                    cost: p.labels.get(cost_key).map_or(Some(0), |c| c.parse().ok()),
                    revision: p.revision.as_deref(),
                });
            }
            // Decisions below must not depend on the hash map's order (it
            // differs after a restore).
            pods.sort_unstable_by(|a, b| a.key.cmp(b.key));
            // Busy Slurm nodes, each once even while two pods claim it (a
            // replacement starting beside a terminating pod).
            let busy = pods
                .iter()
                .filter(|p| p.busy)
                .map(|p| p.slurm)
                .collect::<std::collections::BTreeSet<_>>()
                .len() as u32;
            self.scale_busy[index] = busy;
            for p in &pods {
                if !self.scale_rule_of.contains_key(p.slurm) {
                    self.scale_rule_of.insert(p.slurm.to_owned(), index);
                }
            }
            self.scale_rollout[index] = target
                .update_revision
                .as_deref()
                .is_some_and(|rev| pods.iter().any(|p| p.revision.is_some_and(|r| r != rev)));
            let pending = self.model.pending_nodes(&rule.partition);
            let desired = scaling::desired(busy, pending, rule.min_replicas, rule.max_replicas);
            let ctl = self.scale.entry(rule.target.clone()).or_default();
            ctl.desired = Some(desired);
            let mut touched = Vec::new();

            // Rolling replacement victims: settle once their pod is gone,
            // delete it once DRAINED.
            let replacing: Vec<String> = self
                .victims
                .iter()
                .filter(|(_, v)| v.target == rule.target && v.kind == VictimKind::Replace)
                .map(|(n, _)| n.clone())
                .collect();
            for node in &replacing {
                let v = self.victims.get_mut(node).expect("listed above");
                let Some(pod) = pods.iter().find(|p| p.key == v.pod_key && p.uid == v.uid) else {
                    if let Some(v) = self.victims.remove(node) {
                        park(&mut self.orphans, v.delete_slot, now, timeout_ms);
                    }
                    touched.push(node.clone());
                    continue;
                };
                // Fail closed: delete only what is surely drained and idle.
                let safe = visible && pod.known && pod.drained && pod.jobs == 0 && !pod.busy;
                let want = (safe && !pod.deleting).then(|| delete_action(pod));
                let issue = Issue {
                    seq: ctx.seq,
                    now_ms: now,
                    cause: ctx.event,
                    rule: Rule::Scaling.name(),
                };
                let (_, w) =
                    v.delete_slot
                        .reconcile(want, &issue, &self.policy.actions, &mut out.actions);
                if let Some(w) = w {
                    min_wake(&mut wake, w);
                }
            }

            // Scale-in victims whose pods are gone: settled, except that
            // with `delete_pod` they are counted off `replicas` first.
            let scale_in: Vec<String> = self
                .victims
                .iter()
                .filter(|(_, v)| v.target == rule.target && v.kind == VictimKind::ScaleIn)
                .map(|(n, _)| n.clone())
                .collect();
            let mut present: Vec<&str> = Vec::new();
            let mut gone = 0u32;
            for node in &scale_in {
                let v = self.victims.get_mut(node).expect("listed above");
                if let Some(p) = pods.iter().find(|p| p.key == v.pod_key && p.uid == v.uid) {
                    present.push(p.slurm);
                    continue;
                }
                let counted = removal == Some(Removal::DeletePod) && desired < current;
                match v.gone_at_replicas {
                    _ if !counted => {}
                    None => {
                        v.gone_at_replicas = Some(current);
                        gone += 1;
                        continue;
                    }
                    Some(at) if current >= at => {
                        gone += 1;
                        continue;
                    }
                    Some(_) => {}
                }
                if let Some(v) = self.victims.remove(node) {
                    park(&mut self.orphans, v.delete_slot, now, timeout_ms);
                }
                touched.push(node.clone());
            }
            let down_ready_at = ctl
                .last_down_ms
                .map_or(0, |t| after_s(t, rule.scale_down_cooldown_s));
            let may_pick = now >= down_ready_at;
            if desired < current && visible && !may_pick {
                min_wake(&mut wake, down_ready_at);
            }
            let mut plan = scaling::plan_scale_in(&ScaleIn {
                removal,
                target: &rule.target,
                current,
                desired,
                pods: &pods,
                victims: &present,
                gone,
                may_pick,
                visible,
            });
            if desired < current && visible && may_pick {
                for at in idle_at {
                    min_wake(&mut wake, at);
                }
            }
            if let Some(to) = plan.lower_to {
                if let Err(why) =
                    scaling::lowering_allowed(removal, &rule.target, &pods, current, to, visible)
                {
                    plan.lower_to = None;
                    plan.blocked = Some((None, why));
                }
            }
            let live: Vec<(String, String, String)> = pods
                .iter()
                .map(|p| (p.slurm.to_owned(), p.key.to_owned(), p.uid.to_owned()))
                .collect();
            drop(pods);

            // Victims: drop the ones no longer wanted, add the new ones.
            for node in present.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>() {
                if !plan.victims.contains(&node) {
                    if let Some(v) = self.victims.remove(&node) {
                        park(&mut self.orphans, v.delete_slot, now, timeout_ms);
                    }
                    touched.push(node);
                }
            }
            let mut picked = false;
            for node in &plan.victims {
                if self.victims.contains_key(node) {
                    continue;
                }
                let Some((_, key, uid)) = live.iter().find(|(s, _, _)| s == node) else {
                    continue;
                };
                self.victims.insert(
                    node.clone(),
                    Victim {
                        target: rule.target.clone(),
                        kind: VictimKind::ScaleIn,
                        pod_key: key.clone(),
                        uid: uid.clone(),
                        gone_at_replicas: None,
                        delete_slot: self.orphans.remove(&pod_target(key)).unwrap_or_default(),
                    },
                );
                touched.push(node.clone());
                picked = true;
                added_victims = true;
            }
            let ctl = self.scale.get_mut(&rule.target).expect("inserted above");
            if picked {
                ctl.last_down_ms = Some(now);
            }
            // `delete_pod`: delete each DRAINED victim's pod.
            for v in self
                .victims
                .values_mut()
                .filter(|v| v.target == rule.target && v.kind == VictimKind::ScaleIn)
            {
                let want = plan.delete.contains(&v.pod_key).then(|| {
                    let (namespace, pod) = v
                        .pod_key
                        .split_once('/')
                        .expect("pod keys are namespace/name");
                    Action::KubeDeletePod {
                        namespace: namespace.to_owned(),
                        pod: pod.to_owned(),
                        uid: v.uid.clone(),
                    }
                });
                let issue = Issue {
                    seq: ctx.seq,
                    now_ms: now,
                    cause: ctx.event,
                    rule: Rule::Scaling.name(),
                };
                let (_, w) =
                    v.delete_slot
                        .reconcile(want, &issue, &self.policy.actions, &mut out.actions);
                if let Some(w) = w {
                    min_wake(&mut wake, w);
                }
            }
            // `deletion_cost`: the lowest cost on DRAINED victims, and on no
            // other pod of the target.
            let slot_key = format!("label:{cost_key}");
            for (_, key, _) in &live {
                let Some(entry) = self.model.pods.get_mut(key) else {
                    continue;
                };
                let has = entry.obs.labels.get(cost_key).map(String::as_str);
                let marked = plan.mark.contains(key);
                let value = match (marked, has) {
                    (true, Some(scaling::VICTIM_COST)) | (false, None) => None,
                    (true, _) => Some(Some(scaling::VICTIM_COST.to_owned())),
                    (false, Some(scaling::VICTIM_COST)) => Some(None),
                    (false, Some(_)) => None,
                };
                if value.is_none() && !entry.has_slot(&slot_key) {
                    continue;
                }
                let want = value.map(|value| Action::KubeLabelPod {
                    namespace: entry.obs.namespace.clone(),
                    pod: entry.obs.name.clone(),
                    key: cost_key.to_owned(),
                    value,
                });
                let idx = match entry
                    .condition_slots
                    .iter()
                    .position(|(k, _)| *k == slot_key)
                {
                    Some(i) => i,
                    None => {
                        entry
                            .condition_slots
                            .push((slot_key.clone(), Slot::default()));
                        entry.condition_slots.len() - 1
                    }
                };
                let issue = Issue {
                    seq: ctx.seq,
                    now_ms: now,
                    cause: ctx.event,
                    rule: Rule::Scaling.name(),
                };
                let (_, w) = entry.condition_slots[idx].1.reconcile(
                    want,
                    &issue,
                    &self.policy.actions,
                    &mut out.actions,
                );
                if let Some(w) = w {
                    min_wake(&mut wake, w);
                }
                if entry.condition_slots[idx].1.current.is_none() {
                    entry.condition_slots.remove(idx);
                }
            }

            // Rolling replacement of pods of an old revision.
            if let (Some(rev), true) = (&target.update_revision, visible) {
                let replacing = self
                    .victims
                    .values()
                    .filter(|v| v.target == rule.target && v.kind == VictimKind::Replace)
                    .count() as u32;
                let room = rule.max_unavailable.saturating_sub(replacing) as usize;
                let mut old: Vec<(u32, String, String, String)> = Vec::new();
                for (key, entry) in &self.model.pods {
                    let p = &entry.obs;
                    let Some((slurm, _, uid)) = live.iter().find(|(_, k, _)| k == key) else {
                        continue;
                    };
                    if p.revision.as_ref().is_none_or(|r| r == rev)
                        || self.victims.contains_key(slurm)
                        || p.deleting
                        || !self.model.slurm_nodes.contains_key(slurm)
                    {
                        continue;
                    }
                    old.push((
                        self.model.jobs_on(slurm),
                        slurm.clone(),
                        key.clone(),
                        uid.clone(),
                    ));
                }
                old.sort_by(|a, b| scaling::victim_order((a.0, &a.1), (b.0, &b.1)));
                for (_, slurm, key, uid) in old.into_iter().take(room) {
                    self.victims.insert(
                        slurm.clone(),
                        Victim {
                            target: rule.target.clone(),
                            kind: VictimKind::Replace,
                            delete_slot: self.orphans.remove(&pod_target(&key)).unwrap_or_default(),
                            pod_key: key,
                            uid,
                            gone_at_replicas: None,
                        },
                    );
                    touched.push(slurm);
                    added_victims = true;
                }
            }

            // Why scale-in stops short, once per change, in the audit trail.
            let blocked = plan
                .blocked
                .filter(|_| desired < current)
                .map(|(node, why)| {
                    let detail = format!(
                        "scale-in of {} from {current} toward {desired} stops: {why}",
                        rule.target
                    );
                    (node, detail)
                });
            let ctl = self.scale.get_mut(&rule.target).expect("inserted above");
            if blocked.as_ref().map(|(_, d)| d) != ctl.blocked.as_ref() {
                ctl.blocked = blocked.as_ref().map(|(_, d)| d.clone());
                if let Some((node, detail)) = blocked {
                    let node = node.unwrap_or_else(|| rule.target.to_string());
                    let phase = self
                        .ctl
                        .get(&node)
                        .map_or(Phase::Unknown, |c| c.status.phase);
                    out.transitions.push(Transition {
                        seq: ctx.seq,
                        time_ms: now,
                        node,
                        from: phase,
                        to: phase,
                        rule: Rule::Scaling,
                        cause: ctx.event.clone(),
                        detail,
                    });
                }
            }

            // The replica count: up at once (after the cooldown); down as
            // the plan says, never below the demand of this moment.
            let ctl = self.scale.get_mut(&rule.target).expect("inserted above");
            reconcile_replicas(
                ctl,
                rule,
                current,
                desired,
                plan.lower_to,
                ctx,
                &self.policy.actions,
                &mut wake,
                out,
            );
            for n in touched {
                self.touch_slurm(&n);
            }
        }
        // The nodes touched above are evaluated in this same record.
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for w in &dirty {
            match w {
                Wake::Slurm(n) => self.eval_slurm(n, ctx, out),
                Wake::Kube(n) => self.eval_kube(n, ctx, out),
                Wake::Maint(n) => self.eval_maintenance(n, ctx, out),
                Wake::Scale => {}
            }
        }
        dirty.clear();
        self.dirty = dirty;
        if added_victims {
            min_wake(
                &mut wake,
                after_s(now, self.policy.scaling.evaluate_every_s),
            );
        }
        self.timers.set(WakeOf::Scale, wake);
    }

    /// Re-evaluates one Kubernetes node's taints from the Slurm nodes on it.
    fn eval_kube(&mut self, name: &str, ctx: &Ctx<'_>, out: &mut Output) {
        if !self.model.kube_visible {
            return;
        }
        let policy = &self.policy;
        let Some(entry) = self.model.kube_nodes.get(name) else {
            return;
        };
        let mut names = std::mem::take(&mut self.scratch_names);
        names.clear();
        self.model.slurm_nodes_on(name, policy, &mut names);
        let (mut unhealthy, mut held, mut foreign) = (false, false, false);
        for n in &names {
            if let Some(s) = self.model.slurm_nodes.get(n) {
                let side = SlurmSide::of(
                    &s.obs,
                    &Ownership {
                        prefix: &policy.drain.reason_prefix,
                        earlier_prefixes: &self.retired.prefixes,
                        slurm_user: policy.drain.slurm_user.as_deref(),
                    },
                );
                if self.ctl.get(n).is_some_and(|c| c.slurm_health.shown) {
                    // Shown and still unhealthy; or shown, recovered, and
                    // held by the hysteresis: that keeps a taint, never
                    // puts one on.
                    unhealthy |= side.unhealthy;
                    held |= !side.unhealthy;
                }
                foreign |= side.foreign_drain();
            }
        }
        self.scratch_names = names;
        if held && !unhealthy {
            let key = policy
                .health
                .unhealthy_taint
                .as_ref()
                .map(|t| t.key.as_str());
            unhealthy = entry.obs.taints.iter().any(|t| Some(t.key.as_str()) == key);
        }
        let rows: [(Option<&TaintSpec>, bool, Rule); 2] = [
            (
                policy.health.unhealthy_taint.as_ref(),
                unhealthy,
                Rule::SlurmUnhealthy,
            ),
            (
                policy.drain.foreign_drain_taint.as_ref(),
                foreign,
                Rule::ForeignDrain,
            ),
        ];
        let mut wants: Vec<(String, Option<Action>, Rule)> = Vec::new();
        // Taints lockstep set under keys the policy no longer has.
        for key in &self.retired.taints {
            if rows
                .iter()
                .any(|(s, _, _)| s.is_some_and(|s| s.key == *key))
            {
                continue;
            }
            let present = entry.obs.taints.iter().any(|t| t.key == *key);
            let want = present.then(|| Action::KubeUntaintNode {
                node: name.to_owned(),
                key: key.clone(),
            });
            if want.is_some() || entry.taint_slots.iter().any(|(k, _)| k == key) {
                wants.push((key.clone(), want, Rule::Retired));
            }
        }
        for (spec, needed, rule) in rows {
            let Some(spec) = spec else { continue };
            let present = entry.obs.taints.iter().find(|t| t.key == spec.key);
            let want = match (needed, present) {
                (true, Some(t)) if t.value == spec.value && t.effect == spec.effect => None,
                (true, _) => Some(Action::KubeTaintNode {
                    node: name.to_owned(),
                    taint: Taint {
                        key: spec.key.clone(),
                        value: spec.value.clone(),
                        effect: spec.effect,
                    },
                }),
                (false, Some(_)) => Some(Action::KubeUntaintNode {
                    node: name.to_owned(),
                    key: spec.key.clone(),
                }),
                (false, None) => None,
            };
            if want.is_some() || entry.taint_slots.iter().any(|(k, _)| *k == spec.key) {
                wants.push((spec.key.clone(), want, rule));
            }
        }
        if wants.is_empty() {
            return;
        }
        let entry = self
            .model
            .kube_nodes
            .get_mut(name)
            .expect("looked up above");
        let mut wake = None;
        for (key, want, rule) in wants {
            let issue = Issue {
                seq: ctx.seq,
                now_ms: ctx.now_ms,
                cause: ctx.event,
                rule: rule.name(),
            };
            if let Some(w) = reconcile_keyed(
                &mut entry.taint_slots,
                &key,
                want,
                &issue,
                &policy.actions,
                &mut out.actions,
            ) {
                min_wake(&mut wake, w);
            }
        }
        self.timers.set(WakeOf::Kube(name), wake);
    }
}

/// The replica count a scale target should have now: up to `desired` at
/// once (after the cooldown), down to `lower_to` (what the scale-in plan
/// found safe), never below `desired`.
#[allow(clippy::too_many_arguments)]
fn reconcile_replicas(
    ctl: &mut ScaleCtl,
    rule: &lockstep_schemas::ScaleRule,
    current: u32,
    desired: u32,
    lower_to: Option<u32>,
    ctx: &Ctx<'_>,
    policy: &lockstep_schemas::ActionPolicy,
    wake: &mut Option<u64>,
    out: &mut Output,
) {
    let now = ctx.now_ms;
    let up_ready_at = ctl
        .last_up_ms
        .map_or(0, |t| after_s(t, rule.scale_up_cooldown_s));
    let want = if desired > current {
        if now >= up_ready_at {
            Some(desired)
        } else {
            min_wake(wake, up_ready_at);
            None
        }
    } else {
        lower_to.map(|to| to.max(desired).max(rule.min_replicas))
    };
    let want = want
        .filter(|&r| r != current)
        .map(|replicas| Action::KubeScale {
            target: rule.target.clone(),
            replicas,
        });
    let issue = Issue {
        seq: ctx.seq,
        now_ms: now,
        cause: ctx.event,
        rule: Rule::Scaling.name(),
    };
    let before = out.actions.len();
    let (_, w) = ctl.slot.reconcile(want, &issue, policy, &mut out.actions);
    if out.actions[before..]
        .iter()
        .any(|a| matches!(a.action, Action::KubeScale { replicas, .. } if replicas > current))
    {
        ctl.last_up_ms = Some(now);
    }
    if let Some(w) = w {
        min_wake(wake, w);
    }
}

const fn yes() -> bool {
    true
}

/// The reason of a pod condition lockstep set under a type the policy no
/// longer names, once it is left: Unknown, no longer kept current.
const NOT_MANAGED: &str = "LockstepNotManaged";

/// Deletes a pod, only if its UID is still the one scaling looked at.
fn delete_action(pod: &PodFacts<'_>) -> Action {
    let (namespace, name) = pod
        .key
        .split_once('/')
        .expect("pod keys are namespace/name");
    Action::KubeDeletePod {
        namespace: namespace.to_owned(),
        pod: name.to_owned(),
        uid: pod.uid.to_owned(),
    }
}

/// Takes the orphaned slots whose target `key_of` recognises, keyed by what
/// it returns.
fn adopt(
    orphans: &mut BTreeMap<Target, Slot>,
    key_of: impl Fn(&Target) -> Option<String>,
) -> Vec<(String, Slot)> {
    if orphans.is_empty() {
        return Vec::new();
    }
    let keys: Vec<(Target, String)> = orphans
        .keys()
        .filter_map(|t| key_of(t).map(|k| (t.clone(), k)))
        .collect();
    keys.into_iter()
        .filter_map(|(t, k)| orphans.remove(&t).map(|s| (k, s)))
        .collect()
}

/// Keeps a slot whose action is still in flight (until its outcome or its
/// timeout) after its owner went, so that an owner made again for the same
/// target adopts it instead of racing it with a second action.
fn park(orphans: &mut BTreeMap<Target, Slot>, slot: Slot, now: u64, timeout_ms: u64) {
    orphans.retain(|_, s| {
        s.pending()
            .is_some_and(|f| now < after_ms(f.issued_ms, timeout_ms))
    });
    if let Some(f) = slot.pending() {
        if now < after_ms(f.issued_ms, timeout_ms) {
            orphans.insert(f.action.target(), slot);
        }
    }
}

/// The target of a victim's pod deletion.
fn pod_target(pod_key: &str) -> Target {
    let (namespace, pod) = pod_key.split_once('/').unwrap_or(("", pod_key));
    Target::Pod {
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
    }
}

/// The condition lockstep wants on a pod, or `None` if the pod already shows
/// it. `wanted` is `(status, reason, message)` while the condition applies;
/// once it no longer does, a condition lockstep set is flipped to False with
/// `clear_reason`, and an absent one stays absent.
fn condition_want(
    observed: &[PodCondition],
    ty: &str,
    wanted: Option<(ConditionStatus, &str, &str)>,
    clear_reason: &str,
) -> Option<PodCondition> {
    let present = observed.iter().find(|c| c.type_ == ty);
    let (status, reason, message) = match (wanted, present) {
        (Some(w), _) => w,
        (None, Some(c)) if c.status == ConditionStatus::True => {
            (ConditionStatus::False, clear_reason, "")
        }
        (None, _) => return None,
    };
    if present.is_some_and(|c| c.status == status && c.reason == reason && c.message == message) {
        return None;
    }
    Some(PodCondition {
        type_: ty.to_owned(),
        status,
        reason: reason.to_owned(),
        message: message.to_owned(),
    })
}

/// Like [`condition_want`] for the health condition, whose healthy state is True.
fn condition_want_health(
    observed: &[PodCondition],
    ty: &str,
    wanted: Option<(ConditionStatus, &str, &str)>,
) -> Option<PodCondition> {
    let present = observed.iter().find(|c| c.type_ == ty);
    let (status, reason, message) = match (wanted, present) {
        (Some(w), _) => w,
        (None, Some(c)) if c.status != ConditionStatus::True => {
            (ConditionStatus::True, "SlurmHealthy", "")
        }
        (None, _) => return None,
    };
    if present.is_some_and(|c| c.status == status && c.reason == reason && c.message == message) {
        return None;
    }
    Some(PodCondition {
        type_: ty.to_owned(),
        status,
        reason: reason.to_owned(),
        message: message.to_owned(),
    })
}

/// The human-readable explanation of a status.
fn detail(
    status: &Status,
    view: &crate::model::NodeView<'_>,
    slurm: &lockstep_schemas::SlurmNode,
    policy: &Policy,
    flaps: usize,
) -> String {
    let cause = || {
        status
            .cause
            .as_ref()
            .map_or_else(String::new, |c| c.describe(view))
    };
    let slurm_state = || {
        let mut s = slurm.state.to_string();
        for f in &slurm.flags {
            s.push('+');
            s.push_str(f.as_str());
        }
        s
    };
    match status.rule {
        Rule::ScaleIn
        | Rule::Replace
        | Rule::Cordoned
        | Rule::PodDeleting
        | Rule::PodEvicted
        | Rule::PodMissing
        | Rule::NotReady
        | Rule::NodeCondition
        | Rule::KubeNodeGone
        | Rule::Maintenance => match status.phase {
            Phase::Drained => format!("{}; slurm shows {}", cause(), slurm_state()),
            _ => cause(),
        },
        Rule::Reapplied => format!("{}; the drain was removed while its cause holds", cause()),
        Rule::RateLimited => format!(
            "{}; deferred: health drains are at the bound of {} per minute",
            cause(),
            policy.health.drains_per_minute_max
        ),
        Rule::CauseCleared => "cause cleared; resuming lockstep's drain".to_owned(),
        Rule::ResumeDelayed => format!(
            "cause cleared; resume once healthy for {}s",
            policy.health.resume_after_s
        ),
        Rule::FlapHold => format!(
            "cause cleared, but {flaps} health drains within {}s; held for {}s",
            policy.health.flap_window_s, policy.health.flap_hold_s
        ),
        Rule::ForeignDrain => format!(
            "drained by {}: {}",
            slurm.reason_user.as_deref().unwrap_or("someone else"),
            slurm.reason.as_deref().unwrap_or("(no reason)")
        ),
        Rule::SlurmUnhealthy => format!(
            "slurm reports {}{}",
            slurm_state(),
            slurm
                .reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
        Rule::SlurmInvisible => {
            "lockstep cannot see slurm; no slurm actions until it can".to_owned()
        }
        Rule::Observed => format!("slurm shows {}", slurm_state()),
        Rule::Gone => "slurm no longer reports the node".to_owned(),
        Rule::GaveUp => "gave up".to_owned(),
        Rule::Features
        | Rule::Topology
        | Rule::TopologyInvalid
        | Rule::Busy
        | Rule::Scaling
        | Rule::Retired
        | Rule::Reserve
        | Rule::Release
        | Rule::DrainConditions => String::new(),
    }
}
