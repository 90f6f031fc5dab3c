//! The Kubernetes side of the world: the API server's objects with their
//! resourceVersions, the StatefulSet and ReplicaSet controllers, the
//! scheduler, the node lifecycle controller, PodGC and the kubelets.
//!
//! What each part follows (kubernetes.io documentation):
//!
//! - StatefulSet ("Deployment and Scaling Guarantees", "Pod Management
//!   Policies"): pods `<set>-<ordinal>`; with OrderedReady a pod is created
//!   only when all its predecessors are Running and Ready, scale-down
//!   removes the highest ordinal first, one at a time, and only while every
//!   other pod is Running and Ready; with Parallel all missing pods are
//!   created and all condemned pods deleted at once. A pod below `replicas`
//!   that is gone is created again (new UID) once its old object is gone: a
//!   pod still terminating is never replaced (at most one pod per identity,
//!   "Force Delete StatefulSet Pods"). Update strategies ("Rolling
//!   Updates"): OnDelete, a new revision reaches a pod only when the pod is
//!   deleted (the scaled set: lockstep replaces its pods); RollingUpdate, the
//!   controller deletes the highest ordinal not at the update revision once
//!   every pod is Running and Ready, one at a time (the fixed set).
//! - ReplicaSet ("ReplicaSet": pod deletion cost; the scale-down order of
//!   `ActivePodsWithRanks`): unscheduled first, then Pending < Unknown <
//!   Running, not ready before ready, lower
//!   `controller.kubernetes.io/pod-deletion-cost` first, pods on nodes with
//!   more replicas first, shorter ready time first, more restarts first,
//!   newer first (times compared in log2 buckets, LogarithmicScaleDown).
//! - Pod lifecycle: graceful deletion sets `deletionTimestamp`; the kubelet
//!   stops the containers and the object goes away after they stopped (at
//!   most the grace period). A force delete removes the object at once; the
//!   kubelet kills the containers when it notices. A pod on a dead kubelet
//!   stays Running in the API; its deletion never completes.
//! - Node status ("Node status", "Taint based evictions"): a dead kubelet's
//!   node turns Ready=Unknown after `--node-monitor-grace-period`; the node
//!   lifecycle controller marks its pods not Ready and taints the node
//!   (unreachable / not-ready, NoExecute); pods are evicted after their
//!   toleration (300 s by default), with a `DisruptionTarget` condition.
//! - The eviction API respects a PodDisruptionBudget: a pod that carries
//!   the busy label (selected by a PDB with maxUnavailable 0) is not evicted.
//! - PodGC deletes pods bound to a node that no longer exists.
//! - A pod created during the run pulls its image (`Setup::image_pull_s`)
//!   before its containers start: Pending, ContainerCreating, then
//!   Running, and Ready after its readiness probe.
//! - The scheduler binds a pending pod to a Ready, schedulable node whose
//!   taints it tolerates (slurmd pods tolerate none of lockstep's), spreading
//!   pods over nodes.
//!
//! It never looks at lockstep's state; it only takes changes from the
//! schedule's steps and from lockstep's actuators.

use std::collections::BTreeMap;

use lockstep_schemas::{ConditionStatus, PodCondition, PodPhase, Taint, TaintEffect};

use super::schedule::{
    self, PodRef, ScaledKind, FIXED_PARTITION, FIXED_SET, RACK_LABEL, SCALED_PARTITION, SCALED_SET,
    XID_CONDITION, ZONE_LABEL,
};
use super::{observe::Kind, Actor, Ev, Ms, World};

/// What a host (the machine under a Kubernetes node) is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Host {
    /// kubelet and containers run.
    Up,
    /// kubelet runs but reports NotReady (container runtime trouble);
    /// running containers go on, new ones do not start.
    NotReady,
    /// Machine down: kubelet and containers stopped.
    Dead,
    /// Machine booting after being dead.
    Booting,
    /// Decommissioned.
    Gone,
}

/// A Kubernetes node.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub name: String,
    pub rv: u64,
    pub unschedulable: bool,
    pub cordoned_since: Ms,
    pub ready: ConditionStatus,
    /// Since when Ready has not been True.
    pub not_ready_since: Option<Ms>,
    pub host: Host,
    /// Bumped at each host change: monitor events of an older epoch are void.
    pub epoch: u64,
    /// Who made the host unhealthy (for evictions that follow).
    pub broken_by: Actor,
    /// Node conditions (type -> status, since).
    pub conditions: BTreeMap<String, (ConditionStatus, Ms)>,
    pub labels: BTreeMap<String, String>,
    /// Annotations with who set them.
    pub annotations: BTreeMap<String, (String, Actor)>,
    /// Taints lockstep (or anyone) set, with who set them.
    pub taints: Vec<(Taint, Actor)>,
    /// The node lifecycle controller's NoExecute taint (not-ready / unreachable).
    pub lifecycle_taint: bool,
}

/// A container's state, as far as slurmd is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Containers {
    /// Not started yet (or waiting for the host).
    Waiting,
    /// Running: slurmd is up (instance `Pod::instance`).
    Running,
    /// Stopped.
    Stopped,
}

/// A slurmd pod.
#[derive(Debug, Clone)]
pub(crate) struct Pod {
    pub name: String,
    pub uid: String,
    pub rv: u64,
    /// Index into `Kube::sets`.
    pub set: usize,
    /// StatefulSet ordinal.
    pub ordinal: Option<u32>,
    pub node: Option<String>,
    pub bound_ms: Ms,
    pub phase: PodPhase,
    pub ready: bool,
    pub ready_since: Option<Ms>,
    pub containers: Containers,
    /// Bumped at every container start: one slurmd process each.
    pub instance: u64,
    pub restarts: u32,
    /// deletionTimestamp, and who asked for the deletion.
    pub deletion: Option<(Ms, Actor)>,
    pub disruption_target: bool,
    /// Labels with who set them.
    pub labels: BTreeMap<String, (String, Actor)>,
    /// Conditions (beyond Ready and DisruptionTarget) with who set them.
    pub conditions: BTreeMap<String, (PodCondition, Actor)>,
    pub revision: Option<String>,
    pub created_ms: Ms,
    /// Annotations with who set them.
    pub annotations: BTreeMap<String, (String, Actor)>,
}

/// The annotation a ReplicaSet ranks pods by on scale-down.
pub(crate) const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

impl Pod {
    /// `controller.kubernetes.io/pod-deletion-cost` (0 when not set; the
    /// API server accepts only int32 values).
    pub fn deletion_cost(&self) -> i64 {
        self.annotations
            .get(DELETION_COST)
            .and_then(|(v, _)| v.parse::<i32>().ok())
            .map_or(0, i64::from)
    }

    /// Running, not terminating, not evicted: what "the pod is up" means.
    pub fn up(&self) -> bool {
        self.phase == PodPhase::Running && self.deletion.is_none() && !self.disruption_target
    }
}

/// How a workload manages its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkloadKind {
    StatefulSet { ordered: bool },
    ReplicaSet,
}

/// A StatefulSet or ReplicaSet.
#[derive(Debug, Clone)]
pub(crate) struct Workload {
    pub name: String,
    pub kind: WorkloadKind,
    pub replicas: u32,
    /// Who set `spec.replicas` last.
    pub replicas_by: Actor,
    pub partition: String,
    pub update_revision: Option<String>,
    pub revisions: u32,
    /// `updateStrategy: RollingUpdate` (else OnDelete).
    pub rolling: bool,
    /// Who changed the template last.
    pub revision_by: Actor,
    pub ready_replicas: u32,
    pub rv: u64,
    pub pods_created: u64,
}

/// The API server's objects.
#[derive(Debug, Default)]
pub(crate) struct Kube {
    pub rv: u64,
    pub nodes: BTreeMap<String, Node>,
    /// Deleted nodes, with when and by whom.
    pub deleted_nodes: BTreeMap<String, (Ms, Actor)>,
    pub pods: BTreeMap<String, Pod>,
    pub sets: Vec<Workload>,
    /// Since when each pod name has had no pod that is up.
    pub pod_down_since: BTreeMap<String, Ms>,
    /// Removed pods that were bound to a node: pod name, node, when. What
    /// a controller saw on a node a moment ago may be gone by the time its
    /// action arrives.
    pub removed_from: Vec<(String, String, Ms)>,
    uids: u64,
    controllers_due: bool,
}

const ZONES: [&str; 3] = ["a", "b", "c"];
const RACKS: [&str; 3] = ["r1", "r2", "r3"];

impl Kube {
    pub fn pods_of(&self, set: usize) -> impl Iterator<Item = &Pod> {
        self.pods.values().filter(move |p| p.set == set)
    }
}

/// log2 bucket of an age, as LogarithmicScaleDown compares times.
fn log_bucket(age_ms: u64) -> u32 {
    64 - (age_ms / 1000 + 1).leading_zeros()
}

impl World {
    /// The cluster at time 0: nodes, sets, pods running and registered.
    pub(crate) fn build_cluster(&mut self) {
        for i in 0..self.setup.kube_nodes {
            let name = format!("k8s-{i}");
            let mut labels = BTreeMap::new();
            labels.insert(ZONE_LABEL.to_owned(), ZONES[usize::from(i) % 2].to_owned());
            labels.insert(RACK_LABEL.to_owned(), RACKS[usize::from(i) % 3].to_owned());
            self.kube.rv += 1;
            self.kube.nodes.insert(
                name.clone(),
                Node {
                    name,
                    rv: self.kube.rv,
                    unschedulable: false,
                    cordoned_since: 0,
                    ready: ConditionStatus::True,
                    not_ready_since: None,
                    host: Host::Up,
                    epoch: 0,
                    broken_by: Actor::Setup,
                    conditions: BTreeMap::new(),
                    labels,
                    annotations: BTreeMap::new(),
                    taints: Vec::new(),
                    lifecycle_taint: false,
                },
            );
        }
        let scaled_kind = match self.setup.scaled_kind {
            ScaledKind::OrderedReady => WorkloadKind::StatefulSet { ordered: true },
            ScaledKind::Parallel => WorkloadKind::StatefulSet { ordered: false },
            ScaledKind::ReplicaSet => WorkloadKind::ReplicaSet,
        };
        // The scaled set is OnDelete (lockstep replaces its pods); the
        // fixed set rolls itself (RollingUpdate).
        let sets = [
            (
                SCALED_SET,
                scaled_kind,
                u32::from(self.setup.scaled_min),
                SCALED_PARTITION,
                false,
            ),
            (
                FIXED_SET,
                WorkloadKind::StatefulSet { ordered: true },
                u32::from(self.setup.fixed_replicas),
                FIXED_PARTITION,
                true,
            ),
        ];
        for (name, kind, replicas, partition, rolling) in sets {
            self.kube.rv += 1;
            self.kube.sets.push(Workload {
                name: name.to_owned(),
                kind,
                replicas,
                replicas_by: Actor::Setup,
                partition: partition.to_owned(),
                update_revision: match kind {
                    WorkloadKind::StatefulSet { .. } => Some(format!("{name}-rev1")),
                    WorkloadKind::ReplicaSet => None,
                },
                revisions: 1,
                rolling,
                revision_by: Actor::Setup,
                ready_replicas: 0,
                rv: self.kube.rv,
                pods_created: 0,
            });
        }
        // Pods of the initial replicas, already bound, running, Ready and
        // registered with slurmctld.
        for set in 0..self.kube.sets.len() {
            for ord in 0..self.kube.sets[set].replicas {
                let name = self.create_pod(set, ord);
                let node = self
                    .pick_node()
                    .expect("a fresh cluster has schedulable nodes");
                let p = self.kube.pods.get_mut(&name).expect("just created");
                p.node = Some(node);
                p.phase = PodPhase::Running;
                p.containers = Containers::Running;
                p.instance = 1;
                p.ready = true;
                p.ready_since = Some(0);
                let partition = self.kube.sets[set].partition.clone();
                self.slurm_register_node(&name, &partition, 1);
                self.pod_written(&name);
            }
            self.update_status(set);
        }
    }

    fn next_uid(&mut self) -> String {
        self.kube.uids += 1;
        format!("uid-{:04}", self.kube.uids)
    }

    /// Creates a pod of `set` (ordinal `ord` for a StatefulSet); returns its name.
    fn create_pod(&mut self, set: usize, ord: u32) -> String {
        let uid = self.next_uid();
        let w = &mut self.kube.sets[set];
        w.pods_created += 1;
        let (name, ordinal) = match w.kind {
            WorkloadKind::StatefulSet { .. } => (format!("{}-{ord}", w.name), Some(ord)),
            WorkloadKind::ReplicaSet => {
                // ReplicaSet pods get a generated suffix (five characters).
                let mut h = w.pods_created.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20;
                let mut s = String::new();
                for _ in 0..5 {
                    s.push(b"bcdfghjklmnpqrstvwxz2456789"[(h % 27) as usize] as char);
                    h /= 27;
                }
                (format!("{}-{s}", w.name), None)
            }
        };
        let revision = w.update_revision.clone();
        self.kube.pods.insert(
            name.clone(),
            Pod {
                name: name.clone(),
                uid,
                rv: 0,
                set,
                ordinal,
                node: None,
                bound_ms: self.now,
                phase: PodPhase::Pending,
                ready: false,
                ready_since: None,
                containers: Containers::Waiting,
                instance: 0,
                restarts: 0,
                deletion: None,
                disruption_target: false,
                labels: BTreeMap::new(),
                conditions: BTreeMap::new(),
                revision,
                created_ms: self.now,
                annotations: BTreeMap::new(),
            },
        );
        self.pod_written(&name);
        name
    }

    /// Records a write to a pod: new resourceVersion, a watch event, the
    /// controllers look again.
    pub(crate) fn pod_written(&mut self, name: &str) {
        self.kube.rv += 1;
        let rv = self.kube.rv;
        if let Some(p) = self.kube.pods.get_mut(name) {
            p.rv = rv;
            let snap = p.clone();
            self.obs_pod(snap);
        }
        self.refresh_pod_down(name);
        self.controllers_soon();
    }

    fn pod_removed(&mut self, name: &str) {
        if let Some(p) = self.kube.pods.remove(name) {
            self.kube.rv += 1;
            let rv = self.kube.rv;
            self.obs_gone(Kind::Pods, name.to_owned(), rv);
            if let Some(node) = p.node {
                let now = self.now;
                self.kube.removed_from.push((p.name, node, now));
            }
        }
        self.refresh_pod_down(name);
        self.controllers_soon();
    }

    pub(crate) fn node_written(&mut self, name: &str) {
        self.kube.rv += 1;
        let rv = self.kube.rv;
        if let Some(n) = self.kube.nodes.get_mut(name) {
            n.rv = rv;
            let snap = n.clone();
            self.obs_node(snap);
        }
        self.controllers_soon();
    }

    pub(crate) fn set_written(&mut self, set: usize) {
        self.kube.rv += 1;
        let rv = self.kube.rv;
        self.kube.sets[set].rv = rv;
        let snap = self.kube.sets[set].clone();
        self.obs_target(snap);
        self.controllers_soon();
    }

    fn refresh_pod_down(&mut self, name: &str) {
        let up = self.kube.pods.get(name).is_some_and(Pod::up);
        if up {
            self.kube.pod_down_since.remove(name);
        } else {
            let now = self.now;
            self.kube
                .pod_down_since
                .entry(name.to_owned())
                .or_insert(now);
        }
    }

    fn controllers_soon(&mut self) {
        if !self.kube.controllers_due {
            self.kube.controllers_due = true;
            self.at(100, Ev::Controllers);
        }
    }

    /// One pass of the controllers and the scheduler.
    pub(crate) fn reconcile(&mut self) {
        self.kube.controllers_due = false;
        for set in 0..self.kube.sets.len() {
            match self.kube.sets[set].kind {
                WorkloadKind::StatefulSet { ordered } => self.statefulset(set, ordered),
                WorkloadKind::ReplicaSet => self.replicaset(set),
            }
            self.update_status(set);
        }
        self.schedule_pods();
    }

    fn update_status(&mut self, set: usize) {
        let ready = self
            .kube
            .pods_of(set)
            .filter(|p| p.ready && p.deletion.is_none())
            .count() as u32;
        if self.kube.sets[set].ready_replicas != ready {
            self.kube.sets[set].ready_replicas = ready;
            self.set_written(set);
        }
    }

    fn healthy(p: &Pod) -> bool {
        p.phase == PodPhase::Running && p.ready && p.deletion.is_none()
    }

    /// The StatefulSet controller, one pass (see the module doc).
    fn statefulset(&mut self, set: usize, ordered: bool) {
        let w = &self.kube.sets[set];
        let replicas = w.replicas;
        let name = w.name.clone();
        let mut by_ord: BTreeMap<u32, Pod> = self
            .kube
            .pods_of(set)
            .filter_map(|p| Some((p.ordinal?, p.clone())))
            .collect();
        for ord in 0..replicas {
            match by_ord.get(&ord) {
                None => {
                    let pod = self.create_pod(set, ord);
                    debug_assert_eq!(pod, format!("{name}-{ord}"));
                    if ordered {
                        return;
                    }
                }
                Some(p) if !Self::healthy(p) => {
                    if ordered {
                        return;
                    }
                }
                Some(_) => {}
            }
        }
        let condemned: Vec<Pod> = by_ord.split_off(&replicas).into_values().rev().collect();
        let by = self.kube.sets[set].replicas_by.clone();
        let mut condemned_left = false;
        for p in condemned {
            condemned_left = true;
            if p.deletion.is_some() {
                if ordered {
                    return;
                }
                continue;
            }
            self.delete_pod(&p.name, &by);
            if ordered {
                return;
            }
        }
        // RollingUpdate: once every pod is Running and Ready, the highest
        // ordinal not at the update revision is deleted (and recreated at
        // it); one at a time whatever the pod management policy.
        let w = &self.kube.sets[set];
        if !w.rolling || condemned_left {
            return;
        }
        let pods: Vec<&Pod> = by_ord.values().collect();
        if pods.len() < replicas as usize || !pods.iter().all(|p| Self::healthy(p)) {
            return;
        }
        let stale = pods
            .iter()
            .rev()
            .find(|p| p.revision != w.update_revision)
            .map(|p| p.name.clone());
        if let Some(name) = stale {
            let by = w.revision_by.clone();
            self.delete_pod(&name, &by);
        }
    }

    /// The ReplicaSet controller, one pass (see the module doc).
    fn replicaset(&mut self, set: usize) {
        let replicas = self.kube.sets[set].replicas as usize;
        let active: Vec<Pod> = self
            .kube
            .pods_of(set)
            .filter(|p| p.deletion.is_none())
            .cloned()
            .collect();
        if active.len() < replicas {
            for _ in active.len()..replicas {
                self.create_pod(set, 0);
            }
            return;
        }
        let extra = active.len() - replicas;
        if extra == 0 {
            return;
        }
        let ranked = self.rank_for_deletion(active);
        let by = self.kube.sets[set].replicas_by.clone();
        for p in ranked.into_iter().take(extra) {
            self.delete_pod(&p.name, &by);
        }
    }

    /// Active pods in the order a ReplicaSet deletes them.
    pub(crate) fn rank_for_deletion(&self, mut pods: Vec<Pod>) -> Vec<Pod> {
        let mut on_node: BTreeMap<String, usize> = BTreeMap::new();
        for p in &pods {
            if let Some(n) = &p.node {
                *on_node.entry(n.clone()).or_default() += 1;
            }
        }
        let now = self.now;
        let phase_rank = |p: &Pod| match p.phase {
            PodPhase::Pending => 0,
            PodPhase::Unknown => 1,
            _ => 2,
        };
        pods.sort_by_key(|p| {
            (
                p.node.is_some(),
                phase_rank(p),
                p.ready,
                p.deletion_cost(),
                std::cmp::Reverse(p.node.as_ref().map_or(0, |n| on_node[n])),
                p.ready_since.map(|t| log_bucket(now - t)),
                std::cmp::Reverse(p.restarts),
                log_bucket(now - p.created_ms),
                p.name.clone(),
            )
        });
        pods
    }

    /// Binds pending pods to nodes.
    fn schedule_pods(&mut self) {
        let pending: Vec<String> = self
            .kube
            .pods
            .values()
            .filter(|p| p.node.is_none() && p.deletion.is_none())
            .map(|p| p.name.clone())
            .collect();
        for name in pending {
            let Some(node) = self.pick_node() else {
                return;
            };
            // A new pod pulls its image first (ContainerCreating).
            let pull = u64::from(self.setup.image_pull_s) * 1000;
            let lat = self.rng.between(self.cfg.pod_start_ms) + pull;
            let p = self.kube.pods.get_mut(&name).expect("listed");
            p.node = Some(node);
            p.bound_ms = self.now;
            let uid = p.uid.clone();
            self.pod_written(&name);
            self.at(lat, Ev::ContainersStart { uid });
        }
    }

    /// The node the scheduler picks for a new slurmd pod, if any fits.
    fn pick_node(&self) -> Option<String> {
        self.kube
            .nodes
            .values()
            .filter(|n| {
                n.ready == ConditionStatus::True
                    && !n.unschedulable
                    && !n.lifecycle_taint
                    && n.taints
                        .iter()
                        .all(|(t, _)| t.effect == TaintEffect::PreferNoSchedule)
            })
            .min_by_key(|n| {
                (
                    self.kube
                        .pods
                        .values()
                        .filter(|p| p.node.as_deref() == Some(&n.name))
                        .count(),
                    n.name.clone(),
                )
            })
            .map(|n| n.name.clone())
    }

    fn pod_by_uid(&self, uid: &str) -> Option<&Pod> {
        self.kube.pods.values().find(|p| p.uid == uid)
    }

    fn host_of(&self, pod: &Pod) -> Option<Host> {
        pod.node
            .as_ref()
            .map(|n| self.kube.nodes.get(n).map_or(Host::Gone, |n| n.host))
    }

    /// The kubelet starts a pod's containers (if it can).
    pub(crate) fn containers_start(&mut self, uid: &str) {
        let Some(p) = self.pod_by_uid(uid) else {
            return;
        };
        if p.deletion.is_some() || p.containers == Containers::Running {
            return;
        }
        // A kubelet that is down or whose runtime is broken starts nothing;
        // it starts the pod when it is back (`kubelet_up` / `kubelet_recovers`).
        if self.host_of(p) != Some(Host::Up) {
            return;
        }
        let name = p.name.clone();
        if self.setup.image_pull_s > 0 {
            self.facts.last_pulled_start_ms = self.now;
        }
        let p = self.kube.pods.get_mut(&name).expect("found");
        p.containers = Containers::Running;
        p.phase = PodPhase::Running;
        p.instance += 1;
        let instance = p.instance;
        self.pod_written(&name);
        let uid = uid.to_owned();
        self.at(self.cfg.pod_ready_ms, Ev::PodReady { uid: uid.clone() });
        self.at(
            self.cfg.slurmd_register_ms,
            Ev::SlurmdRegister { uid, instance },
        );
    }

    /// The readiness probe passes.
    pub(crate) fn pod_ready(&mut self, uid: &str) {
        let Some(p) = self.pod_by_uid(uid) else {
            return;
        };
        let node_ok = p
            .node
            .as_ref()
            .and_then(|n| self.kube.nodes.get(n))
            .is_some_and(|n| n.ready == ConditionStatus::True);
        if p.containers != Containers::Running || p.ready || p.deletion.is_some() || !node_ok {
            return;
        }
        let name = p.name.clone();
        let node = p.node.clone();
        let p = self.kube.pods.get_mut(&name).expect("found");
        p.ready = true;
        p.ready_since = Some(self.now);
        self.pod_written(&name);
        // A worker pod that turns Ready is reconciled by Slinky's operator
        // like a cordon change is (its sync is level-triggered).
        if let Some(node) = node {
            self.slinky_node_changed(&node);
        }
    }

    /// Stops a pod's containers now; slurmd dies with them.
    fn stop_containers(&mut self, name: &str, by: &Actor, how: &str) {
        let Some(p) = self.kube.pods.get_mut(name) else {
            return;
        };
        if p.containers != Containers::Running {
            p.containers = Containers::Stopped;
            return;
        }
        p.containers = Containers::Stopped;
        p.ready = false;
        let instance = p.instance;
        self.pod_written(name);
        self.slurmd_stopped(name, instance, by, how);
    }

    /// Graceful deletion (`kubectl delete`, a controller, lockstep): sets
    /// deletionTimestamp; a live kubelet stops the containers and the object
    /// goes away.
    pub(crate) fn delete_pod(&mut self, name: &str, by: &Actor) {
        let Some(p) = self.kube.pods.get_mut(name) else {
            return;
        };
        if p.deletion.is_some() {
            return;
        }
        p.deletion = Some((self.now, by.clone()));
        let uid = p.uid.clone();
        let bound = p.node.is_some();
        let host = self.kube.pods.get(name).and_then(|p| self.host_of(p));
        self.pod_written(name);
        if !bound {
            // Nothing runs: the API server removes it at once.
            self.pod_removed(name);
            return;
        }
        if matches!(host, Some(Host::Up | Host::NotReady)) {
            self.slinky_pod_terminating(&uid);
            self.at(1_000, Ev::ContainersStopped { uid });
        }
    }

    pub(crate) fn containers_stopped(&mut self, uid: &str) {
        let Some(p) = self.pod_by_uid(uid) else {
            return;
        };
        let name = p.name.clone();
        let Some((_, by)) = p.deletion.clone() else {
            return;
        };
        self.stop_containers(&name, &by, "its pod was deleted");
        self.at(
            1_000,
            Ev::PodFinalized {
                uid: uid.to_owned(),
            },
        );
    }

    pub(crate) fn pod_finalized(&mut self, uid: &str) {
        let Some(p) = self.pod_by_uid(uid) else {
            return;
        };
        if p.deletion.is_some() && p.containers != Containers::Running {
            let name = p.name.clone();
            self.pod_removed(&name);
        }
    }

    /// `kubectl delete pod --force --grace-period=0`, or PodGC.
    fn force_remove(&mut self, name: &str, by: &Actor, how: &str) {
        let Some(p) = self.kube.pods.get(name) else {
            return;
        };
        let host = self.host_of(p);
        // The kubelet kills the containers of a pod it no longer finds in
        // the API (right away here; it takes it a sync period in reality).
        if matches!(host, Some(Host::Up | Host::NotReady)) {
            self.stop_containers(name, by, how);
        }
        self.pod_removed(name);
    }

    pub(crate) fn force_delete(&mut self, r: PodRef, by: &Actor) {
        if let Some(name) = self.pod_name(r) {
            self.force_remove(&name, by, "its pod was force deleted");
        }
    }

    /// The eviction API (`kubectl drain`).
    pub(crate) fn evict(&mut self, r: PodRef, by: &Actor) {
        let Some(name) = self.pod_name(r) else {
            return;
        };
        let p = &self.kube.pods[&name];
        // A PodDisruptionBudget with maxUnavailable 0 selects the busy label.
        if p.labels.contains_key(schedule::BUSY_LABEL) || p.deletion.is_some() {
            return;
        }
        let p = self.kube.pods.get_mut(&name).expect("found");
        p.disruption_target = true;
        self.delete_pod(&name, by);
    }

    pub(crate) fn set_cordon(&mut self, node: u8, on: bool, _by: &Actor) {
        let name = self.node_name(node);
        let now = self.now;
        let Some(n) = self.kube.nodes.get_mut(&name) else {
            return;
        };
        if n.unschedulable == on {
            return;
        }
        n.unschedulable = on;
        n.cordoned_since = now;
        self.node_written(&name);
        self.slinky_node_changed(&name);
    }

    fn set_ready(&mut self, name: &str, ready: ConditionStatus) {
        let now = self.now;
        let n = self.kube.nodes.get_mut(name).expect("caller checked");
        if n.ready == ready {
            return;
        }
        n.ready = ready;
        if ready == ConditionStatus::True {
            n.not_ready_since = None;
            n.lifecycle_taint = false;
        } else {
            n.not_ready_since.get_or_insert(now);
            n.lifecycle_taint = true;
        }
        self.node_written(name);
        if ready != ConditionStatus::True {
            // The node lifecycle controller marks the node's pods not Ready.
            let pods: Vec<String> = self
                .kube
                .pods
                .values()
                .filter(|p| p.node.as_deref() == Some(name) && p.ready)
                .map(|p| p.name.clone())
                .collect();
            for p in pods {
                self.kube.pods.get_mut(&p).expect("listed").ready = false;
                self.pod_written(&p);
            }
        }
    }

    /// The kubelet reports NotReady; returns whether anything changed.
    pub(crate) fn kubelet_not_ready(&mut self, node: u8, by: &Actor) -> bool {
        let name = self.node_name(node);
        let Some(n) = self.kube.nodes.get_mut(&name) else {
            return false;
        };
        if n.host != Host::Up {
            return false;
        }
        n.host = Host::NotReady;
        n.epoch += 1;
        n.broken_by = by.clone();
        let epoch = n.epoch;
        self.set_ready(&name, ConditionStatus::False);
        // Taint-based eviction after the default toleration.
        self.at(
            self.cfg.eviction_toleration_ms,
            Ev::NodeMonitor { node: name, epoch },
        );
        true
    }

    pub(crate) fn kubelet_recovers(&mut self, node: u8) {
        let name = self.node_name(node);
        let Some(n) = self.kube.nodes.get_mut(&name) else {
            return;
        };
        if n.host != Host::NotReady {
            return;
        }
        n.host = Host::Up;
        n.epoch += 1;
        self.set_ready(&name, ConditionStatus::True);
        self.kubelet_resyncs(&name);
    }

    /// A kubelet that is (again) healthy looks at the pods bound to it.
    fn kubelet_resyncs(&mut self, node: &str) {
        let pods: Vec<Pod> = self
            .kube
            .pods
            .values()
            .filter(|p| p.node.as_deref() == Some(node))
            .cloned()
            .collect();
        for p in pods {
            if p.deletion.is_some() {
                if p.containers == Containers::Running {
                    self.at(1_000, Ev::ContainersStopped { uid: p.uid });
                } else {
                    self.pod_removed(&p.name);
                }
            } else if p.containers == Containers::Running {
                self.at(self.cfg.pod_ready_ms, Ev::PodReady { uid: p.uid });
            } else {
                let lat = self.rng.between(self.cfg.pod_start_ms);
                if p.containers == Containers::Stopped {
                    self.kube.pods.get_mut(&p.name).expect("listed").restarts += 1;
                }
                self.at(lat, Ev::ContainersStart { uid: p.uid });
            }
        }
    }

    pub(crate) fn host_dies(&mut self, node: u8, by: &Actor) {
        let name = self.node_name(node);
        let Some(n) = self.kube.nodes.get_mut(&name) else {
            return;
        };
        if matches!(n.host, Host::Dead | Host::Gone) {
            return;
        }
        n.host = Host::Dead;
        n.epoch += 1;
        n.broken_by = by.clone();
        let epoch = n.epoch;
        let pods: Vec<String> = self
            .kube
            .pods
            .values()
            .filter(|p| p.node.as_deref() == Some(&name))
            .map(|p| p.name.clone())
            .collect();
        for p in pods {
            self.stop_containers(&p, by, "its host died");
        }
        // The API server still says Ready until the grace period is over.
        self.at(
            self.cfg.node_monitor_grace_ms,
            Ev::NodeMonitor { node: name, epoch },
        );
    }

    /// The node lifecycle controller's periodic look at a node.
    pub(crate) fn node_monitor(&mut self, name: &str, epoch: u64) {
        let Some(n) = self.kube.nodes.get(name) else {
            return;
        };
        if n.epoch != epoch {
            return;
        }
        match n.host {
            Host::Dead | Host::Booting if n.ready == ConditionStatus::True => {
                self.set_ready(name, ConditionStatus::Unknown);
                self.at(
                    self.cfg.eviction_toleration_ms,
                    Ev::NodeMonitor {
                        node: name.to_owned(),
                        epoch,
                    },
                );
            }
            Host::Dead | Host::Booting | Host::NotReady => {
                // Taint-based eviction: the toleration of the NoExecute
                // taint ran out.
                let by = n.broken_by.clone();
                let pods: Vec<String> = self
                    .kube
                    .pods
                    .values()
                    .filter(|p| p.node.as_deref() == Some(name) && p.deletion.is_none())
                    .map(|p| p.name.clone())
                    .collect();
                for p in pods {
                    self.kube
                        .pods
                        .get_mut(&p)
                        .expect("listed")
                        .disruption_target = true;
                    self.delete_pod(&p, &by);
                }
            }
            Host::Up | Host::Gone => {}
        }
    }

    pub(crate) fn host_back(&mut self, node: u8) {
        let name = self.node_name(node);
        let Some(n) = self.kube.nodes.get_mut(&name) else {
            return;
        };
        if n.host != Host::Dead {
            return;
        }
        n.host = Host::Booting;
        n.epoch += 1;
        let epoch = n.epoch;
        self.at(10_000, Ev::KubeletUp { node: name, epoch });
    }

    pub(crate) fn kubelet_up(&mut self, name: &str, epoch: u64) {
        let Some(n) = self.kube.nodes.get_mut(name) else {
            return;
        };
        if n.epoch != epoch || n.host != Host::Booting {
            return;
        }
        n.host = Host::Up;
        n.epoch += 1;
        self.set_ready(name, ConditionStatus::True);
        self.kubelet_resyncs(name);
    }

    /// The host is decommissioned and its Node object deleted; PodGC then
    /// removes the pods still bound to it.
    pub(crate) fn delete_node(&mut self, node: u8, by: &Actor) {
        let name = self.node_name(node);
        if !self.kube.nodes.contains_key(&name) {
            return;
        }
        self.host_dies(node, by);
        self.kube.nodes.remove(&name);
        self.kube
            .deleted_nodes
            .insert(name.clone(), (self.now, by.clone()));
        self.kube.rv += 1;
        let rv = self.kube.rv;
        self.obs_gone(Kind::Nodes, name.clone(), rv);
        self.at(self.cfg.podgc_orphan_ms, Ev::PodGc { node: name });
    }

    /// The names of the pods bound to `node`.
    pub(crate) fn pods_on(&self, node: &str) -> Vec<String> {
        self.kube
            .pods
            .values()
            .filter(|p| p.node.as_deref() == Some(node))
            .map(|p| p.name.clone())
            .collect()
    }

    pub(crate) fn pod_gc(&mut self, node: &str) {
        let pods = self.pods_on(node);
        let by = self
            .kube
            .deleted_nodes
            .get(node)
            .map_or(Actor::Setup, |(_, by)| by.clone());
        for p in pods {
            self.force_remove(&p, &by, "PodGC removed it from a deleted node");
        }
    }

    pub(crate) fn set_xid(&mut self, node: u8, on: bool) -> bool {
        let name = self.node_name(node);
        let now = self.now;
        let Some(n) = self.kube.nodes.get_mut(&name) else {
            return false;
        };
        let status = if on {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        if n.conditions.get(XID_CONDITION).map(|c| c.0) == Some(status) {
            return false;
        }
        n.conditions.insert(XID_CONDITION.to_owned(), (status, now));
        self.node_written(&name);
        true
    }

    pub(crate) fn relabel(&mut self, node: u8, rack: bool, value: u8) {
        let name = self.node_name(node);
        let Some(n) = self.kube.nodes.get_mut(&name) else {
            return;
        };
        let (key, v) = if rack {
            (RACK_LABEL, RACKS[usize::from(value) % 3])
        } else {
            (ZONE_LABEL, ZONES[usize::from(value) % 3])
        };
        if n.labels.get(key).map(String::as_str) == Some(v) {
            return;
        }
        n.labels.insert(key.to_owned(), v.to_owned());
        self.node_written(&name);
    }

    /// A StatefulSet's template changes: a new update revision.
    pub(crate) fn new_revision(&mut self, set: usize, by: &Actor) {
        let Some(w) = self.kube.sets.get_mut(set) else {
            return;
        };
        if !matches!(w.kind, WorkloadKind::StatefulSet { .. }) {
            return;
        }
        w.revisions += 1;
        w.update_revision = Some(format!("{}-rev{}", w.name, w.revisions));
        w.revision_by = by.clone();
        self.set_written(set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_buckets_grow_with_age() {
        // (age ms, bucket)
        let cases = [
            (0, 1),
            (999, 1),
            (1_000, 2),
            (3_000, 3),
            (7_000, 4),
            (60_000, 6),
        ];
        for (age, bucket) in cases {
            assert_eq!(log_bucket(age), bucket, "age {age}");
        }
    }
}
