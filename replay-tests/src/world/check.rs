//! The properties an administrator expects of lockstep, judged on the world
//! (what really happened to jobs, drains, pods and nodes), not on what the
//! reducer believes.
//!
//! Online (checked as the world runs, see `actuate`): lockstep never
//! replaces or lifts a drain it did not set ([`Property::ForeignDrainsUntouched`]),
//! never lifts its own drain while the cause it drained for has held all
//! along ([`Property::DrainHeldWhileCauseHolds`]), and puts its unhealthy
//! taint only on a node with an unhealthy Slurm node
//! ([`Property::NothingUnwantedSet`]).
//!
//! After the run: no job was killed by anything lockstep did, directly or
//! through a controller; once the world has been quiet for
//! `WorldConfig::quiet_ms`, no drain lockstep set outlives its cause, every
//! slot of every set is usable unless the world holds it out, the scaled
//! set has the replicas its demand asks for, nothing lockstep set is
//! left that the policy in force does not want, and nothing is out of
//! service whose causes all ended ([`Property::NothingOutOnceCausesEnd`]);
//! lockstep does not flip-flop a node's reason with another actor
//! ([`Property::NoReasonFlipFlop`], online); a stale or duplicate
//! observation appended to the log changes no decision; the same schedule
//! gives the same log and state hash.
//!
//! It must never weaken a property to fit the reducer: an allowance exists
//! only for what lockstep could not have known (a change made within
//! `observation_lag_ms` of its decision).

use std::collections::BTreeMap;

use lockstep_engine::{Engine, Output};
use lockstep_schemas::{
    ConditionStatus, Envelope, Event, EventRecord, IssuedAction, Record, SlurmBaseState,
    SlurmJobState, Taint, TaintEffect,
};
use serde::{Deserialize, Serialize};

use super::kube::{Host, Pod, WorkloadKind, DELETION_COST};
use super::schedule::Schedule;
use super::slurm::{DownWhy, SNode};
use super::{Actor, Ms, World, WorldConfig};

/// A property of the world under lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Property {
    /// No job is killed by anything lockstep did, directly or through a controller.
    NoJobKilledByLockstep,
    /// lockstep never replaces or lifts a drain (or DOWN) someone else set.
    ForeignDrainsUntouched,
    /// lockstep never lifts its drain while the cause it drained for still holds.
    DrainHeldWhileCauseHolds,
    /// Once the world is quiet, no drain lockstep set outlives its cause.
    NoDrainOutlivesCause,
    /// Once the world is quiet, usable Slurm nodes are what the policy asks.
    UsableNodesConverge,
    /// Nothing lockstep set remains that the policy in force does not want.
    NoLeftovers,
    /// lockstep sets no mark the policy does not want when it sets it (its
    /// unhealthy taint only on a node with an unhealthy Slurm node).
    NothingUnwantedSet,
    /// A stale or duplicate observation appended to the log changes nothing.
    StaleObservationChangesNothing,
    /// The same schedule gives the same log and state hash.
    Deterministic,
    /// lockstep and another actor (an administrator, Slinky) do not take a
    /// node's reason from each other back and forth: in one spell out of
    /// service lockstep takes over somebody else's reason at most once (even
    /// in a race) and changes the reason a bounded number of times.
    NoReasonFlipFlop,
    /// Once the world is quiet, a Slurm node whose every cause ended and
    /// that nobody else holds is in service: beside lockstep's drains
    /// ([`Property::NoDrainOutlivesCause`]), no DOWN lockstep set outlives
    /// its cause.
    NothingOutOnceCausesEnd,
}

impl Property {
    /// Every property.
    pub const ALL: [Property; 11] = [
        Self::NoJobKilledByLockstep,
        Self::ForeignDrainsUntouched,
        Self::DrainHeldWhileCauseHolds,
        Self::NoDrainOutlivesCause,
        Self::UsableNodesConverge,
        Self::NoLeftovers,
        Self::NothingUnwantedSet,
        Self::StaleObservationChangesNothing,
        Self::Deterministic,
        Self::NoReasonFlipFlop,
        Self::NothingOutOnceCausesEnd,
    ];

    /// The wire name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::NoJobKilledByLockstep => "no_job_killed_by_lockstep",
            Self::ForeignDrainsUntouched => "foreign_drains_untouched",
            Self::DrainHeldWhileCauseHolds => "drain_held_while_cause_holds",
            Self::NoDrainOutlivesCause => "no_drain_outlives_cause",
            Self::UsableNodesConverge => "usable_nodes_converge",
            Self::NoLeftovers => "no_leftovers",
            Self::NothingUnwantedSet => "nothing_unwanted_set",
            Self::StaleObservationChangesNothing => "stale_observation_changes_nothing",
            Self::Deterministic => "deterministic",
            Self::NoReasonFlipFlop => "no_reason_flip_flop",
            Self::NothingOutOnceCausesEnd => "nothing_out_once_causes_end",
        }
    }
}

impl std::fmt::Display for Property {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One broken property.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Which property.
    pub property: Property,
    /// When (virtual ms) it was seen.
    pub at_ms: Ms,
    /// What happened.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at {:.1} s: {}",
            self.property,
            self.at_ms as f64 / 1000.0,
            self.message
        )
    }
}

/// What checking one schedule found.
pub struct Report {
    /// Broken properties (at most a few per property).
    pub violations: Vec<Violation>,
    /// Steps of the schedule that ran.
    pub steps: usize,
    /// World events processed.
    pub world_events: u64,
    /// Records in lockstep's log.
    pub records: usize,
    /// The world at the end of the first run.
    pub world: World,
}

/// How thoroughly [`check_with`] checks determinism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Determinism {
    /// Fold the log again in a fresh reducer: same log, same state hash and
    /// actions (what lockstep promises; cheap).
    Replay,
    /// Also run the whole world again: same schedule, same log (what the
    /// model promises; twice the cost).
    RerunWorld,
}

/// Runs a schedule and checks every property (determinism by replay).
pub fn check(schedule: &Schedule) -> Report {
    check_with(schedule, &WorldConfig::default(), Determinism::Replay)
}

/// [`check`] with a given world configuration and determinism check.
pub fn check_with(schedule: &Schedule, cfg: &WorldConfig, determinism: Determinism) -> Report {
    let world = World::new(schedule, cfg.clone()).run();
    let mut v = world.facts.violations.clone();
    v.extend(job_kills(&world));
    v.extend(end_state(&world));
    v.extend(stale(&world));
    v.extend(replay(&world));
    let mut world_events = world.facts.world_events;
    if determinism == Determinism::RerunWorld {
        let again = World::new(schedule, cfg.clone()).run();
        world_events += again.facts.world_events;
        v.extend(rerun(&world, &again));
    }
    // Two of each story say it; hundreds would bury the others.
    let mut per: BTreeMap<(Property, String), usize> = BTreeMap::new();
    v.retain(|x| {
        let n = per.entry((x.property, shape(&x.message))).or_default();
        *n += 1;
        *n <= 2
    });
    Report {
        violations: v,
        steps: world.facts.steps_done,
        world_events,
        records: world.ls.records.len(),
        world,
    }
}

/// The shape of a violation's story: the message without its quoted and
/// parenthesised details, names and numbers blanked (so that `cpu-3 still
/// carries lockstep's drain ("...")` and `gpu-0 still carries lockstep's
/// drain ("...")` are the same story, and a resume while a node is deleted
/// is not the same as one while a pod is Pending).
pub fn shape(message: &str) -> String {
    let mut plain = String::new();
    let (mut depth, mut quoted) = (0u32, false);
    for c in message.chars() {
        match c {
            '"' => quoted = !quoted,
            '(' | '[' if !quoted => depth += 1,
            ')' | ']' if !quoted => depth = depth.saturating_sub(1),
            _ if quoted || depth > 0 => {}
            _ => plain.push(c),
        }
    }
    plain
        .split_whitespace()
        .map(|w| {
            if w.chars().any(|c| c.is_ascii_digit()) {
                "#"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn job_kills(w: &World) -> Vec<Violation> {
    let lag = w.cfg.observation_lag_ms;
    let mut out = Vec::new();
    for k in &w.facts.job_kills {
        let Actor::Lockstep { issued_ms, action } = &k.by else {
            continue;
        };
        // A race lockstep could not see: an administrator resumed the node
        // after lockstep decided, and the job started too late for
        // lockstep to stop what it had started.
        let admin_resumed = w
            .slurm
            .admin_resumes
            .iter()
            .any(|(n, t)| *n == k.node && *t + lag >= *issued_ms && *t <= k.at_ms);
        if admin_resumed && k.started_ms + lag >= k.cause_ms {
            continue;
        }
        out.push(Violation {
            property: Property::NoJobKilledByLockstep,
            at_ms: k.at_ms,
            message: format!(
                "job {} (started at {:.1} s) on {} was killed: {} (lockstep action {action}, issued at {:.1} s)",
                k.job,
                k.started_ms as f64 / 1000.0,
                k.node,
                k.how,
                *issued_ms as f64 / 1000.0
            ),
        });
    }
    out
}

/// Why the world wants `node` drained now (under the policy in force),
/// ignoring how long it has.
fn drain_causes(w: &World, node: &str) -> Vec<String> {
    let p = &w.policy;
    let mut out = Vec::new();
    let Some(pod) = w.kube.pods.get(node) else {
        return vec!["its pod is gone".to_owned()];
    };
    if !pod.up() {
        out.push(format!(
            "its pod is not up ({:?}{})",
            pod.phase,
            if pod.deletion.is_some() {
                ", terminating"
            } else {
                ""
            }
        ));
    }
    if let (Some(ord), WorkloadKind::StatefulSet { .. }) = (pod.ordinal, w.kube.sets[pod.set].kind)
    {
        if ord >= w.kube.sets[pod.set].replicas {
            out.push("its pod is condemned by a StatefulSet scale-down".to_owned());
        }
    }
    if let Some(host) = &pod.node {
        match w.kube.nodes.get(host) {
            None => out.push(format!("its Kubernetes node {host} is deleted")),
            Some(n) => {
                if p.drain.on_cordon && n.unschedulable {
                    out.push(format!("{host} is cordoned"));
                }
                if n.ready != ConditionStatus::True {
                    out.push(format!("{host} is Ready={:?}", n.ready));
                }
                for c in &p.health.node_conditions {
                    if n.conditions.get(c).map(|c| c.0) == Some(ConditionStatus::True) {
                        out.push(format!("{host} has {c}=True"));
                    }
                }
            }
        }
    }
    out
}

/// A drain (or an explicit DOWN) someone other than lockstep set: what
/// the foreign-drain condition and taint show.
fn foreign_drain(n: &SNode) -> bool {
    n.drain.as_ref().is_some_and(|(who, _)| !who.is_lockstep())
        || n.down
            .as_ref()
            .is_some_and(|(who, why, _)| *why == DownWhy::Explicit && !who.is_lockstep())
}

/// A Slurm node's drain or DOWN set by someone other than lockstep.
fn foreign_out(n: &SNode) -> Option<String> {
    if let Some((who, _)) = &n.drain {
        if !who.is_lockstep() {
            return Some(format!("drained by {who}"));
        }
    }
    if let Some((who, why, _)) = &n.down {
        if !who.is_lockstep() {
            return Some(format!("DOWN ({why:?}) by {who}"));
        }
    }
    None
}

fn slurm_healthy(n: &SNode) -> bool {
    n.base != SlurmBaseState::Down && !n.not_responding
}

/// What the policy asks of the scaled set: demand, and the replicas it
/// wants for it.
fn wanted_replicas(w: &World) -> (u32, u32) {
    let wl = &w.kube.sets[0];
    let rule = &w.policy.scaling.targets[0];
    let demand: u32 = w
        .slurm
        .jobs
        .values()
        .filter(|j| j.partition == wl.partition)
        .filter(|j| j.state == SlurmJobState::Pending || j.state.holds_nodes())
        .map(|j| j.node_count)
        .sum();
    (demand, demand.clamp(rule.min_replicas, rule.max_replicas))
}

/// Victims of a ReplicaSet scale-in that waits on the world: lockstep
/// lowers `replicas` of a target scaled in by deletion cost only while
/// every other pod is Running and Ready, so while a pod is held out by the
/// world, up to (replicas - wanted) idle, DRAINED pods (the victims, given
/// the lowest deletion cost) may wait. Name -> what they wait for.
fn waiting_victims(w: &World) -> BTreeMap<String, String> {
    let wl = &w.kube.sets[0];
    let mut out = BTreeMap::new();
    if wl.kind != WorkloadKind::ReplicaSet {
        return out;
    }
    let (_, want) = wanted_replicas(w);
    // What the scale-in waits for: a pod not Running, Ready and undeleted,
    // held so by the world.
    let blocker = w
        .kube
        .pods_of(0)
        .find(|p| !(p.up() && p.ready) && matches!(slot_state(w, Some(p)), Slot::Out(_)))
        .map(|p| p.name.clone());
    let Some(blocker) = blocker else {
        return out;
    };
    let extra = wl.replicas.saturating_sub(want) as usize;
    // The controller takes the lowest deletion cost first.
    let mut candidates: Vec<&Pod> = w.kube.pods_of(0).collect();
    candidates.sort_by_key(|p| (p.deletion_cost(), p.name.clone()));
    for p in candidates {
        if out.len() >= extra {
            break;
        }
        // A victim is DRAINED; whoever drained it (an idle node an
        // administrator drained is as good a victim as any).
        let idle_and_drained = w
            .slurm
            .nodes
            .get(&p.name)
            .is_some_and(|n| n.jobs.is_empty() && n.drain.is_some());
        if p.up() && p.ready && idle_and_drained {
            out.insert(
                p.name.clone(),
                format!("a scale-in victim waiting for {blocker}"),
            );
        }
    }
    out
}

fn end_state(w: &World) -> Vec<Violation> {
    let at_ms = w.end_ms();
    let mut out = Vec::new();
    let mut say = |property, message| {
        out.push(Violation {
            property,
            at_ms,
            message,
        })
    };
    let edited = if w.facts.policy_edits_ms.is_empty() {
        ""
    } else {
        " (after a policy edit)"
    };

    let victims = waiting_victims(w);
    // No drain lockstep set outlives its cause.
    for n in w.slurm.nodes.values() {
        // A DOWN someone else set holds the node anyway, and lockstep's
        // resume would lift it too.
        let foreign_down = n
            .down
            .as_ref()
            .is_some_and(|(who, why, _)| *why == DownWhy::Explicit && !who.is_lockstep());
        if n.drain.as_ref().is_some_and(|(who, _)| who.is_lockstep())
            && drain_causes(w, &n.name).is_empty()
            && !victims.contains_key(&n.name)
            && !foreign_down
        {
            say(
                Property::NoDrainOutlivesCause,
                format!(
                    "{} still carries lockstep's drain ({:?}) with no cause left{edited}",
                    n.name,
                    n.reason.as_ref().map(|r| r.0.as_str()).unwrap_or_default()
                ),
            );
        }
    }

    // Nothing lockstep holds is left out of service once every cause
    // ended: its drains (above) and its DOWNs. What Slinky leaves is not
    // lockstep's to lift: its README names no undrain but on uncordon, and
    // its preStop DOWN is lifted by ReturnToService or by no one.
    for n in w.slurm.nodes.values() {
        let Some(holder) = super::slurm::holder(n) else {
            continue;
        };
        let reason = n.reason.as_ref().map(|r| r.0.as_str()).unwrap_or_default();
        let left = holder.is_lockstep() && n.drain.is_none() && drain_causes(w, &n.name).is_empty();
        if left {
            say(
                Property::NothingOutOnceCausesEnd,
                format!(
                    "{} is still out of service ({}{}, reason {reason:?} by {holder}) with every cause ended{edited}",
                    n.name,
                    n.base,
                    if n.drain.is_some() { "+DRAIN" } else { "" }
                ),
            );
        }
    }

    // Usable nodes converge.
    for (set, wl) in w.kube.sets.iter().enumerate() {
        let slots: Vec<Option<&Pod>> = match wl.kind {
            WorkloadKind::StatefulSet { .. } => (0..wl.replicas)
                .map(|o| w.kube.pods.get(&format!("{}-{o}", wl.name)))
                .collect(),
            WorkloadKind::ReplicaSet => {
                let mut v: Vec<Option<&Pod>> = w
                    .kube
                    .pods_of(set)
                    .filter(|p| p.deletion.is_none())
                    .map(Some)
                    .collect();
                v.resize(wl.replicas as usize, None);
                v
            }
        };
        let mut usable = 0;
        let mut held_out = 0;
        let mut held = Vec::new();
        let mut unusable = Vec::new();
        // OrderedReady creates a pod only once every lower ordinal is
        // Running and Ready: a missing pod behind one that is not waits.
        let ordered = matches!(wl.kind, WorkloadKind::StatefulSet { ordered: true });
        let mut waits_for: Option<String> = None;
        for (i, pod) in slots.iter().enumerate() {
            let state = match (pod, &waits_for) {
                (None, Some(w)) if ordered => Slot::Out(format!("OrderedReady waits for {w}")),
                (Some(p), _) if victims.contains_key(&p.name) => {
                    Slot::Out(victims[&p.name].clone())
                }
                _ => slot_state(w, *pod),
            };
            if waits_for.is_none() {
                let healthy = pod.is_some_and(|p| p.up() && p.ready);
                if !healthy {
                    waits_for = Some(
                        pod.map_or_else(|| format!("{} slot {i}", wl.name), |p| p.name.clone()),
                    );
                }
            }
            match state {
                Slot::Usable => usable += 1,
                Slot::Out(why) => {
                    held_out += 1;
                    held.push(why);
                }
                Slot::Unusable(why) => unusable.push(format!(
                    "{} ({why})",
                    pod.map_or_else(|| format!("{} slot {i}", wl.name), |p| p.name.clone())
                )),
            }
        }
        if !unusable.is_empty() {
            say(
                Property::UsableNodesConverge,
                format!(
                    "{} of {} slots of {} are unusable with nothing in the world holding them out ({usable} usable, {held_out} held out: {held:?}): {}{edited}",
                    unusable.len(),
                    wl.replicas,
                    wl.name,
                    unusable.join(", ")
                ),
            );
        }
        if set == 0 {
            let rule = &w.policy.scaling.targets[0];
            let (demand, want) = wanted_replicas(w);
            // The fewest replicas that remove no pod lockstep must keep: one
            // whose Slurm node runs a job, or one it cannot tell about (its
            // slurmd never registered, or somebody else set it DOWN and
            // nothing drains it: a DOWN may lift by itself, and lockstep
            // never drains over it): the design fails closed there.
            let keep = |p: &Pod| {
                w.slurm.nodes.get(&p.name).is_none_or(|n| {
                    !n.jobs.is_empty()
                        || n.completing > 0
                        || (n.drain.is_none()
                            && n.down.as_ref().is_some_and(|(who, why, _)| {
                                *why == DownWhy::Explicit && !who.is_lockstep()
                            }))
                })
            };
            let floor = match wl.kind {
                WorkloadKind::StatefulSet { .. } => w
                    .kube
                    .pods_of(set)
                    .filter(|p| keep(p))
                    .filter_map(|p| p.ordinal)
                    .map(|o| o + 1)
                    .max()
                    .unwrap_or(0),
                WorkloadKind::ReplicaSet => w.kube.pods_of(set).filter(|p| keep(p)).count() as u32,
            };
            // OrderedReady removes nothing while a pod is not Running and
            // Ready: while the world holds one so, no scale-in can progress.
            let blocked = ordered
                && slots.iter().flatten().any(|p| {
                    !(p.up() && p.ready) && matches!(slot_state(w, Some(p)), Slot::Out(_))
                });
            let floor = if blocked {
                floor.max(wl.replicas)
            } else {
                floor
            };
            let upper = (want + held_out)
                .max(floor)
                .min(rule.max_replicas)
                .max(want);
            if wl.replicas < want || wl.replicas > upper {
                say(
                    Property::UsableNodesConverge,
                    format!(
                        "{} has {} replicas; demand is {demand} nodes, so the policy (min {}, max {}) asks for {want}{}",
                        wl.name,
                        wl.replicas,
                        rule.min_replicas,
                        rule.max_replicas,
                        if upper > want {
                            format!(" (up to {upper} with {held_out} held out by the world and pods to keep up to {floor})")
                        } else {
                            String::new()
                        }
                    ),
                );
            }
        }
    }

    // Nothing lockstep set is left that the policy does not want.
    let p = &w.policy;
    for n in w.kube.nodes.values() {
        for (t, by) in &n.taints {
            if by.is_lockstep() && !taint_wanted(w, n, t) {
                say(
                    Property::NoLeftovers,
                    format!(
                        "node {} keeps lockstep's taint {}:{:?} that the policy does not want now{edited}",
                        n.name, t.key, t.effect
                    ),
                );
            }
        }
    }
    // The annotation naming a node's Slurm nodes: on every node with a
    // slurmd pod whose Slurm node Slurm reports, their names sorted and
    // comma-separated; on no other node; never under a key the policy no
    // longer names.
    let annotation = p.node_signals.slurm_nodes_annotation.as_str();
    for n in w.kube.nodes.values() {
        let mut on: Vec<&str> = w
            .kube
            .pods
            .values()
            .filter(|pod| pod.node.as_deref() == Some(n.name.as_str()))
            .filter(|pod| w.slurm.nodes.contains_key(&pod.name))
            .map(|pod| pod.name.as_str())
            .collect();
        on.sort_unstable();
        let wanted = (!annotation.is_empty() && !on.is_empty()).then(|| on.join(","));
        let shown = n.annotations.get(annotation).map(|(v, _)| v.clone());
        if shown != wanted {
            say(
                Property::NoLeftovers,
                format!(
                    "node {} has annotation {annotation}={shown:?}; its Slurm nodes are {on:?}{edited}",
                    n.name
                ),
            );
        }
        for (key, (v, by)) in &n.annotations {
            if by.is_lockstep() && key != annotation {
                say(
                    Property::NoLeftovers,
                    format!(
                        "node {} keeps lockstep's annotation {key}={v}, which the policy no longer names{edited}",
                        n.name
                    ),
                );
            }
        }
    }
    const DRAIN_TYPES: [&str; 2] = ["SlurmNodeDrained", "SlurmDrained"];
    const HEALTH_TYPES: [&str; 2] = ["SlurmNodeHealthy", "SlurmHealthy"];
    for pod in w.kube.pods.values() {
        let Some(sn) = w.slurm.nodes.get(&pod.name) else {
            continue;
        };
        let foreign = foreign_drain(sn);
        let healthy = slurm_healthy(sn);
        // A DOWN node that also stopped answering, not drained, reads the
        // same in Slurm whether a user or slurmctld set it DOWN (the
        // reason is whoever wrote it last): lockstep may show it either way.
        let ambiguous = sn.drain.is_none() && sn.down.is_some() && sn.not_responding;
        for (ty, (c, by)) in &pod.conditions {
            if !by.is_lockstep() {
                continue;
            }
            if ambiguous && DRAIN_TYPES.contains(&ty.as_str()) {
                continue;
            }
            let current =
                *ty == p.drain.foreign_drain_condition || *ty == p.health.slurm_health_condition;
            let truth = if *ty == p.drain.foreign_drain_condition
                || (!current && DRAIN_TYPES.contains(&ty.as_str()))
            {
                Some((foreign, true))
            } else if *ty == p.health.slurm_health_condition
                || (!current && HEALTH_TYPES.contains(&ty.as_str()))
            {
                Some((healthy, false))
            } else {
                None
            };
            let wrong = match (truth, c.status) {
                // A type the policy manages must tell the truth.
                (Some((holds, _)), ConditionStatus::True) if current => !holds,
                (Some((holds, _)), ConditionStatus::False) if current => holds,
                // A type it no longer manages must not claim a problem
                // that is not there.
                (Some((holds, true)), ConditionStatus::True) => !holds,
                (Some((holds, false)), ConditionStatus::False) => holds,
                _ => false,
            };
            if wrong {
                say(
                    Property::NoLeftovers,
                    format!(
                        "pod {} keeps lockstep's condition {ty}={:?} ({}) although Slurm node {} is {}{}{edited}",
                        pod.name,
                        c.status,
                        c.reason,
                        sn.name,
                        if healthy { "healthy" } else { "unhealthy" },
                        if foreign {
                            ", drained by someone else"
                        } else {
                            ", not drained by anyone else"
                        }
                    ),
                );
            }
        }
        for (key, (v, by)) in &pod.labels {
            if !by.is_lockstep() {
                continue;
            }
            let busy = !sn.jobs.is_empty();
            if *key != p.scaling.busy_label || !busy {
                say(
                    Property::NoLeftovers,
                    format!(
                        "pod {} keeps lockstep's label {key}={v} although {}{edited}",
                        pod.name,
                        if *key != p.scaling.busy_label {
                            "the policy's busy label is now something else".to_owned()
                        } else {
                            format!("{} runs no job", sn.name)
                        }
                    ),
                );
            }
        }
        for (key, (v, by)) in &pod.annotations {
            if !by.is_lockstep() {
                continue;
            }
            if key == DELETION_COST && victims.contains_key(&pod.name) {
                continue;
            }
            say(
                Property::NoLeftovers,
                format!(
                    "pod {} keeps lockstep's annotation {key}={v} with no scale-in under way{edited}",
                    pod.name
                ),
            );
        }
        // Features lockstep manages follow the node the pod runs on.
        if !pod.up() {
            continue;
        }
        let Some(host) = pod.node.as_ref().and_then(|h| w.kube.nodes.get(h)) else {
            continue;
        };
        let mut wanted = sn.base_features.clone();
        for f in &p.topology.features {
            if let Some(v) = host.labels.get(&f.label) {
                wanted.push(format!("{}{v}", f.prefix));
            }
        }
        let extra: Vec<&String> = sn.features.iter().filter(|f| !wanted.contains(f)).collect();
        if !extra.is_empty() {
            say(
                Property::NoLeftovers,
                format!(
                    "Slurm node {} keeps features {extra:?} that its node {} and the policy do not give it{edited}",
                    sn.name, host.name
                ),
            );
        }
    }
    out
}

/// Whether the policy in force wants lockstep's taint `t` on node `n` now:
/// the unhealthy taint while a Slurm node on it is DOWN or NOT_RESPONDING
/// (not by lockstep's doing), the foreign-drain taint while one is drained
/// by someone else.
fn taint_wanted(w: &World, n: &super::kube::Node, t: &Taint) -> bool {
    let p = &w.policy;
    let hosted: Vec<&SNode> = w
        .kube
        .pods
        .values()
        .filter(|pod| pod.node.as_deref() == Some(&n.name))
        .filter_map(|pod| w.slurm.nodes.get(&pod.name))
        .collect();
    let unhealthy = p
        .health
        .unhealthy_taint
        .as_ref()
        .is_some_and(|s| s.key == t.key)
        && hosted.iter().any(|s| {
            // NOT_RESPONDING is unhealthy whoever set the DOWN that came
            // with it; a DOWN alone is, unless lockstep set it.
            s.not_responding
                || (!slurm_healthy(s) && !s.down.as_ref().is_some_and(|d| d.0.is_lockstep()))
        });
    let foreign = p
        .drain
        .foreign_drain_taint
        .as_ref()
        .is_some_and(|s| s.key == t.key)
        && hosted.iter().any(|s| foreign_drain(s));
    unhealthy || foreign
}

enum Slot {
    Usable,
    Out(String),
    Unusable(String),
}

/// Whether a slot of a set is usable, held out by the world, or neither.
fn slot_state(w: &World, pod: Option<&Pod>) -> Slot {
    let p = &w.policy;
    // Could the scheduler place a pod if lockstep's unwanted taints were
    // not there? (A wanted one keeps pods off as the policy means it to.)
    let room = w.kube.nodes.values().any(|n| {
        n.ready == ConditionStatus::True
            && !n.unschedulable
            && !n.lifecycle_taint
            && n.host == Host::Up
            && n.taints.iter().all(|(t, by)| {
                t.effect == TaintEffect::PreferNoSchedule
                    || (by.is_lockstep() && !taint_wanted(w, n, t))
            })
    });
    let Some(pod) = pod else {
        return if room {
            Slot::Unusable("no pod".to_owned())
        } else {
            Slot::Out("no node to run a pod on".to_owned())
        };
    };
    if let Some(sn) = w.slurm.nodes.get(&pod.name) {
        if let Some(why) = foreign_out(sn) {
            return Slot::Out(why);
        }
    }
    if let Some((_, by)) = &pod.deletion {
        if !by.is_lockstep() {
            return Slot::Out(format!("pod deleted by {by}"));
        }
    }
    match &pod.node {
        None => {
            if !room {
                return Slot::Out("no node to run a pod on".to_owned());
            }
        }
        Some(h) => match w.kube.nodes.get(h) {
            None => return Slot::Out(format!("node {h} deleted")),
            Some(n) => {
                if n.host != Host::Up || n.ready != ConditionStatus::True {
                    return Slot::Out(format!("node {h} is not healthy"));
                }
                if p.drain.on_cordon && n.unschedulable {
                    return Slot::Out(format!("node {h} is cordoned"));
                }
                for c in &p.health.node_conditions {
                    if n.conditions.get(c).map(|c| c.0) == Some(ConditionStatus::True) {
                        return Slot::Out(format!("node {h} has {c}=True"));
                    }
                }
            }
        },
    }
    let Some(sn) = w.slurm.nodes.get(&pod.name) else {
        return Slot::Unusable(format!("pod {:?}, slurmd never registered", pod.phase));
    };
    if !pod.up() || !pod.ready {
        return Slot::Unusable(format!("pod {:?} ready={}", pod.phase, pod.ready));
    }
    if sn.usable() {
        Slot::Usable
    } else {
        let mut s = format!("Slurm {}", sn.base);
        if let Some((who, _)) = &sn.drain {
            s.push_str(&format!("+DRAIN by {who}"));
        }
        if sn.not_responding {
            s.push_str("+NOT_RESPONDING");
        }
        if let Some((r, u)) = &sn.reason {
            s.push_str(&format!(" reason {r:?} by {u}"));
        }
        if matches!(sn.down, Some((_, DownWhy::Explicit, _))) {
            s.push_str(" (set DOWN)");
        }
        Slot::Unusable(s)
    }
}

/// What a decision is, its place in the log aside (ids and sequences
/// differ when one record more is in the log).
fn decision(a: &IssuedAction) -> String {
    format!(
        "{} {:?} attempt {} at {}",
        a.rule, a.action, a.attempt, a.time_ms
    )
}

/// Appending a stale copy of an earlier observation (or a duplicate of the
/// latest) to the log changes no decision: the reducer with the copy makes
/// the same decisions over the next minute as the reducer without it.
fn stale(w: &World) -> Vec<Violation> {
    let observations: Vec<&EventRecord> =
        w.ls.events()
            .filter(|r| {
                matches!(
                    r.envelope.event,
                    Event::SlurmNode(_)
                        | Event::SlurmJob(_)
                        | Event::SlurmPartition(_)
                        | Event::KubeNode(_)
                        | Event::KubePod(_)
                        | Event::KubeScaleTarget(_)
                        | Event::SlurmNodeGone { .. }
                        | Event::SlurmJobGone { .. }
                        | Event::KubeNodeGone { .. }
                        | Event::KubePodGone { .. }
                        | Event::ActionOutcome(_)
                )
            })
            .collect();
    if observations.is_empty() {
        return Vec::new();
    }
    let n = observations.len();
    let mut picks = vec![0, n / 3, n / 2, (2 * n) / 3, n - 1];
    picks.dedup();
    let snapshot = w.ls.engine.snapshot();
    let last = w.ls.engine.last_seq();
    let now = w.ls.engine.now_ms();
    // The next minute of the log: ticks (built once; ids are costly).
    let ticks: Vec<Envelope> = (0..=6u64)
        .map(|k| {
            Envelope::new(
                lockstep_schemas::Source::Lockstep,
                now + k * 10_000,
                Event::Tick,
            )
        })
        .collect();
    let follow = |e: &mut Engine, mut seq: u64| -> Vec<String> {
        let mut out = Output::default();
        let mut decisions = Vec::new();
        for env in &ticks {
            seq += 1;
            let rec = EventRecord {
                seq,
                time_ms: env.observed_ms,
                envelope: env.clone(),
            };
            out.clear();
            e.apply(&rec, &mut out);
            decisions.extend(out.actions.iter().map(decision));
        }
        decisions.sort();
        decisions
    };
    let mut base = Engine::restore(&snapshot).expect("an engine restores its own snapshot");
    let expected = follow(&mut base, last);
    let expected_phases = base.phases();
    let mut out = Vec::new();
    for i in picks {
        let old = observations[i];
        let mut e = Engine::restore(&snapshot).expect("an engine restores its own snapshot");
        let rec = EventRecord {
            seq: last + 1,
            time_ms: now,
            envelope: old.envelope.clone(),
        };
        let mut o = Output::default();
        e.apply(&rec, &mut o);
        let mut got: Vec<String> = o.actions.iter().map(decision).collect();
        got.extend(follow(&mut e, last + 1));
        got.sort();
        let phases = e.phases();
        if got != expected || phases != expected_phases {
            let first = got
                .iter()
                .zip(expected.iter())
                .find(|(a, b)| a != b)
                .map(|(a, b)| format!("decided {a} instead of {b}"))
                .or_else(|| {
                    (got.len() != expected.len()).then(|| {
                        format!(
                            "{} decisions instead of {} (first extra or missing: {})",
                            got.len(),
                            expected.len(),
                            if got.len() > expected.len() {
                                got[expected.len()].clone()
                            } else {
                                expected[got.len()].clone()
                            }
                        )
                    })
                })
                .unwrap_or_else(|| {
                    let d: Vec<String> = phases
                        .iter()
                        .zip(expected_phases.iter())
                        .filter(|(a, b)| a != b)
                        .map(|(a, b)| format!("{} {} instead of {}", a.0, a.1, b.1))
                        .collect();
                    format!("phases changed: {}", d.join(", "))
                });
            out.push(Violation {
                property: Property::StaleObservationChangesNothing,
                at_ms: w.end_ms(),
                message: format!(
                    "re-appending seq {} ({}) changed the reducer: {first}",
                    old.seq,
                    old.envelope.event.summary()
                ),
            });
        }
    }
    out
}

/// The log folded again by a fresh reducer gives the same actions and the
/// same state hash.
fn replay(w: &World) -> Vec<Violation> {
    let mut e = Engine::new(lockstep_schemas::Policy::default());
    let mut out = Output::default();
    let mut i = 0;
    let mut first_difference = None;
    for r in &w.ls.records {
        match r {
            Record::Event(rec) => {
                out.clear();
                e.apply(rec, &mut out);
                for a in &out.actions {
                    let live = w.ls.issued.get(i);
                    if first_difference.is_none() && live != Some(a) {
                        first_difference = Some(format!(
                            "replaying seq {} issued {} where the live run issued {}",
                            rec.seq,
                            a.id,
                            live.map_or("nothing".to_owned(), |l| l.id.to_string())
                        ));
                    }
                    i += 1;
                }
            }
            Record::Action(_) | Record::Header(_) | Record::Snapshot(_) => {}
        }
    }
    if first_difference.is_none() && i != w.ls.issued.len() {
        first_difference = Some(format!(
            "the replay issued {i} actions, the live run {}",
            w.ls.issued.len()
        ));
    }
    if first_difference.is_none() && e.hash() != w.ls.engine.hash() {
        first_difference = Some("the replay folded to another state hash".to_owned());
    }
    first_difference
        .map(|message| Violation {
            property: Property::Deterministic,
            at_ms: w.end_ms(),
            message,
        })
        .into_iter()
        .collect()
}

/// Two runs of the same schedule write the same log.
fn rerun(a: &World, b: &World) -> Vec<Violation> {
    let mut out = Vec::new();
    if a.ls.records != b.ls.records {
        let first =
            a.ls.records
                .iter()
                .zip(b.ls.records.iter())
                .position(|(x, y)| x != y)
                .unwrap_or(a.ls.records.len().min(b.ls.records.len()));
        let show = |r: Option<&Record>| match r {
            Some(Record::Event(e)) => e.envelope.event.summary(),
            Some(Record::Action(a)) => a.action.describe(),
            Some(Record::Header(_)) => "header".to_owned(),
            Some(Record::Snapshot(p)) => format!("snapshot of seq {}", p.seq),
            None => "<end>".to_owned(),
        };
        out.push(Violation {
            property: Property::Deterministic,
            at_ms: a.end_ms(),
            message: format!(
                "two runs of the same schedule differ at record {first}: {} / {}",
                show(a.ls.records.get(first)),
                show(b.ls.records.get(first))
            ),
        });
    } else if a.ls.engine.hash() != b.ls.engine.hash() {
        out.push(Violation {
            property: Property::Deterministic,
            at_ms: a.end_ms(),
            message: "the same log folded to two state hashes".to_owned(),
        });
    }
    out
}

#[cfg(test)]
mod shape_tests {
    use super::shape;

    #[test]
    fn shapes_tell_stories_apart_and_ignore_names() {
        // (message, message, same story)
        let cases = [
            (
                r#"cpu-3 still carries lockstep's drain ("lockstep: a") with no cause left"#,
                r#"gpu-0 still carries lockstep's drain ("lockstep: b") with no cause left"#,
                true,
            ),
            (
                "lockstep resumed its drain on cpu-0 (x) while its pod has not been Running since 1.0 s (phase Pending)",
                "lockstep resumed its drain on cpu-1 (y) while its Kubernetes node k8s-1 has been deleted since 2.0 s",
                false,
            ),
        ];
        for (a, b, same) in cases {
            assert_eq!(shape(a) == shape(b), same, "{a} / {b}");
        }
    }
}
