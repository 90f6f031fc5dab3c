//! lockstep's actuators as the world carries them out, with the semantics
//! of `connectors/src/slurm/actuator.rs` and `connectors/src/kube/actuator.rs`:
//! read the target first and report `AlreadyDone` if the action already
//! holds; a pod delete carries a UID precondition (a different UID is a
//! final failure, a missing pod is `AlreadyDone`); a missing object is a
//! final failure otherwise. Each action id is carried out at most once.
//! Flaky actuators fail now and then with a retryable error and change
//! nothing.
//!
//! The Slurm actuator reads a node before it drains, resumes or downs it
//! and leaves alone a node that is out (DRAIN, DOWN, FAIL) with a reason
//! that is not lockstep's (`lockstep_schemas::Ownership`, following the
//! policy in force and the prefixes of earlier ones), reporting
//! `Declined { held_by }`; drained with the same reason is `AlreadyDone`,
//! a resume of a node not out too. Otherwise it writes a moment later (`actuator_write_ms`: a GET, then an update;
//! slurmrestd has no conditional write). A resume of a node the read found
//! only drained is an UNDRAIN, which leaves a DOWN set since; one of a node
//! it found DOWN is a RESUME. While slurmrestd does not answer,
//! every Slurm action fails, retryably, and changes nothing.
//!
//! A change lockstep makes is recorded as made by it ([`Actor::Lockstep`]),
//! and the drain rules an administrator relies on are checked at the moment
//! a drain or resume takes effect: lockstep never replaces or lifts a drain
//! someone else set, and never lifts its own drain while the cause it
//! drained for still holds. The actuator reads the node before it writes,
//! so what it replaces or lifts is judged by what held the node at its
//! read, however old the reducer's decision: only a change that lands
//! between the read and the write is a race it could not see. (Whether a
//! cause still held is judged against the decision, within
//! `observation_lag_ms`.)
//!
//! It decides nothing: whether an action should happen is the reducer's
//! business; here it only happens, as it would.

use lockstep_schemas::{
    Action, ActionOutcome, ConditionStatus, Event, OutcomeResult, Ownership, Source, Taint,
};

use super::check::{Property, Violation};
use super::kube::DELETION_COST;
use super::observe::ANNOTATION_PREFIX;
use super::schedule::{LOCKSTEP_USER, NAMESPACE};
use super::{Actor, Ev, Ms, World, EPOCH_MS};

/// What the Slurm actuator reports while slurmrestd does not answer.
const SLURMRESTD_DOWN: &str = "slurmrestd: connection refused";

/// An action the Slurm actuator carries out (through slurmrestd).
fn is_slurm(a: &Action) -> bool {
    matches!(
        a,
        Action::SlurmDrain { .. }
            | Action::SlurmResume { .. }
            | Action::SlurmDown { .. }
            | Action::SlurmSetFeatures { .. }
            | Action::SlurmSetTopology { .. }
            | Action::SlurmReserve { .. }
            | Action::SlurmUnreserve { .. }
    )
}

/// A change of a Slurm node's state, which the actuator reads before it
/// writes.
fn is_node_state(a: &Action) -> bool {
    matches!(
        a,
        Action::SlurmDrain { .. } | Action::SlurmResume { .. } | Action::SlurmDown { .. }
    )
}

/// What the Slurm actuator saw of a node at its read: who held it out. A
/// drain or DOWN at the write is one it saw only if it is the
/// same as at the read (same writer, same time); one set after the read,
/// even within the same millisecond, is the window's race.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeRead {
    drain: Option<(Actor, Ms)>,
    down: Option<(Actor, super::slurm::DownWhy, Ms)>,
}

impl NodeRead {
    fn saw_drain(&self, drain: &(Actor, Ms)) -> bool {
        self.drain.as_ref() == Some(drain)
    }

    fn saw_down(&self, down: &(Actor, super::slurm::DownWhy, Ms)) -> bool {
        self.down.as_ref() == Some(down)
    }

    /// Whether a resume after this read lifts a DOWN too: a node read DOWN
    /// is resumed (`RESUME`), one read only drained is undrained
    /// (`UNDRAIN`, which leaves a DOWN set since).
    fn lifts_down(&self) -> bool {
        self.down.is_some()
    }
}

fn failed(retryable: bool, error: &str) -> OutcomeResult {
    OutcomeResult::Failed {
        retryable,
        error: error.to_owned(),
    }
}

impl World {
    /// An actuator takes up the issued action at `index`. The Slurm
    /// actuator reads the node first and writes after its read
    /// (`Ev::Write`); everything else is read and written at once.
    pub(crate) fn execute(&mut self, index: usize) {
        let issued = self.ls.issued[index].clone();
        if !self.executed.insert(issued.id.0.clone()) {
            return;
        }
        let by = Actor::Lockstep {
            action: issued.id.0.clone(),
            issued_ms: issued.time_ms.saturating_sub(EPOCH_MS),
        };
        let result = if self.setup.flaky_actuators && self.rng.chance(5) {
            failed(true, "timeout")
        } else if is_slurm(&issued.action) && self.slurm.restd_down {
            failed(true, SLURMRESTD_DOWN)
        } else if is_node_state(&issued.action) {
            match self.read_node(&issued.action) {
                Some(result) => result,
                None => {
                    let lat = self.rng.between(self.cfg.actuator_write_ms);
                    let read = Box::new(self.node_read(&issued.action));
                    self.at(lat, Ev::Write { index, read });
                    return;
                }
            }
        } else {
            self.carry_out(&issued.action, &by)
        };
        self.outcome(index, result);
    }

    fn outcome(&mut self, index: usize, result: OutcomeResult) {
        let issued = &self.ls.issued[index];
        let outcome = ActionOutcome {
            action_id: issued.id.clone(),
            kind: issued.action.kind(),
            target: issued.action.target(),
            result,
        };
        self.append(Source::Actuator, Event::ActionOutcome(outcome));
    }

    /// The Slurm actuator's read of a node before a drain, resume or down:
    /// an outcome if it need not write, `None` if it writes.
    fn read_node(&self, action: &Action) -> Option<OutcomeResult> {
        let (Action::SlurmDrain { node, .. }
        | Action::SlurmResume { node }
        | Action::SlurmDown { node, .. }) = action
        else {
            unreachable!("only node state is read first")
        };
        let Some(n) = self.slurm.nodes.get(node) else {
            return Some(failed(false, "invalid node name specified"));
        };
        let reason = n.reason.as_ref().map(|r| r.0.as_str());
        let seen = super::observe::slurm_node(n, 0);
        let ownership = Ownership {
            prefix: &self.policy.drain.reason_prefix,
            earlier_prefixes: &self.earlier_prefixes,
            slurm_user: self.policy.drain.slurm_user.as_deref(),
        };
        // Out (DRAIN, DOWN, FAIL) with a reason lockstep did not set: left
        // alone, whatever the action.
        if ownership.held_by_other(&seen) {
            return Some(OutcomeResult::Declined {
                held_by: Ownership::describe_holder(&seen),
            });
        }
        match action {
            Action::SlurmDrain { reason: want, .. }
                if n.drain.is_some() && reason == Some(want.as_str()) =>
            {
                Some(OutcomeResult::AlreadyDone)
            }
            Action::SlurmDown { reason: want, .. }
                if n.down.is_some() && reason == Some(want.as_str()) =>
            {
                Some(OutcomeResult::AlreadyDone)
            }
            Action::SlurmResume { .. } if n.drain.is_none() && n.down.is_none() => {
                Some(OutcomeResult::AlreadyDone)
            }
            // Out with lockstep's own reason, or not out: the write
            // replaces only lockstep's reason.
            _ => None,
        }
    }

    /// What the Slurm actuator sees of the node of `action` now.
    fn node_read(&self, action: &Action) -> NodeRead {
        let (Action::SlurmDrain { node, .. }
        | Action::SlurmResume { node }
        | Action::SlurmDown { node, .. }) = action
        else {
            unreachable!("only node state is read first")
        };
        let n = self.slurm.nodes.get(node);
        NodeRead {
            drain: n.and_then(|n| n.drain.clone()),
            down: n.and_then(|n| n.down.clone()),
        }
    }

    /// The Slurm actuator writes what it read the node for.
    pub(crate) fn write(&mut self, index: usize, read: &NodeRead) {
        let issued = self.ls.issued[index].clone();
        let issued_ms = issued.time_ms.saturating_sub(EPOCH_MS);
        let by = Actor::Lockstep {
            action: issued.id.0.clone(),
            issued_ms,
        };
        let result = if self.slurm.restd_down {
            failed(true, SLURMRESTD_DOWN)
        } else {
            self.write_node(&issued.action, &by, read, issued_ms)
        };
        self.outcome(index, result);
    }

    fn write_node(
        &mut self,
        action: &Action,
        by: &Actor,
        read: &NodeRead,
        issued_ms: Ms,
    ) -> OutcomeResult {
        match action {
            Action::SlurmDrain { node, reason } => {
                if !self.slurm.nodes.contains_key(node) {
                    return failed(false, "invalid node name specified");
                }
                self.check_replace(node, reason, read);
                let n = &self.slurm.nodes[node];
                let covered = match &n.drain {
                    Some((who, at)) if !who.is_lockstep() => {
                        Some((who.clone(), *at, read.saw_drain(&(who.clone(), *at))))
                    }
                    _ => n.covers_foreign.clone(),
                };
                self.drain_node(node, reason, LOCKSTEP_USER, by);
                let n = self.slurm.nodes.get_mut(node).expect("drained");
                n.covers_foreign = covered;
                // A DOWN set between the actuator's read and its write now
                // carries lockstep's reason: from then on nothing tells it
                // from lockstep's own (Slurm has no conditional write), so
                // what follows from it is the race's, not a rule's.
                if let Some(down) = &mut n.down {
                    if !down.0.is_lockstep() && !read.saw_down(down) {
                        down.0 = by.clone();
                    }
                }
                OutcomeResult::Succeeded
            }
            Action::SlurmResume { node } => {
                let Some(n) = self.slurm.nodes.get(node) else {
                    return failed(false, "invalid node name specified");
                };
                if n.drain.is_none() && n.down.is_none() {
                    return OutcomeResult::AlreadyDone;
                }
                // A node the read found DOWN is resumed (RESUME lifts the
                // DOWN and the drain); one it found only drained is
                // undrained (UNDRAIN: a DOWN set since stays).
                self.check_resume(node, read, issued_ms);
                if read.lifts_down() {
                    self.resume_node(node);
                } else {
                    self.undrain_node(node);
                }
                OutcomeResult::Succeeded
            }
            Action::SlurmDown { node, reason } => {
                if !self.slurm.nodes.contains_key(node) {
                    return failed(false, "invalid node name specified");
                }
                self.check_replace(node, reason, read);
                self.down_node(node, reason, LOCKSTEP_USER, by, None);
                OutcomeResult::Succeeded
            }
            _ => unreachable!("only node state is written after a read"),
        }
    }

    /// lockstep replaces a node's reason: someone else's drain or DOWN
    /// that was there when the actuator read the node is theirs to keep.
    fn check_replace(&mut self, node: &str, reason: &str, read: &NodeRead) {
        let n = &self.slurm.nodes[node];
        let old = n
            .reason
            .as_ref()
            .map(|r| format!("{:?} by {}", r.0, r.1))
            .unwrap_or_default();
        let mut held = Vec::new();
        if let Some(drain @ (who, _)) = &n.drain {
            if !who.is_lockstep() && read.saw_drain(drain) {
                held.push(format!("the drain {who} set"));
            }
        }
        if let Some(down @ (who, why, _)) = &n.down {
            if *why == super::slurm::DownWhy::Explicit && !who.is_lockstep() && read.saw_down(down)
            {
                held.push(format!("the DOWN {who} set"));
            }
        }
        for what in held {
            let msg =
                format!("lockstep replaced {what} on {node} ({old}) with its own ({reason:?})");
            self.violation(Property::ForeignDrainsUntouched, msg);
        }
    }

    fn violation(&mut self, property: Property, message: String) {
        self.facts.violations.push(Violation {
            property,
            at_ms: self.now,
            message,
        });
    }

    fn carry_out(&mut self, action: &Action, by: &Actor) -> OutcomeResult {
        let Actor::Lockstep { issued_ms, .. } = by else {
            unreachable!("actuators act for lockstep")
        };
        let issued_ms = *issued_ms;
        match action {
            // This world announces no maintenance and requests no eviction,
            // and its policies turn neither the maintenance policy nor the
            // node signals' conditions nor the eviction responder on: such
            // an action is unwanted.
            Action::SlurmReserve { .. }
            | Action::SlurmUnreserve { .. }
            | Action::KubeSetNodeCondition { .. }
            | Action::KubeRespondEviction { .. } => {
                let msg = format!(
                    "lockstep acted on maintenance or node signals nobody asked for: {}",
                    action.describe()
                );
                self.violation(Property::NothingUnwantedSet, msg);
                failed(false, "no such object in this world")
            }
            Action::SlurmDrain { .. } | Action::SlurmResume { .. } | Action::SlurmDown { .. } => {
                unreachable!("node state is read, then written (`write`)")
            }
            Action::SlurmSetFeatures { node, features } => {
                let Some(n) = self.slurm.nodes.get_mut(node) else {
                    return failed(false, "invalid node name specified");
                };
                let mut want = features.clone();
                want.sort();
                want.dedup();
                if n.features == want {
                    return OutcomeResult::AlreadyDone;
                }
                n.features = want;
                self.slurm_changed();
                OutcomeResult::Succeeded
            }
            Action::SlurmSetTopology { node, topology } => {
                let Some(n) = self.slurm.nodes.get_mut(node) else {
                    return failed(false, "invalid node name specified");
                };
                if n.topology.as_deref() == Some(topology) {
                    return OutcomeResult::AlreadyDone;
                }
                n.topology = Some(topology.clone());
                self.slurm_changed();
                OutcomeResult::Succeeded
            }
            Action::KubeSetPodCondition {
                namespace,
                pod,
                condition,
            } => {
                let Some(p) = self.pod_in(namespace, pod) else {
                    return failed(false, "pod not found");
                };
                if let Some((c, _)) = p.conditions.get(&condition.type_) {
                    if c == condition {
                        return OutcomeResult::AlreadyDone;
                    }
                }
                let p = self.kube.pods.get_mut(pod).expect("found");
                p.conditions
                    .insert(condition.type_.clone(), (condition.clone(), by.clone()));
                self.pod_written(pod);
                OutcomeResult::Succeeded
            }
            Action::KubeTaintNode { node, taint } => {
                if !self.kube.nodes.contains_key(node) {
                    return failed(false, "node not found");
                }
                self.check_taint(node, taint, issued_ms);
                let n = self.kube.nodes.get_mut(node).expect("checked");
                let same: Vec<&Taint> = n
                    .taints
                    .iter()
                    .filter(|(t, _)| t.key == taint.key)
                    .map(|(t, _)| t)
                    .collect();
                if same.len() == 1 && same[0] == taint {
                    return OutcomeResult::AlreadyDone;
                }
                n.taints.retain(|(t, _)| t.key != taint.key);
                n.taints.push((taint.clone(), by.clone()));
                self.node_written(node);
                OutcomeResult::Succeeded
            }
            // The only node metadata lockstep writes here: the annotation
            // naming the node's Slurm nodes (`annotation:<key>`), a JSON merge
            // patch of `metadata.annotations`.
            Action::KubeLabelNode { node, key, value } => {
                let Some(key) = key.strip_prefix(ANNOTATION_PREFIX) else {
                    let msg = format!("lockstep set a node label: {}", action.describe());
                    self.violation(Property::NothingUnwantedSet, msg);
                    return failed(false, "no node labels in this world");
                };
                let Some(n) = self.kube.nodes.get_mut(node) else {
                    return failed(false, "node not found");
                };
                if n.annotations.get(key).map(|(v, _)| v) == value.as_ref() {
                    return OutcomeResult::AlreadyDone;
                }
                match value {
                    Some(v) => {
                        n.annotations
                            .insert(key.to_owned(), (v.clone(), by.clone()));
                    }
                    None => {
                        n.annotations.remove(key);
                    }
                }
                self.node_written(node);
                OutcomeResult::Succeeded
            }
            Action::KubeUntaintNode { node, key } => {
                let Some(n) = self.kube.nodes.get_mut(node) else {
                    return failed(false, "node not found");
                };
                if !n.taints.iter().any(|(t, _)| &t.key == key) {
                    return OutcomeResult::AlreadyDone;
                }
                n.taints.retain(|(t, _)| &t.key != key);
                self.node_written(node);
                OutcomeResult::Succeeded
            }
            Action::KubeLabelPod {
                namespace,
                pod,
                key,
                value,
            } => {
                let Some(p) = self.pod_in(namespace, pod) else {
                    return failed(false, "pod not found");
                };
                // `annotation:<key>` is an annotation (the pod deletion cost).
                let (annotation, key) = match key.strip_prefix(ANNOTATION_PREFIX) {
                    Some(k) => (true, k),
                    None => (false, key.as_str()),
                };
                let map = if annotation {
                    &p.annotations
                } else {
                    &p.labels
                };
                if map.get(key).map(|(v, _)| v) == value.as_ref() {
                    return OutcomeResult::AlreadyDone;
                }
                if annotation
                    && key == DELETION_COST
                    && value.as_ref().is_some_and(|v| v.parse::<i32>().is_err())
                {
                    return failed(false, "pod-deletion-cost must be an int32");
                }
                let p = self.kube.pods.get_mut(pod).expect("found");
                let map = if annotation {
                    &mut p.annotations
                } else {
                    &mut p.labels
                };
                match value {
                    Some(v) => {
                        map.insert(key.to_owned(), (v.clone(), by.clone()));
                    }
                    None => {
                        map.remove(key);
                    }
                }
                self.pod_written(pod);
                OutcomeResult::Succeeded
            }
            Action::KubeDeletePod {
                namespace,
                pod,
                uid,
            } => {
                let Some(p) = self.pod_in(namespace, pod) else {
                    return OutcomeResult::AlreadyDone;
                };
                if &p.uid != uid {
                    return failed(false, "uid precondition failed");
                }
                if p.deletion.is_some() {
                    return OutcomeResult::AlreadyDone;
                }
                self.delete_pod(pod, by);
                OutcomeResult::Succeeded
            }
            Action::KubeScale { target, replicas } => {
                let Some(set) = self
                    .kube
                    .sets
                    .iter()
                    .position(|w| super::observe::target_ref(w) == *target)
                else {
                    return failed(false, "scale target not found");
                };
                if self.kube.sets[set].replicas == *replicas {
                    return OutcomeResult::AlreadyDone;
                }
                self.kube.sets[set].replicas = *replicas;
                self.kube.sets[set].replicas_by = by.clone();
                self.set_written(set);
                OutcomeResult::Succeeded
            }
        }
    }

    /// lockstep's unhealthy taint goes only on a node one of whose Slurm
    /// nodes is (or was, as far as lockstep could see) DOWN or
    /// NOT_RESPONDING: a blip on one node taints that node, not the cluster.
    fn check_taint(&mut self, node: &str, taint: &Taint, issued_ms: Ms) {
        let Some(spec) = &self.policy.health.unhealthy_taint else {
            return;
        };
        if spec.key != taint.key || self.policy_edited_since(issued_ms) {
            return;
        }
        let since = issued_ms.saturating_sub(self.cfg.observation_lag_ms);
        // Pods on the node now, or removed from it since lockstep last
        // looked.
        let on_node = self
            .kube
            .pods
            .values()
            .filter(|p| p.node.as_deref() == Some(node))
            .map(|p| &p.name)
            .chain(
                self.kube
                    .removed_from
                    .iter()
                    .filter(|(_, n, at)| n == node && *at >= since)
                    .map(|(pod, _, _)| pod),
            );
        let wanted = on_node
            .filter_map(|pod| self.slurm.nodes.get(pod))
            .any(|n| n.unhealthy_since(since));
        if !wanted {
            let unhealthy: Vec<&str> = self
                .slurm
                .nodes
                .values()
                .filter(|n| n.unhealthy_since(since))
                .map(|n| n.name.as_str())
                .collect();
            let msg = format!(
                "lockstep tainted {node} {} although none of its Slurm nodes was DOWN or NOT_RESPONDING (unhealthy elsewhere: {unhealthy:?})",
                taint.key
            );
            self.violation(Property::NothingUnwantedSet, msg);
        }
    }

    fn policy_edited_since(&self, issued_ms: Ms) -> bool {
        self.facts
            .policy_edits_ms
            .iter()
            .any(|&t| t + self.cfg.observation_lag_ms >= issued_ms)
    }

    fn pod_in(&self, namespace: &str, pod: &str) -> Option<&super::kube::Pod> {
        (namespace == NAMESPACE)
            .then(|| self.kube.pods.get(pod))
            .flatten()
    }

    /// The drain rules a resume must keep (see the module doc): what held
    /// the node when the actuator read it (`read`) is what it lifts.
    fn check_resume(&mut self, node: &str, read: &NodeRead, issued_ms: Ms) {
        let n = &self.slurm.nodes[node];
        let mut foreign = Vec::new();
        if let Some(drain @ (who, _)) = &n.drain {
            if !who.is_lockstep() && read.saw_drain(drain) {
                foreign.push(format!("the drain {who} set"));
            }
        }
        if let Some(down @ (who, why, _)) = n.down.as_ref().filter(|_| read.lifts_down()) {
            // A DOWN slurmctld set for not responding is lifted by Slurm
            // itself when slurmd registers again (ReturnToService 1 or 2);
            // a DOWN anyone else set is theirs.
            if *why == super::slurm::DownWhy::Explicit && !who.is_lockstep() && read.saw_down(down)
            {
                foreign.push(format!("the DOWN {who} set"));
            }
        }
        if let Some((who, _, seen)) = &n.covers_foreign {
            if *seen {
                foreign.push(format!(
                    "the drain {who} had set before lockstep drained over it"
                ));
            }
        }
        let reason = n
            .reason
            .as_ref()
            .map(|r| format!("{:?} by {}", r.0, r.1))
            .unwrap_or_default();
        let own = n.drain.as_ref().is_some_and(|(w, _)| w.is_lockstep());
        for what in foreign {
            let msg = format!("lockstep resumed {node} and lifted {what} ({reason})");
            self.violation(Property::ForeignDrainsUntouched, msg);
        }
        if own {
            let causes =
                self.causes_held_since(node, issued_ms.saturating_sub(self.cfg.observation_lag_ms));
            if !causes.is_empty() {
                let msg = format!(
                    "lockstep resumed its drain on {node} ({reason}) while {}",
                    causes.join(" and ")
                );
                self.violation(Property::DrainHeldWhileCauseHolds, msg);
            }
        }
    }

    /// The causes to drain `node` that have held without a break since
    /// `since` (and still hold), under the policy in force. Empty if the
    /// policy changed since then.
    pub(crate) fn causes_held_since(&self, node: &str, since: Ms) -> Vec<String> {
        if self
            .facts
            .policy_edits_ms
            .iter()
            .any(|&t| t + self.cfg.observation_lag_ms >= since)
        {
            return Vec::new();
        }
        let p = &self.policy;
        let grace = p.health.not_ready_grace_s * 1000;
        let mut out = Vec::new();
        if let Some(&t) = self.kube.pod_down_since.get(node) {
            if t <= since {
                out.push(match self.kube.pods.get(node) {
                    None => format!("its pod has been gone since {}", secs(t)),
                    Some(pod) if pod.deletion.is_some() => {
                        format!("its pod has been terminating since {}", secs(t))
                    }
                    Some(pod) => format!(
                        "its pod has not been Running since {} (phase {:?})",
                        secs(t),
                        pod.phase
                    ),
                });
            }
        }
        let Some(pod) = self.kube.pods.get(node) else {
            return out;
        };
        let Some(host) = &pod.node else {
            return out;
        };
        if let Some(&(t, _)) = self.kube.deleted_nodes.get(host) {
            if t.max(pod.bound_ms) <= since {
                out.push(format!(
                    "its Kubernetes node {host} has been deleted since {}",
                    secs(t)
                ));
            }
        }
        let Some(n) = self.kube.nodes.get(host) else {
            return out;
        };
        if p.drain.on_cordon && n.unschedulable && n.cordoned_since.max(pod.bound_ms) <= since {
            out.push(format!(
                "{host} has been cordoned since {}",
                secs(n.cordoned_since)
            ));
        }
        // A cause of the host's is the Slurm node's only since its pod is
        // bound there.
        if let Some(t) = n.not_ready_since {
            if (t + grace).max(pod.bound_ms) <= since {
                out.push(format!("{host} has not been Ready since {}", secs(t)));
            }
        }
        for c in &p.health.node_conditions {
            if let Some((ConditionStatus::True, t)) = n.conditions.get(c) {
                if (t + grace).max(pod.bound_ms) <= since {
                    out.push(format!("{host} has had {c}=True since {}", secs(*t)));
                }
            }
        }
        out
    }
}

fn secs(ms: Ms) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}
