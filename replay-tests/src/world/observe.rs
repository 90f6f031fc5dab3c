//! lockstep's connectors as the world drives them: the Kubernetes watchers
//! and the Slurm poller. They turn the world's objects into the
//! observations `lockstep-connectors` would append, with the same
//! reduction (`connectors/src/kube/reduce.rs`: only the labels, conditions
//! and taints the policy names) and the same bookkeeping
//! (`connectors/src/kube/tracker.rs`, `connectors/src/slurm/observer.rs`):
//!
//! - A watch event reaches the watcher after a latency, in order per kind
//!   (one watch stream per resource, ordered by resourceVersion); kinds
//!   interleave freely. An object is appended only when its reduced
//!   observation differs from the last one appended.
//! - A relist (a broken watch, `410 Gone`) appends `SyncStarted`, every
//!   object, `*Gone` for objects known before and not listed, `SyncDone`.
//!   After a connector restart it knows nothing, so nothing disappeared
//!   gets a `*Gone` event: the frame is the only sign.
//! - A policy change that changes what is observed starts a new observer
//!   (reduce.rs: "a policy change that changes the spec needs a new
//!   observer"), which lists everything under the new spec.
//! - Slurm is polled in two lanes (`Observer::run`): the nodes every
//!   `slurm_poll_interval_ms`, so that what lockstep sees of them lags
//!   slurmctld by up to one interval; the jobs and partitions at a phase of
//!   their own and after a listing that takes seconds for a long queue
//!   (`slurm_jobs_lane_ms`), so a job's change may reach the log before or
//!   after the change of its node. Only changed objects are appended,
//!   `*Gone` for those that left.
//! - While slurmrestd does not answer, each lane's polls fail and back off
//!   (500 ms, doubling, at most 30 s); a lane that fails twice in a row is
//!   lost, and the first lane lost appends
//!   `ConnectorStatus { Slurm, visible: false }`. A lost lane's first poll
//!   that succeeds appends `visible: true` (unless the other lane did
//!   already), then lists its domains again, each framed by `SyncStarted`
//!   .. `SyncDone` (with `*Gone` for objects known before and not listed);
//!   the other lane lists its own again at its next poll that succeeds, if
//!   it has not since that `visible: true`.
//! - Every observation carries its object's version (resourceVersion; the
//!   poll generation in ms for Slurm) once the schema has the field.
//!
//! It must never filter, reorder or fix anything on lockstep's behalf
//! beyond what the real connectors do.

use std::collections::{BTreeMap, VecDeque};

use lockstep_schemas::{
    Connector, Domain, Event, KubeNode, KubePod, KubeScaleTarget, NodeCondition, OwnerRef, Policy,
    Removal, ScaleTargetRef, SlurmJob, SlurmNode, SlurmNodeFlag, SlurmPartition, Source, Taint,
    Text,
};

use super::kube::{Node, Pod, Workload, WorkloadKind};
use super::schedule::{NAMESPACE, ZONE_LABEL};
use super::{Ev, Ms, World, EPOCH_MS};

/// Kubernetes object kinds lockstep watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Nodes,
    Pods,
    Targets,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Nodes, Kind::Pods, Kind::Targets];

    const fn index(self) -> usize {
        self as usize
    }

    const fn domain(self) -> Domain {
        match self {
            Self::Nodes => Domain::KubeNodes,
            Self::Pods => Domain::KubePods,
            Self::Targets => Domain::KubeScaleTargets,
        }
    }
}

/// A watch event on its way to the watcher.
#[derive(Debug, Clone)]
enum Item {
    Node(Box<Node>),
    Pod(Box<Pod>),
    Target(Box<Workload>),
    Gone(String, u64),
}

/// What the Kubernetes observer reports, from the policy
/// (`ObserveSpec::from_policy`).
#[derive(Debug, Clone, Default)]
struct Spec {
    node_labels: Vec<String>,
    node_conditions: Vec<String>,
    taint_keys: Vec<String>,
    pod_labels: Vec<String>,
    pod_conditions: Vec<String>,
}

const LOCKSTEP_TAINT_PREFIX: &str = "lockstep.io/";

/// A label key with this prefix names an annotation.
pub(crate) use lockstep_schemas::ANNOTATION_PREFIX;
const REVISION_LABEL_KIND: &str = "StatefulSet";

impl Spec {
    fn from_policy(p: &Policy) -> Self {
        let non_empty = |s: &str| (!s.trim().is_empty()).then(|| s.to_owned());
        let mut s = Self {
            node_labels: std::iter::once(ZONE_LABEL.to_owned())
                .chain(p.topology.features.iter().map(|f| f.label.clone()))
                .chain(p.topology.unit_label.iter().cloned())
                .chain(
                    non_empty(&p.node_signals.slurm_nodes_annotation)
                        .map(|a| format!("{ANNOTATION_PREFIX}{a}")),
                )
                .collect(),
            node_conditions: p.health.node_conditions.clone(),
            taint_keys: [
                p.drain.foreign_drain_taint.as_ref(),
                p.health.unhealthy_taint.as_ref(),
            ]
            .into_iter()
            .flatten()
            .map(|t| t.key.clone())
            .collect(),
            pod_labels: p
                .mapping
                .node_name_label
                .iter()
                .cloned()
                .chain(non_empty(&p.scaling.busy_label))
                // The deletion cost of targets scaled in by it.
                .chain(
                    p.scaling
                        .targets
                        .iter()
                        .any(|t| p.scaling.removal_of(&t.target) == Some(Removal::DeletionCost))
                        .then(|| format!("{ANNOTATION_PREFIX}{}", super::kube::DELETION_COST)),
                )
                .collect(),
            pod_conditions: [
                p.drain.foreign_drain_condition.as_str(),
                p.health.slurm_health_condition.as_str(),
            ]
            .into_iter()
            .filter_map(non_empty)
            .collect(),
        };
        for v in [
            &mut s.node_labels,
            &mut s.node_conditions,
            &mut s.taint_keys,
            &mut s.pod_labels,
            &mut s.pod_conditions,
        ] {
            v.sort();
            v.dedup();
        }
        s
    }

    fn taint_observed(&self, key: &str) -> bool {
        key.starts_with(LOCKSTEP_TAINT_PREFIX) || self.taint_keys.iter().any(|k| k == key)
    }

    fn node(&self, n: &Node) -> KubeNode {
        let mut taints: Vec<Taint> = n
            .taints
            .iter()
            .map(|(t, _)| t.clone())
            .filter(|t| self.taint_observed(&t.key))
            .collect();
        taints.sort_by(|a, b| {
            (a.key.as_str(), effect_str(a), a.value.as_str()).cmp(&(
                b.key.as_str(),
                effect_str(b),
                b.value.as_str(),
            ))
        });
        KubeNode {
            name: n.name.as_str().into(),
            unschedulable: n.unschedulable,
            ready: n.ready,
            conditions: n
                .conditions
                .iter()
                .filter(|(t, _)| self.node_conditions.contains(t))
                .map(|(t, (status, _))| NodeCondition {
                    type_: t.clone(),
                    status: *status,
                    reason: String::new(),
                    message: String::new(),
                })
                .collect(),
            labels: self
                .node_labels
                .iter()
                .filter_map(|k| {
                    let value = match k.strip_prefix(ANNOTATION_PREFIX) {
                        Some(a) => n.annotations.get(a).map(|(v, _)| v),
                        None => n.labels.get(k),
                    };
                    Some((k.clone(), value?.clone()))
                })
                .collect(),
            taints,
            read_labels: Some(self.node_labels.clone()),
            maintenance: None,
            identity: Default::default(),
            devices: Default::default(),
            version: n.rv,
        }
    }

    fn pod(&self, p: &Pod, owner: &Workload) -> KubePod {
        KubePod {
            namespace: NAMESPACE.to_owned(),
            name: p.name.clone(),
            uid: p.uid.clone(),
            node_name: p.node.clone(),
            phase: p.phase,
            deleting: p.deletion.is_some(),
            disruption_target: p.disruption_target,
            labels: self
                .pod_labels
                .iter()
                .filter_map(|k| {
                    let value = match k.strip_prefix(ANNOTATION_PREFIX) {
                        Some(a) => p.annotations.get(a),
                        None => p.labels.get(k),
                    };
                    Some((k.clone(), value?.0.clone()))
                })
                // Labels under lockstep's own prefix are always reported.
                .chain(
                    p.labels
                        .iter()
                        .filter(|(k, _)| k.starts_with(LOCKSTEP_TAINT_PREFIX))
                        .map(|(k, v)| (k.clone(), v.0.clone())),
                )
                .collect(),
            // Conditions lockstep wrote are always reported (the API server
            // names their writer in managedFields).
            conditions: p
                .conditions
                .iter()
                .filter(|(t, (_, by))| self.pod_conditions.contains(t) || by.is_lockstep())
                .map(|(_, (c, _))| c.clone())
                .collect(),
            owner: Some(OwnerRef {
                kind: kind_name(owner).to_owned(),
                name: owner.name.clone(),
            }),
            // `controller-revision-hash` is a StatefulSet's; a ReplicaSet's
            // pods carry `pod-template-hash`, which lockstep does not read.
            revision: if kind_name(owner) == REVISION_LABEL_KIND {
                p.revision.clone()
            } else {
                None
            },
            ready: p.ready,
            unhealthy_devices: Default::default(),
            eviction: Default::default(),
            version: p.rv,
        }
    }
}

fn effect_str(t: &Taint) -> &'static str {
    match t.effect {
        lockstep_schemas::TaintEffect::NoSchedule => "NoSchedule",
        lockstep_schemas::TaintEffect::PreferNoSchedule => "PreferNoSchedule",
        lockstep_schemas::TaintEffect::NoExecute => "NoExecute",
    }
}

fn kind_name(w: &Workload) -> &'static str {
    match w.kind {
        WorkloadKind::StatefulSet { .. } => "StatefulSet",
        WorkloadKind::ReplicaSet => "ReplicaSet",
    }
}

/// The scale target observation of a workload.
pub(crate) fn target_ref(w: &Workload) -> ScaleTargetRef {
    ScaleTargetRef {
        group: "apps".to_owned(),
        kind: kind_name(w).to_owned(),
        namespace: NAMESPACE.to_owned(),
        name: w.name.clone(),
    }
}

fn target(w: &Workload) -> KubeScaleTarget {
    KubeScaleTarget {
        target: target_ref(w),
        replicas: w.replicas,
        ready_replicas: w.ready_replicas,
        update_revision: w.update_revision.clone(),
        version: w.rv,
    }
}

/// The same event without its version: what the trackers compare.
fn unversioned(ev: &Event) -> Event {
    let mut ev = ev.clone();
    match &mut ev {
        Event::KubeNode(n) => n.version = 0,
        Event::KubePod(p) => p.version = 0,
        Event::KubeScaleTarget(t) => t.version = 0,
        Event::SlurmNode(n) => n.version = 0,
        Event::SlurmJob(j) => j.version = 0,
        Event::SlurmPartition(p) => p.version = 0,
        _ => {}
    }
    ev
}

/// Slurm nodes, jobs and partitions as one poll sees them, keyed.
type SlurmSnapshot = (
    Vec<(String, Event)>,
    Vec<(u64, Event)>,
    Vec<(String, Event)>,
);

/// The observers' state.
#[derive(Debug)]
pub(crate) struct Observers {
    spec: Spec,
    queues: [VecDeque<(Ms, Item)>; 3],
    last_due: [Ms; 3],
    /// The tracker: the last observation appended per object.
    kube_sent: BTreeMap<(Kind, String), Event>,
    slurm_nodes: BTreeMap<String, Event>,
    slurm_jobs: BTreeMap<u64, Event>,
    slurm_parts: BTreeMap<String, Event>,
    /// Failed Slurm polls in a row, per lane.
    slurm_failures: [u32; 2],
    /// Lanes that failed `LOST_AFTER_FAILURES` times in a row and have not
    /// succeeded since.
    slurm_lane_lost: [bool; 2],
    /// `ConnectorStatus { visible: false }` appended, not yet taken back.
    slurm_lost: bool,
    /// `visible: true` appended so far; each lane's count at its last full
    /// listing.
    slurm_regains: u64,
    slurm_listed_at: [u64; 2],
}

/// A lane of lockstep's Slurm observer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The nodes.
    Nodes,
    /// The jobs and partitions.
    Jobs,
}

impl Lane {
    pub const ALL: [Lane; 2] = [Lane::Nodes, Lane::Jobs];

    pub const fn index(self) -> usize {
        self as usize
    }
}

/// Failed polls in a row after which the poller says it lost Slurm
/// (`ObserverConfig::lost_after_failures`' default).
const LOST_AFTER_FAILURES: u32 = 2;
/// The poller's backoff after failures: first pause, upper bound.
const POLL_BACKOFF_MS: (u64, u64) = (500, 30_000);

impl Observers {
    pub fn new(policy: &Policy) -> Self {
        Self {
            spec: Spec::from_policy(policy),
            queues: Default::default(),
            last_due: [0; 3],
            kube_sent: BTreeMap::new(),
            slurm_nodes: BTreeMap::new(),
            slurm_jobs: BTreeMap::new(),
            slurm_parts: BTreeMap::new(),
            slurm_failures: [0; 2],
            slurm_lane_lost: [false; 2],
            slurm_lost: false,
            slurm_regains: 0,
            slurm_listed_at: [0; 2],
        }
    }

    pub fn set_spec(&mut self, policy: &Policy) {
        self.spec = Spec::from_policy(policy);
    }
}

impl World {
    fn enqueue(&mut self, kind: Kind, item: Item) {
        let i = kind.index();
        let lat = self.rng.between(self.cfg.kube_watch_latency_ms);
        let due = (self.now + lat).max(self.obs.last_due[i]);
        self.obs.last_due[i] = due;
        self.obs.queues[i].push_back((due, item));
        self.at(due - self.now, Ev::KubeDeliver { kind });
    }

    pub(crate) fn obs_pod(&mut self, p: Pod) {
        self.enqueue(Kind::Pods, Item::Pod(Box::new(p)));
    }

    pub(crate) fn obs_node(&mut self, n: Node) {
        self.enqueue(Kind::Nodes, Item::Node(Box::new(n)));
    }

    pub(crate) fn obs_target(&mut self, w: Workload) {
        self.enqueue(Kind::Targets, Item::Target(Box::new(w)));
    }

    pub(crate) fn obs_gone(&mut self, kind: Kind, key: String, rv: u64) {
        self.enqueue(kind, Item::Gone(key, rv));
    }

    fn reduce(&self, item: &Item) -> Option<(String, Event)> {
        Some(match item {
            Item::Node(n) => (n.name.clone(), Event::KubeNode(self.obs.spec.node(n))),
            Item::Pod(p) => (
                p.name.clone(),
                Event::KubePod(self.obs.spec.pod(p, &self.kube.sets[p.set])),
            ),
            Item::Target(w) => (w.name.clone(), Event::KubeScaleTarget(target(w))),
            Item::Gone(..) => return None,
        })
    }

    fn gone_event(&self, kind: Kind, key: &str, rv: u64) -> Event {
        match kind {
            Kind::Nodes => Event::KubeNodeGone {
                name: key.to_owned(),
                version: rv,
            },
            Kind::Pods => Event::KubePodGone {
                namespace: NAMESPACE.to_owned(),
                name: key.to_owned(),
                version: rv,
            },
            Kind::Targets => {
                let w = self.kube.sets.iter().find(|w| w.name == key);
                Event::KubeScaleTargetGone {
                    target: w.map(target_ref).unwrap_or_else(|| ScaleTargetRef {
                        group: "apps".to_owned(),
                        kind: "StatefulSet".to_owned(),
                        namespace: NAMESPACE.to_owned(),
                        name: key.to_owned(),
                    }),
                    version: rv,
                }
            }
        }
    }

    /// Watch events due now reach the watcher.
    pub(crate) fn kube_deliver(&mut self, kind: Kind) {
        let i = kind.index();
        while let Some((due, _)) = self.obs.queues[i].front() {
            if *due > self.now {
                break;
            }
            let (_, item) = self.obs.queues[i].pop_front().expect("peeked");
            match &item {
                Item::Gone(key, rv) => {
                    if self.obs.kube_sent.remove(&(kind, key.clone())).is_some() {
                        let ev = self.gone_event(kind, key, *rv);
                        self.append(Source::Kubernetes, ev);
                    }
                }
                _ => {
                    let (key, ev) = self.reduce(&item).expect("not gone");
                    let k = (kind, key);
                    let same = self
                        .obs
                        .kube_sent
                        .get(&k)
                        .is_some_and(|old| unversioned(old) == unversioned(&ev));
                    if !same {
                        self.obs.kube_sent.insert(k, ev.clone());
                        self.append(Source::Kubernetes, ev);
                    }
                }
            }
        }
    }

    /// A full listing of one kind. `forget`: a new observer (a restart), so
    /// nothing that disappeared gets a Gone event.
    pub(crate) fn kube_relist(&mut self, kind: Kind, forget: bool) {
        // The watch restarts from the listing: events in flight are in it.
        self.obs.queues[kind.index()].clear();
        self.append(
            Source::Kubernetes,
            Event::SyncStarted {
                domain: kind.domain(),
            },
        );
        let items: Vec<Item> = match kind {
            Kind::Nodes => self
                .kube
                .nodes
                .values()
                .map(|n| Item::Node(Box::new(n.clone())))
                .collect(),
            Kind::Pods => self
                .kube
                .pods
                .values()
                .map(|p| Item::Pod(Box::new(p.clone())))
                .collect(),
            Kind::Targets => self
                .kube
                .sets
                .iter()
                .map(|w| Item::Target(Box::new(w.clone())))
                .collect(),
        };
        let mut listed = std::collections::BTreeSet::new();
        for item in items {
            let (key, ev) = self.reduce(&item).expect("not gone");
            listed.insert(key.clone());
            self.obs.kube_sent.insert((kind, key), ev.clone());
            self.append(Source::Kubernetes, ev);
        }
        let known: Vec<String> = self
            .obs
            .kube_sent
            .keys()
            .filter(|(k, key)| *k == kind && !listed.contains(key))
            .map(|(_, key)| key.clone())
            .collect();
        for key in known {
            self.obs.kube_sent.remove(&(kind, key.clone()));
            if !forget {
                // A deletion inferred from a listing has no version.
                let ev = self.gone_event(kind, &key, 0);
                self.append(Source::Kubernetes, ev);
            }
        }
        self.append(
            Source::Kubernetes,
            Event::SyncDone {
                domain: kind.domain(),
            },
        );
    }

    fn slurm_snapshot(&self) -> SlurmSnapshot {
        let version = EPOCH_MS + self.now;
        let nodes = self
            .slurm
            .nodes
            .values()
            .map(|n| (n.name.clone(), Event::SlurmNode(slurm_node(n, version))))
            .collect();
        let jobs = self
            .slurm
            .jobs
            .values()
            .map(|j| {
                let mut nodes: Vec<Text> = j.nodes.iter().map(|n| n.as_str().into()).collect();
                nodes.sort();
                (
                    j.id,
                    Event::SlurmJob(SlurmJob {
                        job_id: j.id,
                        state: j.state.clone(),
                        partition: j.partition.as_str().into(),
                        nodes,
                        node_count: j.node_count,
                        pending_reason: j.pending_reason.clone(),
                        version,
                    }),
                )
            })
            .collect();
        let mut parts: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for p in [
            super::schedule::SCALED_PARTITION,
            super::schedule::FIXED_PARTITION,
        ] {
            parts.insert(p.to_owned(), Vec::new());
        }
        for n in self.slurm.nodes.values() {
            parts
                .entry(n.partition.clone())
                .or_default()
                .push(n.name.clone());
        }
        let parts = parts
            .into_iter()
            .map(|(name, mut nodes)| {
                nodes.sort();
                (
                    name.clone(),
                    Event::SlurmPartition(SlurmPartition {
                        name,
                        nodes,
                        version,
                    }),
                )
            })
            .collect();
        (nodes, jobs, parts)
    }

    /// slurmrestd stops (or starts again) answering; returns whether
    /// anything changed. The poller polls on while it fails.
    pub(crate) fn slurmrestd_down(&mut self, down: bool) -> bool {
        if self.slurm.restd_down == down {
            return false;
        }
        self.slurm.restd_down = down;
        if down {
            for lane in Lane::ALL {
                self.slurm_poll_soon(lane);
            }
        }
        true
    }

    /// One poll of slurmctld by one lane: the changes of its domains since
    /// its last poll.
    pub(crate) fn slurm_poll(&mut self, lane: Lane) {
        let i = lane.index();
        let through_scontrol = lane == Lane::Nodes && self.setup.nodes_through_scontrol;
        if self.slurm.restd_down && !through_scontrol {
            self.obs.slurm_failures[i] += 1;
            let failures = self.obs.slurm_failures[i];
            if failures >= LOST_AFTER_FAILURES && !self.obs.slurm_lane_lost[i] {
                self.obs.slurm_lane_lost[i] = true;
                if !std::mem::replace(&mut self.obs.slurm_lost, true) {
                    self.append(
                        Source::Slurm,
                        Event::ConnectorStatus {
                            connector: Connector::Slurm,
                            visible: false,
                            detail: "slurmrestd: connection refused".to_owned(),
                        },
                    );
                }
            }
            let (first, max) = POLL_BACKOFF_MS;
            let delay = first.saturating_mul(1 << (failures - 1).min(16)).min(max);
            self.at(delay, Ev::SlurmPoll(lane));
            return;
        }
        self.obs.slurm_failures[i] = 0;
        if std::mem::take(&mut self.obs.slurm_lane_lost[i])
            && std::mem::take(&mut self.obs.slurm_lost)
        {
            self.obs.slurm_regains += 1;
            self.append(
                Source::Slurm,
                Event::ConnectorStatus {
                    connector: Connector::Slurm,
                    visible: true,
                    detail: String::new(),
                },
            );
            // The other lane polls at its interval whether or not anything
            // changed: its next poll lists its domains again.
            for other in Lane::ALL.into_iter().filter(|l| *l != lane) {
                self.slurm_poll_soon(other);
            }
        }
        if self.obs.slurm_listed_at[i] != self.obs.slurm_regains {
            self.obs.slurm_listed_at[i] = self.obs.slurm_regains;
            self.poll_done(lane);
            match lane {
                Lane::Nodes => self.slurm_relist(false, false),
                Lane::Jobs => self.slurm_relist_jobs_and_partitions(false),
            }
            return;
        }
        let dirty = self.slurm.dirty[i];
        self.poll_done(lane);
        if !dirty {
            return;
        }
        let (nodes, jobs, parts) = self.slurm_snapshot();
        let version = EPOCH_MS + self.now;
        let events = match lane {
            Lane::Nodes => diff(&mut self.obs.slurm_nodes, nodes, |name| {
                Event::SlurmNodeGone {
                    name: name.clone(),
                    version,
                }
            }),
            Lane::Jobs => diff(&mut self.obs.slurm_jobs, jobs, |id| Event::SlurmJobGone {
                job_id: *id,
                version,
            })
            .into_iter()
            .chain(diff(&mut self.obs.slurm_parts, parts, |name| {
                Event::SlurmPartitionGone {
                    name: name.clone(),
                    version,
                }
            }))
            .collect(),
        };
        for ev in events {
            self.append(Source::Slurm, ev);
        }
    }

    /// A full listing of Slurm nodes (and, at the start, jobs and partitions).
    pub(crate) fn slurm_relist(&mut self, forget: bool, everything: bool) {
        let (nodes, jobs, parts) = self.slurm_snapshot();
        let version = EPOCH_MS + self.now;
        let node_list = listing(&mut self.obs.slurm_nodes, nodes, forget, |name| {
            Event::SlurmNodeGone {
                name: name.clone(),
                version,
            }
        });
        self.framed(Domain::SlurmNodes, node_list);
        if everything {
            self.list_jobs_and_partitions(jobs, parts, forget, version);
        }
    }

    /// The jobs' lane lists its domains in full.
    fn slurm_relist_jobs_and_partitions(&mut self, forget: bool) {
        let (_, jobs, parts) = self.slurm_snapshot();
        let version = EPOCH_MS + self.now;
        self.list_jobs_and_partitions(jobs, parts, forget, version);
    }

    fn list_jobs_and_partitions(
        &mut self,
        jobs: Vec<(u64, Event)>,
        parts: Vec<(String, Event)>,
        forget: bool,
        version: u64,
    ) {
        let l = listing(&mut self.obs.slurm_jobs, jobs, forget, |id| {
            Event::SlurmJobGone {
                job_id: *id,
                version,
            }
        });
        self.framed(Domain::SlurmJobs, l);
        let l = listing(&mut self.obs.slurm_parts, parts, forget, |name| {
            Event::SlurmPartitionGone {
                name: name.clone(),
                version,
            }
        });
        self.framed(Domain::SlurmPartitions, l);
    }

    /// A full listing of Slurm jobs.
    pub(crate) fn slurm_relist_jobs(&mut self, forget: bool) {
        let (_, jobs, _) = self.slurm_snapshot();
        let version = 0;
        let l = listing(&mut self.obs.slurm_jobs, jobs, forget, |id| {
            Event::SlurmJobGone {
                job_id: *id,
                version,
            }
        });
        self.framed(Domain::SlurmJobs, l);
    }

    fn framed(&mut self, domain: Domain, events: Vec<Event>) {
        self.append(Source::Slurm, Event::SyncStarted { domain });
        for ev in events {
            self.append(Source::Slurm, ev);
        }
        self.append(Source::Slurm, Event::SyncDone { domain });
    }
}

/// A Slurm node as slurmrestd reports it.
pub(crate) fn slurm_node(n: &super::slurm::SNode, version: u64) -> SlurmNode {
    let mut flags = Vec::new();
    if n.drain.is_some() {
        flags.push(SlurmNodeFlag::Drain);
    }
    if n.completing > 0 {
        flags.push(SlurmNodeFlag::Completing);
    }
    if n.not_responding {
        flags.push(SlurmNodeFlag::NotResponding);
    }
    flags.sort();
    let mut features: Vec<Text> = n.features.iter().map(|f| f.as_str().into()).collect();
    features.sort();
    SlurmNode {
        name: n.name.as_str().into(),
        state: n.base.clone(),
        flags,
        reason: n.reason.as_ref().map(|r| r.0.clone()),
        reason_user: n.reason.as_ref().map(|r| r.1.clone()),
        features,
        topology: n.topology.as_deref().map(Text::from),
        partitions: vec![n.partition.as_str().into()],
        version,
    }
}

/// The changed objects of `now` against `last` (updated), then Gone events.
fn diff<K: Ord + Clone>(
    last: &mut BTreeMap<K, Event>,
    now: Vec<(K, Event)>,
    gone: impl Fn(&K) -> Event,
) -> Vec<Event> {
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (k, ev) in now {
        seen.insert(k.clone());
        if last.get(&k).map(unversioned) != Some(unversioned(&ev)) {
            last.insert(k, ev.clone());
            out.push(ev);
        }
    }
    let left: Vec<K> = last
        .keys()
        .filter(|k| !seen.contains(*k))
        .cloned()
        .collect();
    for k in left {
        last.remove(&k);
        out.push(gone(&k));
    }
    out
}

/// Every object of `now`, then Gone events for known ones not listed
/// (none after a restart, which knows nothing).
fn listing<K: Ord + Clone>(
    last: &mut BTreeMap<K, Event>,
    now: Vec<(K, Event)>,
    forget: bool,
    gone: impl Fn(&K) -> Event,
) -> Vec<Event> {
    let mut out = Vec::new();
    let mut fresh = BTreeMap::new();
    for (k, ev) in now {
        fresh.insert(k, ev.clone());
        out.push(ev);
    }
    if !forget {
        for k in last.keys().filter(|k| !fresh.contains_key(*k)) {
            out.push(gone(k));
        }
    }
    *last = fresh;
    out
}
