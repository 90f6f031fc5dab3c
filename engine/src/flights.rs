//! Actions in flight: one table, one [`Slot`] per target.
//!
//! Every action lockstep issues has a target ([`Target`]): a Slurm node's
//! state, features or topology; a pod's condition, label or existence; a
//! Kubernetes node's taint or condition; a scale target's replica count; a
//! maintenance reservation. The table holds a slot for each target with an
//! action that is not settled yet (sent, done but not yet observed, failed
//! and waiting to retry, given up); a slot that holds nothing is dropped.
//!
//! The table is keyed by target, grouped by the object the target belongs
//! to (its owner), so that a rule looks a slot up by borrowed names without
//! allocating, and an owner's slots are found together:
//!
//! | owner                     | aspects                                   | targets                                        |
//! |---------------------------|-------------------------------------------|------------------------------------------------|
//! | Slurm node                | state, features, topology                 | `SlurmNodeState`, `SlurmNodeFeatures`, `SlurmNodeTopology` |
//! | pod (`namespace/name`)    | condition, label, existence (deletion)    | `PodCondition`, `PodLabel`, `Pod`              |
//! | Kubernetes node           | taint, condition, maintenance reservation | `NodeTaint`, `NodeCondition`, `SlurmReservation` |
//! | scale target              | replica count                             | `Scale`                                        |
//!
//! A maintenance reservation's slot belongs to its Kubernetes node, not to
//! the reservation's name: the name follows the policy's prefix, and one
//! slot per node keeps a renamed reservation from racing the removal of the
//! old one.
//!
//! When the object a slot belongs to goes away (a pod deleted, a Kubernetes
//! node gone, a Slurm node no longer reported, a scale-in victim dropped),
//! its slots are parked ([`Flights::park`]): one whose action is still
//! pending stays until its outcome or its timeout, so that an object made
//! again under the same name takes it back ([`Flights::adopt`]) instead of
//! racing it with a second action; every other is dropped.

use std::collections::{BTreeMap, BTreeSet};

use lockstep_schemas::{
    Action, ActionId, ActionOutcome, ActionPolicy, IssuedAction, ScaleTargetRef, Target, DRAINED,
    DRAIN_IN_PROGRESS,
};
use serde::{Deserialize, Serialize};

use crate::cow::CowMap;
use crate::model::pod_key;
use crate::slot::{Flight, InFlight, Issue, Slot, Step};
use crate::timers::min_wake;
use crate::units::after_ms;

/// What of its owner a slot acts on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum Aspect {
    /// A Slurm node's state (drain, down, resume).
    State,
    /// A Slurm node's features.
    Features,
    /// A Slurm node's topology.
    Topology,
    /// A condition type (of a pod, or of a Kubernetes node).
    Condition(String),
    /// A pod label (an `annotation:` key names an annotation).
    Label(String),
    /// A pod's existence: its deletion.
    Delete,
    /// A taint key on a Kubernetes node.
    Taint(String),
    /// A Kubernetes node's maintenance reservation.
    Reservation,
    /// A pod's eviction: lockstep's response to it.
    Eviction,
}

/// An [`Aspect`] by borrowed name, for look-ups that allocate nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AspectRef<'a> {
    State,
    Features,
    Topology,
    Condition(&'a str),
    Label(&'a str),
    Delete,
    Taint(&'a str),
    Reservation,
    Eviction,
}

impl Aspect {
    /// The slot a target names: its owner, the owner's name and the aspect;
    /// the one place an action's target is read as a slot. `None` for a
    /// scale target (one slot per target, [`Key::Scale`]) and for a
    /// reservation (named by Slurm, kept on the slot of the Kubernetes node
    /// it was made for).
    pub fn of_target(target: &Target) -> Option<(Owner, String, Aspect)> {
        Some(match target {
            Target::SlurmNodeState { node } => (Owner::SlurmNode, node.clone(), Self::State),
            Target::SlurmNodeFeatures { node } => (Owner::SlurmNode, node.clone(), Self::Features),
            Target::SlurmNodeTopology { node } => (Owner::SlurmNode, node.clone(), Self::Topology),
            Target::PodCondition {
                namespace,
                pod,
                condition,
            } => (
                Owner::Pod,
                pod_key(namespace, pod),
                Self::Condition(condition.clone()),
            ),
            Target::PodLabel {
                namespace,
                pod,
                key,
            } => (
                Owner::Pod,
                pod_key(namespace, pod),
                Self::Label(key.clone()),
            ),
            Target::Pod { namespace, pod } => (Owner::Pod, pod_key(namespace, pod), Self::Delete),
            Target::NodeTaint { node, key } => {
                (Owner::KubeNode, node.clone(), Self::Taint(key.clone()))
            }
            Target::NodeCondition { node, condition } => (
                Owner::KubeNode,
                node.clone(),
                Self::Condition(condition.clone()),
            ),
            Target::NodeLabel { node, key } => {
                (Owner::KubeNode, node.clone(), Self::Label(key.clone()))
            }
            Target::PodEviction { namespace, pod } => {
                (Owner::Pod, pod_key(namespace, pod), Self::Eviction)
            }
            Target::SlurmReservation { .. } | Target::Scale { .. } => return None,
        })
    }

    /// A Kubernetes node's aspects that maintenance acts on: its
    /// reservation and its drain conditions.
    pub fn is_maintenance(&self) -> bool {
        match self {
            Self::Reservation => true,
            Self::Condition(c) => c == DRAIN_IN_PROGRESS || c == DRAINED,
            _ => false,
        }
    }

    /// A pod's deletion, which belongs to a scale-in or replacement victim.
    pub fn is_delete(&self) -> bool {
        *self == Self::Delete
    }

    /// A pod's aspects that scaling acts on: its deletion and its
    /// `pod-deletion-cost` annotation.
    pub fn is_scaling(&self) -> bool {
        match self {
            Self::Delete => true,
            Self::Label(l) => l == crate::scaling::COST_LABEL,
            _ => false,
        }
    }

    /// A pod's aspects that live and go with the pod: its conditions and
    /// labels (its deletion belongs to the scale-in victim).
    pub fn shown_on_pod(&self) -> bool {
        matches!(self, Self::Condition(_) | Self::Label(_) | Self::Eviction)
    }

    pub fn as_ref(&self) -> AspectRef<'_> {
        match self {
            Self::State => AspectRef::State,
            Self::Features => AspectRef::Features,
            Self::Topology => AspectRef::Topology,
            Self::Condition(c) => AspectRef::Condition(c),
            Self::Label(l) => AspectRef::Label(l),
            Self::Delete => AspectRef::Delete,
            Self::Taint(t) => AspectRef::Taint(t),
            Self::Reservation => AspectRef::Reservation,
            Self::Eviction => AspectRef::Eviction,
        }
    }
}

impl AspectRef<'_> {
    pub fn to_owned(self) -> Aspect {
        match self {
            Self::State => Aspect::State,
            Self::Features => Aspect::Features,
            Self::Topology => Aspect::Topology,
            Self::Condition(c) => Aspect::Condition(c.to_owned()),
            Self::Label(l) => Aspect::Label(l.to_owned()),
            Self::Delete => Aspect::Delete,
            Self::Taint(t) => Aspect::Taint(t.to_owned()),
            Self::Reservation => Aspect::Reservation,
            Self::Eviction => Aspect::Eviction,
        }
    }
}

/// The kind of object that owns slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Owner {
    SlurmNode,
    Pod,
    KubeNode,
}

/// A target by borrowed names: a slot's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Key<'a> {
    /// A Slurm node's aspect.
    Slurm(&'a str, AspectRef<'a>),
    /// A pod's aspect, by `namespace/name`.
    Pod(&'a str, AspectRef<'a>),
    /// A Kubernetes node's aspect.
    Kube(&'a str, AspectRef<'a>),
    /// A scale target's replica count.
    Scale(&'a ScaleTargetRef),
}

/// A slot and whether its owner is gone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    slot: Slot,
    /// The owner went while the action was pending: kept until the outcome
    /// or the timeout, for an owner made again to adopt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    parked: bool,
}

/// An owner's slots, in the order they were made.
type Slots = Vec<(Aspect, Entry)>;

/// The table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Flights {
    #[serde(default, skip_serializing_if = "CowMap::is_empty")]
    slurm: CowMap<String, Slots>,
    #[serde(default, skip_serializing_if = "CowMap::is_empty")]
    pods: CowMap<String, Slots>,
    #[serde(default, skip_serializing_if = "CowMap::is_empty")]
    kube: CowMap<String, Slots>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    scale: BTreeMap<ScaleTargetRef, Entry>,
    /// The parked slots (derived: rebuilt after a restore).
    #[serde(skip)]
    parked: BTreeSet<(Owner, String, Aspect)>,
}

/// An owned form of [`Key`], for the index of parked slots.
fn owned(key: Key<'_>) -> Option<(Owner, String, Aspect)> {
    match key {
        Key::Slurm(n, a) => Some((Owner::SlurmNode, n.to_owned(), a.to_owned())),
        Key::Pod(p, a) => Some((Owner::Pod, p.to_owned(), a.to_owned())),
        Key::Kube(n, a) => Some((Owner::KubeNode, n.to_owned(), a.to_owned())),
        Key::Scale(_) => None,
    }
}

impl Flights {
    fn shard(&self, owner: Owner) -> &CowMap<String, Slots> {
        match owner {
            Owner::SlurmNode => &self.slurm,
            Owner::Pod => &self.pods,
            Owner::KubeNode => &self.kube,
        }
    }

    fn shard_mut(&mut self, owner: Owner) -> &mut CowMap<String, Slots> {
        match owner {
            Owner::SlurmNode => &mut self.slurm,
            Owner::Pod => &mut self.pods,
            Owner::KubeNode => &mut self.kube,
        }
    }

    fn split(key: Key<'_>) -> Result<(Owner, &str, AspectRef<'_>), &ScaleTargetRef> {
        match key {
            Key::Slurm(n, a) => Ok((Owner::SlurmNode, n, a)),
            Key::Pod(p, a) => Ok((Owner::Pod, p, a)),
            Key::Kube(n, a) => Ok((Owner::KubeNode, n, a)),
            Key::Scale(t) => Err(t),
        }
    }

    fn entry(&self, key: Key<'_>) -> Option<&Entry> {
        match Self::split(key) {
            Ok((owner, name, aspect)) => self
                .shard(owner)
                .get(name)?
                .iter()
                .find(|(a, _)| a.as_ref() == aspect)
                .map(|(_, e)| e),
            Err(t) => self.scale.get(t),
        }
    }

    fn entry_mut(&mut self, key: Key<'_>) -> Option<&mut Entry> {
        match Self::split(key) {
            Ok((owner, name, aspect)) => self
                .shard_mut(owner)
                .get_mut(name)?
                .iter_mut()
                .find(|(a, _)| a.as_ref() == aspect)
                .map(|(_, e)| e),
            Err(t) => self.scale.get_mut(t),
        }
    }

    /// Makes the slot of `key` (empty) if it does not exist.
    fn make(&mut self, key: Key<'_>) -> &mut Entry {
        match Self::split(key) {
            Ok((owner, name, aspect)) => {
                let shard = self.shard_mut(owner);
                if !shard.contains_key(name) {
                    shard.insert(name.to_owned(), Vec::new());
                }
                let slots = shard.get_mut(name).expect("inserted above");
                let i = match slots.iter().position(|(a, _)| a.as_ref() == aspect) {
                    Some(i) => i,
                    None => {
                        // Most owners have one slot for long: a first push
                        // would make room for four.
                        slots.reserve_exact(1);
                        slots.push((aspect.to_owned(), Entry::default()));
                        slots.len() - 1
                    }
                };
                &mut slots[i].1
            }
            Err(t) => self.scale.entry(t.clone()).or_default(),
        }
    }

    /// Drops the slot of `key`.
    fn drop_slot(&mut self, key: Key<'_>) {
        match Self::split(key) {
            Ok((owner, name, aspect)) => {
                let shard = self.shard_mut(owner);
                if let Some(slots) = shard.get_mut(name) {
                    slots.retain(|(a, _)| a.as_ref() != aspect);
                    if slots.is_empty() {
                        shard.remove(name);
                    }
                }
            }
            Err(t) => {
                self.scale.remove(t);
            }
        }
    }

    /// The slot of `key`, if it holds anything.
    pub fn get(&self, key: Key<'_>) -> Option<&Slot> {
        self.entry(key).map(|e| &e.slot)
    }

    /// Whether `key` has a slot: an action of it is not settled.
    pub fn holds(&self, key: Key<'_>) -> bool {
        self.entry(key).is_some()
    }

    /// The action `key`'s slot holds, and how it stands.
    pub fn current(&self, key: Key<'_>) -> Option<&InFlight> {
        self.get(key).and_then(|s| s.current.as_deref())
    }

    /// Whether any slot of an owner has one of these aspects.
    pub fn owner_holds(&self, owner: Owner, name: &str, aspect: impl Fn(&Aspect) -> bool) -> bool {
        self.shard(owner)
            .get(name)
            .is_some_and(|slots| slots.iter().any(|(a, _)| aspect(a)))
    }

    /// lockstep's last drain, down or resume of Slurm node `name` while it
    /// is not settled and not given up: sent, done, or failed and to be
    /// tried again (a failure may be a timeout of an action that took
    /// effect).
    pub fn state_action(&self, name: &str) -> Option<&Action> {
        self.get(Key::Slurm(name, AspectRef::State))
            .and_then(|s| s.current.as_ref())
            .filter(|c| !matches!(c.flight, Flight::GaveUp { .. }))
            .map(|c| &c.action)
    }

    /// Whether no slot of an owner holds anything: one look-up that spares
    /// the evaluation of an object with nothing in flight one per aspect.
    pub fn idle(&self, owner: Owner, name: &str) -> bool {
        !self.shard(owner).contains_key(name)
    }

    /// Brings the slot of `key` in line with what is wanted ([`Slot::reconcile`]):
    /// made when something is wanted, dropped once it holds nothing.
    pub fn reconcile(
        &mut self,
        key: Key<'_>,
        want: Option<Action>,
        issue: &Issue<'_>,
        policy: &ActionPolicy,
        out: &mut Vec<IssuedAction>,
    ) -> (Step, Option<u64>) {
        let entry = match (self.entry_mut(key).is_some(), &want) {
            (true, _) => self.entry_mut(key).expect("checked above"),
            (false, None) => return (Step::Quiet, None),
            (false, Some(_)) => self.make(key),
        };
        let done = entry.slot.reconcile(want, issue, policy, out);
        if entry.slot.current.is_none() {
            self.drop_slot(key);
        }
        done
    }

    /// [`Flights::reconcile`], keeping the earliest time any slot needs
    /// another look in `wake`.
    pub fn bring(
        &mut self,
        key: Key<'_>,
        want: Option<Action>,
        issue: &Issue<'_>,
        policy: &ActionPolicy,
        out: &mut Vec<IssuedAction>,
        wake: &mut Option<u64>,
    ) -> Step {
        let (step, at) = self.reconcile(key, want, issue, policy, out);
        if let Some(at) = at {
            min_wake(wake, at);
        }
        step
    }

    /// Forgets what the slot of `key` holds.
    pub fn clear(&mut self, key: Key<'_>) {
        self.drop_slot(key);
    }

    /// Records an actuator's outcome in the slot of its target. Returns the
    /// owner to look at again (`Some` when the slot changed and its owner is
    /// there), or `None`. A parked slot that is no longer pending is dropped.
    pub fn outcome(
        &mut self,
        o: &ActionOutcome,
        now_ms: u64,
        policy: &ActionPolicy,
    ) -> Option<OwnerOf> {
        let (key_owner, name, aspect) = self.locate(o)?;
        let key = match (&key_owner, &name) {
            (Some(owner), Some(name)) => key_of(*owner, name, &aspect),
            _ => match &o.target {
                Target::Scale { target } => Key::Scale(target),
                _ => return None,
            },
        };
        let entry = self.entry_mut(key)?;
        let changed = entry
            .slot
            .handle_outcome(&o.action_id, &o.result, now_ms, policy);
        if entry.parked {
            if entry.slot.pending().is_none() {
                let parked = owned(key);
                self.drop_slot(key);
                if let Some(p) = parked {
                    self.parked.remove(&p);
                }
            }
            return None;
        }
        if !changed {
            return None;
        }
        Some(match (key_owner, name) {
            (Some(owner), Some(name)) => OwnerOf::Named(owner, name, aspect),
            _ => OwnerOf::Scale,
        })
    }

    /// Where the slot of an outcome's target is: owner, name and aspect
    /// (`None`s for a scale target).
    #[allow(clippy::type_complexity)]
    fn locate(&self, o: &ActionOutcome) -> Option<(Option<Owner>, Option<String>, Aspect)> {
        match Aspect::of_target(&o.target) {
            Some((owner, name, aspect)) => Some((Some(owner), Some(name), aspect)),
            // A reservation's slot is its Kubernetes node's: found by the
            // action it holds.
            None if matches!(o.target, Target::SlurmReservation { .. }) => {
                let (node, _) = self.kube.iter().find(|(_, slots)| {
                    slots.iter().any(|(a, e)| {
                        *a == Aspect::Reservation
                            && e.slot.current.as_ref().is_some_and(|c| c.id == o.action_id)
                    })
                })?;
                Some((
                    Some(Owner::KubeNode),
                    Some(node.clone()),
                    Aspect::Reservation,
                ))
            }
            None => Some((None, None, Aspect::State)),
        }
    }

    /// The owner of `key` went: each of its slots with these aspects whose
    /// action is pending (and not timed out) is parked, every other dropped.
    pub fn park(
        &mut self,
        owner: Owner,
        name: &str,
        aspect: impl Fn(&Aspect) -> bool,
        now: u64,
        timeout_ms: u64,
    ) {
        let alive = |e: &Entry| {
            e.slot
                .pending()
                .is_some_and(|f| now < after_ms(f.issued_ms, timeout_ms))
        };
        // Parked slots whose action timed out are given up on.
        let expired: Vec<(Owner, String, Aspect)> = self
            .parked
            .iter()
            .filter(|(o, n, a)| {
                let key = key_of(*o, n, a);
                self.entry(key).is_none_or(|e| !alive(e))
            })
            .cloned()
            .collect();
        for (o, n, a) in &expired {
            self.drop_slot(key_of(*o, n, a));
            self.parked.remove(&(*o, n.clone(), a.clone()));
        }
        let Some(slots) = self.shard_mut(owner).get_mut(name) else {
            return;
        };
        let mut newly = Vec::new();
        slots.retain_mut(|(a, e)| {
            if !aspect(a) || e.parked {
                return true;
            }
            if alive(e) {
                e.parked = true;
                newly.push(a.clone());
                true
            } else {
                false
            }
        });
        if slots.is_empty() {
            self.shard_mut(owner).remove(name);
        }
        for a in newly {
            self.parked.insert((owner, name.to_owned(), a));
        }
    }

    /// Drops an owner's slots with these aspects, whatever they hold.
    pub fn forget(&mut self, owner: Owner, name: &str, aspect: impl Fn(&Aspect) -> bool) {
        let Some(slots) = self.shard_mut(owner).get_mut(name) else {
            return;
        };
        let mut gone = Vec::new();
        slots.retain(|(a, e)| {
            let keep = !aspect(a);
            if !keep && e.parked {
                gone.push(a.clone());
            }
            keep
        });
        if slots.is_empty() {
            self.shard_mut(owner).remove(name);
        }
        for a in gone {
            self.parked.remove(&(owner, name.to_owned(), a));
        }
    }

    /// An owner is there again: its parked slots with these aspects are its
    /// own again.
    pub fn adopt(&mut self, owner: Owner, name: &str, aspect: impl Fn(&Aspect) -> bool) {
        if self.parked.is_empty() {
            return;
        }
        let Some(slots) = self.shard_mut(owner).get_mut(name) else {
            return;
        };
        let mut adopted = Vec::new();
        for (a, e) in slots.iter_mut() {
            if e.parked && aspect(a) {
                e.parked = false;
                adopted.push(a.clone());
            }
        }
        for a in adopted {
            self.parked.remove(&(owner, name.to_owned(), a));
        }
    }

    /// The names of the owners of a kind with a slot of one of these aspects.
    pub fn owners(&self, owner: Owner, aspect: impl Fn(&Aspect) -> bool) -> Vec<String> {
        self.shard(owner)
            .iter()
            .filter(|(_, slots)| slots.iter().any(|(a, _)| aspect(a)))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Rebuilds the index of parked slots (after a restore).
    /// A copy of what a snapshot holds: the slots (shared, not copied),
    /// not the index of parked ones.
    pub fn frozen(&self) -> Self {
        let Self {
            slurm,
            pods,
            kube,
            scale,
            parked: _,
        } = self;
        Self {
            slurm: slurm.clone(),
            pods: pods.clone(),
            kube: kube.clone(),
            scale: scale.clone(),
            parked: BTreeSet::new(),
        }
    }

    pub fn rebuild(&mut self) {
        self.parked.clear();
        for owner in [Owner::SlurmNode, Owner::Pod, Owner::KubeNode] {
            let parked: Vec<(Owner, String, Aspect)> = self
                .shard(owner)
                .iter()
                .flat_map(|(n, slots)| {
                    slots
                        .iter()
                        .filter(|(_, e)| e.parked)
                        .map(move |(a, _)| (owner, n.clone(), a.clone()))
                })
                .collect();
            self.parked.extend(parked);
        }
    }

    /// Every slot, in no particular order.
    pub fn slots(&self) -> impl Iterator<Item = &Slot> {
        self.slots_of_part(0, 1)
    }

    /// The slots of part `part` of `parts` ([`CowMap::values_of_part`] of
    /// each owner's table; the scale targets' in part 0): over every part,
    /// [`Self::slots`].
    pub fn slots_of_part(&self, part: usize, parts: usize) -> impl Iterator<Item = &Slot> {
        let named = [&self.slurm, &self.pods, &self.kube]
            .into_iter()
            .flat_map(move |shard| {
                shard
                    .values_of_part(part, parts)
                    .flatten()
                    .map(|(_, e)| &e.slot)
            });
        let scale = self.scale.values().filter(move |_| part == 0);
        named.chain(scale.map(|e| &e.slot))
    }

    /// Ids of the actions sent and without an outcome yet, in no particular
    /// order, borrowed: [`Self::pending`] without a copy of each.
    pub fn pending_ids(&self) -> impl Iterator<Item = &ActionId> {
        self.slots().filter_map(Slot::pending).map(|f| &f.id)
    }

    /// Targets with an action sent and no outcome yet.
    pub fn pending(&self) -> Vec<(Target, ActionId)> {
        let mut v: Vec<(Target, ActionId)> = self
            .slots()
            .filter_map(Slot::pending)
            .map(|f| (f.action.target(), f.id.clone()))
            .collect();
        v.sort();
        v
    }
}

/// The owner of a slot whose outcome changed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OwnerOf {
    /// An object and the aspect of it.
    Named(Owner, String, Aspect),
    /// A scale target.
    Scale,
}

fn key_of<'a>(owner: Owner, name: &'a str, aspect: &'a Aspect) -> Key<'a> {
    let aspect = aspect.as_ref();
    match owner {
        Owner::SlurmNode => Key::Slurm(name, aspect),
        Owner::Pod => Key::Pod(name, aspect),
        Owner::KubeNode => Key::Kube(name, aspect),
    }
}

#[cfg(test)]
mod tests {
    use lockstep_schemas::{ActionKind, EventId, OutcomeResult};

    use super::*;

    fn drain(node: &str) -> Action {
        Action::SlurmDrain {
            node: node.into(),
            reason: "lockstep: test".into(),
        }
    }

    fn issue(seq: u64, now_ms: u64, cause: &EventId) -> Issue<'_> {
        Issue {
            seq,
            now_ms,
            cause,
            rule: "test",
        }
    }

    #[test]
    fn made_when_wanted_dropped_when_settled() {
        let p = ActionPolicy::default();
        let cause = EventId("e".into());
        let mut f = Flights::default();
        let mut out = Vec::new();
        let key = Key::Slurm("n1", AspectRef::State);
        f.reconcile(key, None, &issue(1, 0, &cause), &p, &mut out);
        assert!(!f.holds(key));
        f.reconcile(key, Some(drain("n1")), &issue(2, 0, &cause), &p, &mut out);
        assert!(f.holds(key));
        assert_eq!(f.pending().len(), 1);
        let o = ActionOutcome {
            action_id: out[0].id.clone(),
            kind: ActionKind::SlurmDrain,
            target: drain("n1").target(),
            result: OutcomeResult::Succeeded,
        };
        let again = f.outcome(&o, 1, &p);
        assert_eq!(
            again,
            Some(OwnerOf::Named(Owner::SlurmNode, "n1".into(), Aspect::State))
        );
        // Observed drained: settled.
        f.reconcile(key, None, &issue(3, 2, &cause), &p, &mut out);
        assert_eq!(f, Flights::default());
    }

    #[test]
    fn a_pending_slot_outlives_its_owner_until_adopted_or_answered() {
        let p = ActionPolicy::default();
        let timeout = crate::units::ms(p.timeout_s);
        let cause = EventId("e".into());
        let mut f = Flights::default();
        let mut out = Vec::new();
        let key = Key::Pod("ns/p", AspectRef::Condition("SlurmDrained"));
        let set = Action::KubeSetPodCondition {
            namespace: "ns".into(),
            pod: "p".into(),
            condition: lockstep_schemas::PodCondition {
                type_: "SlurmDrained".into(),
                status: lockstep_schemas::ConditionStatus::True,
                reason: "SlurmDrain".into(),
                message: String::new(),
            },
        };
        f.reconcile(key, Some(set.clone()), &issue(1, 0, &cause), &p, &mut out);
        f.park(Owner::Pod, "ns/p", |_| true, 1, timeout);
        assert!(f.holds(key), "pending: parked");
        // Adopted by the pod made again: its own, not parked.
        f.adopt(Owner::Pod, "ns/p", |_| true);
        assert!(f.parked.is_empty());
        // Parked again; its outcome settles it and no owner is woken.
        f.park(Owner::Pod, "ns/p", |_| true, 1, timeout);
        let o = ActionOutcome {
            action_id: out[0].id.clone(),
            kind: ActionKind::KubeSetPodCondition,
            target: Target::PodCondition {
                namespace: "ns".into(),
                pod: "p".into(),
                condition: "SlurmDrained".into(),
            },
            result: OutcomeResult::Succeeded,
        };
        assert_eq!(f.outcome(&o, 2, &p), None);
        assert_eq!(f, Flights::default());
        // One parked past its timeout is dropped at the next park.
        f.reconcile(key, Some(set), &issue(4, 0, &cause), &p, &mut out);
        f.park(Owner::Pod, "ns/p", |_| true, 1, timeout);
        f.park(Owner::Pod, "ns/q", |_| true, timeout, timeout);
        assert_eq!(f, Flights::default());
    }

    #[test]
    fn a_settled_slot_is_dropped_with_its_owner_and_the_index_is_rebuilt() {
        let p = ActionPolicy::default();
        let cause = EventId("e".into());
        let mut f = Flights::default();
        let mut out = Vec::new();
        let key = Key::Slurm("n1", AspectRef::Features);
        let set = Action::SlurmSetFeatures {
            node: "n1".into(),
            features: vec![],
        };
        f.reconcile(key, Some(set), &issue(1, 0, &cause), &p, &mut out);
        let o = ActionOutcome {
            action_id: out[0].id.clone(),
            kind: ActionKind::SlurmSetFeatures,
            target: Target::SlurmNodeFeatures { node: "n1".into() },
            result: OutcomeResult::Succeeded,
        };
        f.outcome(&o, 1, &p);
        f.park(Owner::SlurmNode, "n1", |_| true, 2, 60_000);
        assert_eq!(f, Flights::default(), "done, not pending: dropped");
        f.reconcile(key, Some(drain("n1")), &issue(2, 0, &cause), &p, &mut out);
        f.park(Owner::SlurmNode, "n1", |_| true, 1, 60_000);
        let bytes = rmp_serde::to_vec_named(&f).unwrap();
        let mut back: Flights = rmp_serde::from_slice(&bytes).unwrap();
        back.rebuild();
        assert_eq!(back, f);
    }
}
