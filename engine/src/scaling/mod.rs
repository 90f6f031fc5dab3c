//! Scaling policy: each scale target follows the demand of one Slurm
//! partition, and shrinks only through drain -> drained -> delete.
//!
//! Desired replicas: the busy nodes of the target plus the nodes wanted by
//! pending jobs that more nodes can help, bounded by min and max.
//!
//! | rule                    | what                                                                 |
//! |-------------------------|----------------------------------------------------------------------|
//! | `scaling.up`            | desired above the replica count: scale up at once (after the cooldown) |
//! | `scaling.in`            | desired below it: pick victims the way the target's controller removes pods (below), drain them |
//! | `scaling.down`          | lower the replica count, never below the demand of that moment, and only so far that every pod it makes the controller remove is DRAINED (DRAIN, not ALLOCATED/MIXED/COMPLETING, no job) |
//! | `scaling.delete_pod`    | `delete_pod` removal: delete a DRAINED victim's pod (only while its UID is the one picked) |
//! | `scaling.deletion_cost` | `deletion_cost` removal: the lowest deletion cost on DRAINED victims, on no other pod |
//! | `scaling.blocked`       | why scale-in stops short of the demand, reported once per change   |
//! | `scaling.replace`       | pods of an old revision: at most `max_unavailable` at a time through drain -> DRAINED -> delete |
//! | `scaling.busy`          | label pods whose Slurm node runs a job, so a PodDisruptionBudget protects them |
//!
//! A victim no longer wanted (demand returns, a job lands on it, the chain
//! above it breaks, its target is gone) is dropped at every step; its drain
//! lifts (`drain.cause_cleared`).
//!
//! Scale-in by removal rule ([`Removal`], per kind of target):
//!
//! | removal            | victims                                   | what lowers `replicas`                                           |
//! |--------------------|-------------------------------------------|-------------------------------------------------------------------|
//! | `highest_ordinal`  | the top ordinals, each idle long enough (or its pod already on its way out, its node jobless); a busy one stops the chain below it | past an ordinal once it and all above it are DRAINED (or on their way out, their nodes jobless and DOWN or not answering) |
//! | `deletion_cost`    | any idle, Running and Ready pods           | by the DRAINED victims marked with the lowest deletion cost, while every other pod is Running, Ready and costs more |
//! | `delete_pod`       | any idle pods                              | by the victims whose pods lockstep deleted once DRAINED, while no more pods exist than the new count |
//! | `controller_drains`| none (the controller drains)               | by at most the pods idle long enough                               |
//! | (kind not known)   | none                                       | never: only scaled up                                              |
//!
//! Fail closed: while lockstep cannot see Slurm or Kubernetes, or does not
//! know a pod or its Slurm node, nothing is deleted and `replicas` is not
//! lowered. No pod whose Slurm node runs a job is removed, by lockstep or by
//! a controller lockstep scaled.

use std::cmp::Ordering;

use std::collections::BTreeMap;

use lockstep_schemas::{
    Action, ConditionStatus, KubePod, Policy, Removal, ScaleRule, ScaleTargetRef, SlurmBaseState,
    SlurmNode, SlurmNodeFlag,
};
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};

pub(crate) use crate::cause::VictimKind;
use crate::cow::CowMap;
use crate::flights::{AspectRef, Flights, Key};
use crate::model::{slurm_name_of_pod, Model, Name};
use crate::units::{after_ms, after_s, ms};

mod evaluate;
mod plan;
pub(crate) use evaluate::Cx;
pub(crate) use plan::{lowering_allowed, plan_scale_in, ScaleIn, ScaleInPlan};

/// A node on its way out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Victim {
    pub target: ScaleTargetRef,
    pub kind: VictimKind,
    /// `namespace/name` of its pod, and the pod's UID when it was picked.
    pub pod_key: String,
    pub uid: String,
    /// The target's replica count when the pod was seen gone (scale-in),
    /// so the victim is settled once the count drops below it.
    pub gone_at_replicas: Option<u32>,
}

/// Per scale target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ScaleCtl {
    pub last_up_ms: Option<u64>,
    pub last_down_ms: Option<u64>,
    /// The last desired count, to report changes.
    pub desired: Option<u32>,
    /// Why scale-in does not go further, as last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<String>,
}

impl ScaleCtl {
    /// When the scale-down cooldown lets new victims be picked.
    pub fn down_ready_at(&self, rule: &ScaleRule) -> u64 {
        self.last_down_ms
            .map_or(0, |t| after_s(t, rule.scale_down_cooldown_s))
    }
}

/// Scaling's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Book {
    /// Per scale target.
    pub targets: BTreeMap<ScaleTargetRef, ScaleCtl>,
    /// Slurm nodes on their way out (scale-in, rolling replacement).
    pub victims: BTreeMap<String, Victim>,
    /// Slurm node -> since when it runs no job (log time).
    pub idle_since: CowMap<Name, u64>,
    // Derived, for the fast path: rebuilt after a restore (the first
    // evaluation then scans), so neither serialized nor hashed.
    /// Slurm nodes that run or finish a job.
    #[serde(skip)]
    pub busy_nodes: FxHashSet<Name>,
    /// Per scale rule: busy nodes among its pods, kept current between scans.
    #[serde(skip)]
    pub busy: Vec<u32>,
    /// Per scale rule: the last scan found pods of an old revision.
    #[serde(skip)]
    pub rollout: Vec<bool>,
    /// Slurm node -> the scale rule its pod belongs to, as of the last scan
    /// (pods do not change between scans: a change forces one).
    #[serde(skip)]
    pub rule_of: FxHashMap<Name, usize>,
    /// Per scale rule: the last scan found a `highest_ordinal` scale-in
    /// stopped at its top ordinal, nothing to pick, mark, delete or lower
    /// and no victims; until the next scan only the top pod can change
    /// that (`Book::scale_top`).
    #[serde(skip)]
    pub stopped_at_top: Vec<bool>,
    /// Pods, targets or visibility changed since the last scan.
    #[serde(skip, default = "yes")]
    pub scan_needed: bool,
}

impl Default for Book {
    fn default() -> Self {
        Self {
            targets: BTreeMap::new(),
            victims: BTreeMap::new(),
            idle_since: CowMap::default(),
            busy_nodes: FxHashSet::default(),
            busy: Vec::new(),
            rollout: Vec::new(),
            rule_of: FxHashMap::default(),
            stopped_at_top: Vec::new(),
            scan_needed: true,
        }
    }
}

impl Book {
    /// A copy of what a snapshot holds, without the fast path's derived
    /// counts.
    pub fn frozen(&self) -> Self {
        let Self {
            targets,
            victims,
            idle_since,
            busy_nodes: _,
            busy: _,
            rollout: _,
            rule_of: _,
            stopped_at_top: _,
            scan_needed: _,
        } = self;
        Self {
            targets: targets.clone(),
            victims: victims.clone(),
            idle_since: idle_since.clone(),
            ..Self::default()
        }
    }

    /// Whether the target has victims (of scale-in or replacement).
    fn has_victims(&self, target: &ScaleTargetRef) -> bool {
        self.victims.values().any(|v| v.target == *target)
    }

    /// The replicas the demand of this moment wants of rule `index`, from
    /// the busy count kept current between scans.
    fn desired_now(&self, index: usize, rule: &ScaleRule, model: &Model) -> u32 {
        let pending = model.pending_nodes(&rule.partition);
        desired(
            self.busy[index],
            pending,
            rule.min_replicas,
            rule.max_replicas,
        )
    }
}

const fn yes() -> bool {
    true
}

/// The annotation a ReplicaSet ranks pods by when it removes some (the
/// lowest cost goes first), `controller.kubernetes.io/pod-deletion-cost`,
/// as pods' labels carry it in observations and in
/// `KubeLabelPod` actions: a key `annotation:<key>` names an annotation (the
/// Kubernetes connector watches it for targets whose removal is
/// `deletion_cost`, and patches `metadata.annotations` for it).
pub(crate) const COST_LABEL: &str = "annotation:controller.kubernetes.io/pod-deletion-cost";

/// The cost lockstep gives a DRAINED victim: the lowest there is (int32).
pub(crate) const VICTIM_COST: &str = "-2147483648";

/// What scaling knows of one pod of a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodFacts<'a> {
    /// `namespace/name`.
    pub key: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub slurm: &'a str,
    /// Jobs holding its Slurm node.
    pub jobs: u32,
    /// A job holds its Slurm node, or Slurm shows it ALLOCATED, MIXED or
    /// COMPLETING.
    pub busy: bool,
    /// Slurm knows its node.
    pub known: bool,
    /// Its Slurm node is DRAINED, and lockstep's last drain, down or resume
    /// of it shows (a resume sent, or done and not yet seen, lets Slurm
    /// start a job on it before its pod is gone; a drain sent after it
    /// may come too late). Not by a drain its owner lifts by itself
    /// (`drain.self_lifting_prefixes`): lifted between lockstep's look and
    /// the pod's removal, it would let a job start there.
    pub drained: bool,
    pub deleting: bool,
    /// Assigned, Running and Ready, on a Kubernetes node that is Ready (the
    /// node lifecycle controller marks every pod of a node that is not
    /// Ready not ready, and a controller removes not-ready pods first).
    pub serving: bool,
    /// Its Slurm node is set DOWN by a user (another operator's preStop hook,
    /// an administrator) and not drained: lockstep cannot drain it (that
    /// would replace their reason), and a DOWN may lift by itself, so it can
    /// never be surely DRAINED.
    pub held_down: bool,
    /// Its Slurm node is drained by somebody who lifts that drain by
    /// itself (`drain.self_lifting_prefixes`) and its Kubernetes node is
    /// not cordoned, so not `drained`.
    pub self_lifting: bool,
    /// Its Slurm node serves: Slurm knows it, and shows it neither drained,
    /// DOWN, FAILed nor NOT_RESPONDING.
    pub slurm_serves: bool,
    /// Its Slurm node has been idle for `idle_before_scale_down_s`.
    pub idle_enough: bool,
    /// Its `controller.kubernetes.io/pod-deletion-cost` as observed (absent: 0;
    /// `None`: not a number, so its rank is unknown).
    pub cost: Option<i64>,
    /// lockstep's last change of its deletion cost (sent, done, or failed
    /// and maybe done) does not show in the pod yet, so `cost` may be what
    /// it was before. Only for a `deletion_cost` target (else false).
    pub cost_unsettled: bool,
    pub revision: Option<&'a str>,
    /// When it becomes idle long enough, while it is idle, not busy, no
    /// victim, and not idle long enough yet.
    pub idle_at: Option<u64>,
}

impl PodFacts<'_> {
    /// Whether removing it now could cost a job, or lockstep cannot tell.
    fn why_not_removable(&self) -> Option<String> {
        if !self.known {
            Some(format!("slurm node {} is not known", self.slurm))
        } else if self.jobs > 0 {
            Some(format!(
                "slurm node {} runs {} job(s)",
                self.slurm, self.jobs
            ))
        } else if self.busy {
            Some(format!(
                "slurm node {} is allocated or completing",
                self.slurm
            ))
        } else if self.deleting {
            Some(format!("pod {} is being deleted", self.key))
        } else if self.held_down {
            Some(format!(
                "slurm node {} is held DOWN by somebody else",
                self.slurm
            ))
        } else {
            None
        }
    }

    /// DRAINED and holding nothing: its removal cannot cost a job.
    fn safe_to_remove(&self) -> bool {
        self.known && self.drained && self.jobs == 0 && !self.busy
    }

    /// Being deleted already (evicted, or stuck terminating on a host that
    /// is gone) and holding nothing: it goes whatever lockstep does.
    fn leaving(&self) -> bool {
        self.deleting && self.known && self.jobs == 0 && !self.busy
    }

    /// Leaving, and its Slurm node takes no job either (drained, DOWN or
    /// not answering; lockstep never drains over somebody else's DOWN):
    /// lowering `replicas` past it only keeps the controller from creating
    /// it again, which cannot cost a job.
    fn passable(&self) -> bool {
        self.safe_to_remove() || (self.leaving() && !self.slurm_serves)
    }
}

/// The ordinal of a StatefulSet pod `<set>-<ordinal>` (canonical decimal).
pub(crate) fn ordinal(set: &str, pod: &str) -> Option<u32> {
    let digits = pod.strip_prefix(set)?.strip_prefix('-')?;
    // Canonical: digits only (no sign), no leading zero; checked without
    // printing the number back (a scale-in scan asks this of every pod).
    let canonical = digits.bytes().all(|b| b.is_ascii_digit())
        && (digits.len() == 1 || !digits.starts_with('0'));
    canonical.then(|| digits.parse().ok()).flatten()
}

/// Whether a pod's controller is the scale target: the target itself, or
/// for a Deployment, its ReplicaSet `<deployment>-<pod-template-hash>`.
pub(crate) fn owned_by(target: &ScaleTargetRef, owner_kind: &str, owner_name: &str) -> bool {
    if target.kind == "Deployment" && target.group == "apps" {
        return owner_kind == "ReplicaSet"
            && owner_name
                .strip_prefix(target.name.as_str())
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|hash| {
                    !hash.is_empty() && hash.bytes().all(|b| b.is_ascii_alphanumeric())
                });
    }
    owner_kind == target.kind && owner_name == target.name
}

/// What scaling reads of the engine to know a target's pods.
pub(crate) struct PodLook<'a, 'b, U> {
    pub model: &'a Model,
    pub policy: &'b Policy,
    pub rule: &'b ScaleRule,
    pub idle_since: &'b CowMap<Name, u64>,
    pub victims: &'b BTreeMap<String, Victim>,
    /// Whether what Slurm shows of a node is about to change (`Cx::unseen`).
    pub unseen: U,
    /// lockstep's actions in flight, for the pods' deletion cost.
    pub flights: &'b Flights,
    /// The target's removal reads deletion costs (`deletion_cost`): only
    /// then is `PodFacts::cost_unsettled` looked up (a scan of a large
    /// target asks it of every pod).
    pub reads_costs: bool,
    pub now: u64,
}

impl<'a, U: Fn(&str) -> bool> PodLook<'a, '_, U> {
    /// What scaling knows of each pod of the target, sorted by pod key.
    pub fn all(&self) -> Vec<PodFacts<'a>> {
        let mut pods: Vec<PodFacts> = self
            .model
            .pods
            .iter()
            .filter_map(|(key, entry)| self.one(key, &entry.obs))
            .collect();
        // Decisions must not depend on the hash map's order (it differs
        // after a restore).
        pods.sort_unstable_by(|a, b| a.key.cmp(b.key));
        pods
    }

    /// The pod of `key`, if the model has it.
    pub fn get(&self, key: &str) -> Option<PodFacts<'a>> {
        let (key, entry) = self.model.pods.get_key_value(key)?;
        self.one(key, &entry.obs)
    }

    /// What scaling knows of one pod, if it is one of the target's and
    /// names a Slurm node.
    fn one(&self, key: &'a str, p: &'a KubePod) -> Option<PodFacts<'a>> {
        let (model, rule) = (self.model, self.rule);
        let owned = p.namespace == rule.target.namespace
            && p.owner
                .as_ref()
                .is_some_and(|o| owned_by(&rule.target, &o.kind, &o.name));
        if !owned {
            return None;
        }
        let slurm = slurm_name_of_pod(p, self.policy)?;
        let node = model.slurm_nodes.get(slurm).map(|n| &n.obs);
        let jobs = model.jobs_on(slurm);
        let busy = jobs > 0 || node.is_some_and(slurm_busy);
        // Such a drain stays while the pod's Kubernetes node is cordoned
        // (Slinky's then holds the node for the cordon).
        let self_lifting = node.is_some_and(|n| {
            n.has(&SlurmNodeFlag::Drain) && self.policy.drain.self_lifting(n.reason.as_deref())
        }) && !p
            .node_name
            .as_deref()
            .and_then(|n| model.kube_nodes.get(n))
            .is_some_and(|k| k.obs.unschedulable);
        let idle_ms = ms(rule.idle_before_scale_down_s);
        let (idle_enough, idle_at) = match self.idle_since.get(slurm).copied() {
            Some(t) if after_ms(t, idle_ms) <= self.now => (true, None),
            Some(t) => {
                let waits = !busy && !self.victims.contains_key(slurm);
                (false, waits.then(|| after_ms(t, idle_ms)))
            }
            None => (false, None),
        };
        Some(PodFacts {
            key,
            name: &p.name,
            uid: &p.uid,
            slurm,
            jobs,
            busy,
            known: node.is_some(),
            drained: node.is_some_and(|n| drained(n, jobs))
                && !self_lifting
                && !(self.unseen)(slurm),
            self_lifting,
            deleting: p.deleting,
            serving: p.running_and_ready()
                && p.node_name.as_deref().is_some_and(|n| {
                    model
                        .kube_nodes
                        .get(n)
                        .is_none_or(|k| k.obs.ready == ConditionStatus::True)
                }),
            slurm_serves: node.is_some_and(slurm_serves),
            held_down: node.is_some_and(|n| {
                !n.has(&SlurmNodeFlag::Drain) && lockstep_schemas::set_down_by_user(n)
            }),
            idle_enough,
            cost: p.labels.get(COST_LABEL).map_or(Some(0), |c| c.parse().ok()),
            cost_unsettled: self.reads_costs
                && self
                    .flights
                    .current(Key::Pod(key, AspectRef::Label(COST_LABEL)))
                    .is_some_and(|f| match &f.action {
                        Action::KubeLabelPod { value, .. } => {
                            p.labels.get(COST_LABEL) != value.as_ref()
                        }
                        _ => false,
                    }),
            revision: p.revision.as_deref(),
            idle_at,
        })
    }
}

/// `deletion_cost`: the deletion cost a pod should carry, `marked` or not
/// as a DRAINED victim; `None` when it carries it. A cost somebody else
/// set on a pod that is not a victim is left.
pub(crate) fn cost_want(pod: &KubePod, marked: bool) -> Option<Action> {
    let has = pod.labels.get(COST_LABEL).map(String::as_str);
    let value = match (marked, has) {
        (true, Some(VICTIM_COST)) | (false, None) => None,
        (true, _) => Some(Some(VICTIM_COST.to_owned())),
        (false, Some(VICTIM_COST)) => Some(None),
        (false, Some(_)) => None,
    };
    value.map(|value| Action::KubeLabelPod {
        namespace: pod.namespace.clone(),
        pod: pod.name.clone(),
        key: COST_LABEL.to_owned(),
        value,
    })
}

/// Busy from Slurm's side: a job holds it or is finishing on it.
pub(crate) fn slurm_busy(node: &SlurmNode) -> bool {
    matches!(
        node.state,
        SlurmBaseState::Allocated | SlurmBaseState::Mixed
    ) || node.has(&SlurmNodeFlag::Completing)
}

/// In service as Slurm shows it: not drained, DOWN, FAILed or NOT_RESPONDING.
pub(crate) fn slurm_serves(node: &SlurmNode) -> bool {
    node.state != SlurmBaseState::Down
        && !node.has(&SlurmNodeFlag::Drain)
        && !node.has(&SlurmNodeFlag::Fail)
        && !node.has(&SlurmNodeFlag::NotResponding)
}

/// DRAINED in sinfo's sense: DRAIN and nothing running or finishing. Only
/// a drain: a DOWN, whoever set it, may lift by itself (`ReturnToService=2`
/// returns any DOWN node that registers), and a job may start on the node
/// before lockstep sees it, so removing its pod could kill that job.
pub(crate) fn drained(node: &SlurmNode, jobs: u32) -> bool {
    node.has(&SlurmNodeFlag::Drain) && !slurm_busy(node) && jobs == 0
}

/// Desired replicas: busy nodes plus pending demand, within bounds.
pub(crate) fn desired(busy: u32, pending_nodes: u64, min: u32, max: u32) -> u32 {
    let want = u64::from(busy).saturating_add(pending_nodes);
    u32::try_from(want).unwrap_or(u32::MAX).clamp(min, max)
}

/// Victim order: idle first, then fewest running jobs, then newest (the
/// highest ordinal: StatefulSet and NodeSet pods are numbered in creation
/// order), then by name, so the choice is deterministic.
pub(crate) fn victim_order(a: (u32, &str), b: (u32, &str)) -> Ordering {
    let ordinal = |s: &str| {
        let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        s[s.len() - digits..].parse::<u64>().ok()
    };
    a.0.cmp(&b.0)
        .then_with(|| ordinal(b.1).cmp(&ordinal(a.1)))
        .then_with(|| a.1.cmp(b.1))
}

#[cfg(test)]
mod tests;
