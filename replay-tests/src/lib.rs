//! Incident logs and the simulator that writes them.
//!
//! [`Sim`] is a small virtual cluster: a Slurm side and a Kubernetes side
//! whose changes are appended to a log as the connectors would append them,
//! a reducer folding that log as the service would, and simulated actuators
//! that carry out the reducer's actions on the virtual cluster and report
//! outcomes back into the log. Time is virtual and moves only when told.
//!
//! Each incident in [`scenarios`] drives a `Sim` through one story and keeps
//! the resulting log; the tests check the committed log files and their
//! expected timelines against it.

use std::collections::BTreeMap;

use lockstep_engine::{Engine, Output, Phase, Transition};
use lockstep_schemas::{
    Action, ActionOutcome, ConditionStatus, Envelope, Event, EventRecord, IssuedAction, KubeNode,
    KubePod, KubeScaleTarget, NodeCondition, OutcomeResult, OwnerRef, PodPhase, Policy, Record,
    ScaleTargetRef, SlurmBaseState, SlurmJob, SlurmJobState, SlurmNode, SlurmNodeFlag, Source,
};

pub mod scenarios;
pub mod world;

/// 2026-03-01T03:00:00Z: incidents start at 03:00 so their timelines read
/// like a night on call.
pub const EPOCH_MS: u64 = 1_772_334_000_000;

/// A virtual Slurm + Kubernetes cluster, its log, and the reducer folding it.
pub struct Sim {
    engine: Engine,
    records: Vec<Record>,
    seq: u64,
    now_ms: u64,
    /// Actions issued and not yet carried out or failed.
    pending: Vec<IssuedAction>,
    /// Every transition so far.
    pub transitions: Vec<Transition>,
    /// Every action issued so far.
    pub actions: Vec<IssuedAction>,
    /// Slurm nodes as slurmctld has them.
    pub slurm: BTreeMap<String, SlurmNode>,
    /// Kubernetes nodes as the API server has them.
    pub kube: BTreeMap<String, KubeNode>,
    /// Pods as the API server has them, by `namespace/name`.
    pub pods: BTreeMap<String, KubePod>,
    /// Slurm jobs.
    pub jobs: BTreeMap<u64, SlurmJob>,
    /// StatefulSet-like scale targets and their controllers.
    pub sets: BTreeMap<String, SimSet>,
    /// Slurm reservations as slurmctld has them (the `SlurmReserve` actions
    /// carried out), by name.
    pub reservations: BTreeMap<String, Action>,
    /// Observations carry versions (see [`Sim::versioned`]).
    versioned: bool,
    /// The API server's last revision (etcd's counter).
    revision: u64,
    /// The Slurm observer's last poll generation.
    generation: u64,
    /// Kubernetes node labels the connector reports (see
    /// [`Sim::change_policy`]); `None`: all of them.
    label_filter: Option<Vec<String>>,
    /// The simulated actuators publish the changed object before they
    /// report the outcome (see [`observed_before_outcomes`]).
    observed_first: bool,
    /// Changes to Slurm nodes are made in slurmctld without being
    /// published: lockstep's poller has not come round yet
    /// ([`Sim::actuate_before_poll`]).
    poll_lags: bool,
    out: Output,
}

thread_local! {
    static OBSERVED_FIRST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every [`Sim`] it makes publishing an action's effect before
/// its outcome. Both orders happen on the real parts: the Kubernetes
/// actuator's outcome is appended once its PATCH returns, and the watch
/// event of the object it changed races it (it usually wins); the Slurm
/// observer's next poll may come before or after the actuator's report. The
/// incidents are written in the other order (outcome first); the reducer
/// must decide the same actions at the same times in both.
pub fn observed_before_outcomes<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            OBSERVED_FIRST.with(|o| o.set(self.0));
        }
    }
    let _reset = Reset(OBSERVED_FIRST.with(|o| o.replace(true)));
    f()
}

/// A StatefulSet as the simulator runs it: pods `<name>-<ordinal>` for
/// ordinals below `replicas`, spread over `nodes`, each registering a Slurm
/// node of the same name when it starts.
#[derive(Debug, Clone)]
pub struct SimSet {
    /// The scale target.
    pub target: ScaleTargetRef,
    /// `spec.replicas`.
    pub replicas: u32,
    /// The revision new pods get.
    pub revision: String,
    /// Kubernetes nodes the pods are spread over.
    pub nodes: Vec<String>,
    /// Pods created so far (for fresh UIDs).
    pub created: u64,
    /// How its controller removes pods when `replicas` drops.
    pub controller: SimController,
    /// Its Slurm nodes are in slurm.conf: they outlive their pods
    /// (NOT_RESPONDING while the pod is gone, their state and drain kept)
    /// instead of leaving Slurm with them.
    pub static_nodes: bool,
    /// New pods wait for their image (Pending, slurmd not started) until
    /// [`Sim::images_pulled`]; the set's first pods are there already.
    pub slow_pulls: bool,
    /// Its controller takes a new `replicas` but does not act on it until
    /// [`Sim::resume_controller`]: a StatefulSet whose pods are managed
    /// `OrderedReady` removes none while a pod below is not Running and
    /// Ready (its Kubernetes node NotReady, say).
    pub paused: bool,
}

/// The controller of a [`SimSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimController {
    /// Pods `<name>-<ordinal>` below `replicas`; the highest ordinals go
    /// first, a deleted lower one is recreated.
    StatefulSet,
    /// Pods `<name>-<n>`; when `replicas` drops, removes pods not Running
    /// and Ready first, then the lowest `pod-deletion-cost`, then the newest.
    ReplicaSet,
}

impl Sim {
    /// An empty cluster at [`EPOCH_MS`]; the policy is the log's first event.
    pub fn new(policy: Policy) -> Self {
        let mut sim = Self {
            engine: Engine::new(policy.clone()),
            records: Vec::new(),
            seq: 0,
            now_ms: EPOCH_MS,
            pending: Vec::new(),
            transitions: Vec::new(),
            actions: Vec::new(),
            slurm: BTreeMap::new(),
            kube: BTreeMap::new(),
            pods: BTreeMap::new(),
            jobs: BTreeMap::new(),
            reservations: BTreeMap::new(),
            sets: BTreeMap::new(),
            versioned: false,
            revision: 0,
            generation: 0,
            label_filter: None,
            observed_first: OBSERVED_FIRST.with(std::cell::Cell::get),
            poll_lags: false,
            out: Output::default(),
        };
        sim.append(Source::Lockstep, Event::PolicyChanged(Box::new(policy)));
        sim
    }

    /// The log so far (without a header).
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// The reducer.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Virtual time, ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Actions issued and not yet carried out.
    pub fn pending(&self) -> &[IssuedAction] {
        &self.pending
    }

    /// A Slurm node's phase in the reducer.
    pub fn phase(&self, node: &str) -> Phase {
        self.engine.phase(node)
    }

    /// From now on, observations carry their object's version as the real
    /// connectors stamp it: Kubernetes objects the API server's revision
    /// (one counter for all objects, as etcd's), Slurm objects the poll
    /// generation (the poll's time in ms, always above the last). Incidents
    /// written before versions existed leave it off.
    pub fn versioned(&mut self) -> &mut Self {
        self.versioned = true;
        self
    }

    fn stamp(&mut self, source: Source, event: &mut Event) {
        let v = match event {
            Event::SlurmNode(n) => &mut n.version,
            Event::SlurmJob(j) => &mut j.version,
            Event::SlurmPartition(p) => &mut p.version,
            Event::KubeNode(n) => &mut n.version,
            Event::KubePod(p) => &mut p.version,
            Event::KubeScaleTarget(t) => &mut t.version,
            Event::SlurmNodeGone { version, .. }
            | Event::SlurmJobGone { version, .. }
            | Event::SlurmPartitionGone { version, .. }
            | Event::KubeNodeGone { version, .. }
            | Event::KubePodGone { version, .. }
            | Event::KubeScaleTargetGone { version, .. } => version,
            _ => return,
        };
        *v = if source == Source::Slurm {
            self.generation = self.now_ms.max(self.generation + 1);
            self.generation
        } else {
            self.revision += 1;
            self.revision
        };
    }

    /// Appends one event, applies it, and keeps what the reducer decided.
    pub fn append(&mut self, source: Source, mut event: Event) -> &Output {
        if self.versioned {
            self.stamp(source, &mut event);
        }
        self.append_envelope(Envelope::new(source, self.now_ms, event))
    }

    /// Appends an envelope that was appended before (the same id, observed
    /// time and event) again, now: a publisher re-publishing after the log's
    /// deduplication window. Returns the sequence of the copy.
    pub fn redeliver(&mut self, seq: u64) -> u64 {
        let envelope = self
            .records
            .iter()
            .find_map(|r| match r {
                Record::Event(e) if e.seq == seq => Some(e.envelope.clone()),
                _ => None,
            })
            .expect("a record with this sequence");
        self.append_envelope(envelope);
        self.seq
    }

    /// The sequence of the last event that matches.
    pub fn last_seq_where(&self, f: impl Fn(&Event) -> bool) -> Option<u64> {
        self.records.iter().rev().find_map(|r| match r {
            Record::Event(e) if f(&e.envelope.event) => Some(e.seq),
            _ => None,
        })
    }

    fn append_envelope(&mut self, envelope: Envelope) -> &Output {
        self.seq += 1;
        let rec = EventRecord {
            seq: self.seq,
            time_ms: self.now_ms,
            envelope,
        };
        self.out.clear();
        self.engine.apply(&rec, &mut self.out);
        self.records.push(Record::Event(rec));
        for a in &self.out.actions {
            self.records.push(Record::Action(a.clone()));
            self.pending
                .retain(|p| p.action.target() != a.action.target());
            self.pending.push(a.clone());
        }
        self.actions.extend(self.out.actions.iter().cloned());
        self.transitions
            .extend(self.out.transitions.iter().cloned());
        &self.out
    }

    /// Moves virtual time forward.
    pub fn advance_s(&mut self, s: u64) -> &mut Self {
        self.now_ms += s * 1000;
        self
    }

    /// Appends a tick, as the service does when the log is quiet.
    pub fn tick(&mut self) -> &mut Self {
        self.append(Source::Lockstep, Event::Tick);
        self
    }

    /// Moves time forward in ticks of `step_s` until `s` have passed.
    pub fn idle_s(&mut self, s: u64, step_s: u64) -> &mut Self {
        let mut left = s;
        while left > 0 {
            let step = step_s.min(left);
            self.advance_s(step).tick();
            left -= step;
        }
        self
    }

    /// Like [`Sim::idle_s`], carrying out pending actions at every step.
    pub fn run_s(&mut self, s: u64, step_s: u64) -> &mut Self {
        let mut left = s;
        while left > 0 {
            let step = step_s.min(left);
            self.advance_s(step).tick().actuate();
            left -= step;
        }
        self
    }

    // ---- Slurm side ----

    /// Adds an idle Slurm node.
    pub fn add_slurm_node(&mut self, name: &str) -> &mut Self {
        let node = SlurmNode {
            name: name.into(),
            state: SlurmBaseState::Idle,
            flags: vec![],
            reason: None,
            reason_user: None,
            features: vec![],
            topology: None,
            partitions: vec!["batch".into()],
            version: 0,
        };
        self.slurm.insert(name.to_owned(), node);
        self.observe_slurm(name)
    }

    /// Changes a Slurm node and publishes the new observation, unless the
    /// poller lags behind the actuator ([`Sim::actuate_before_poll`]).
    pub fn slurm_change(&mut self, name: &str, f: impl FnOnce(&mut SlurmNode)) -> &mut Self {
        self.slurm_change_unseen(name, f);
        if self.poll_lags {
            return self;
        }
        self.observe_slurm(name)
    }

    /// Changes a Slurm node in slurmctld without publishing it: lockstep's
    /// poller has not seen it yet ([`Sim::poll_slurm_node`] publishes it).
    pub fn slurm_change_unseen(&mut self, name: &str, f: impl FnOnce(&mut SlurmNode)) -> &mut Self {
        let node = self.slurm.get_mut(name).expect("known slurm node");
        f(node);
        node.flags.sort();
        self
    }

    /// An admin drains a node, and lockstep's poller has not seen it yet.
    pub fn admin_drain_unseen(&mut self, name: &str, reason: &str, user: &str) -> &mut Self {
        self.slurm_change_unseen(name, |n| set_drain(n, reason, user))
    }

    /// The poller publishes what slurmctld has of one node now.
    pub fn poll_slurm_node(&mut self, name: &str) -> &mut Self {
        self.observe_slurm(name)
    }

    fn observe_slurm(&mut self, name: &str) -> &mut Self {
        let node = self.slurm[name].clone();
        self.append(Source::Slurm, Event::SlurmNode(node));
        self
    }

    /// `scontrol update nodename=N state=drain reason=R` by an admin.
    pub fn admin_drain(&mut self, name: &str, reason: &str) -> &mut Self {
        self.slurm_change(name, |n| set_drain(n, reason, "admin"))
    }

    /// `scontrol update nodename=N state=resume` by an admin.
    pub fn admin_resume(&mut self, name: &str) -> &mut Self {
        self.slurm_change(name, resume)
    }

    /// slurmd stops answering.
    pub fn slurmd_not_responding(&mut self, name: &str) -> &mut Self {
        self.slurm_change(name, |n| {
            n.state = SlurmBaseState::Down;
            n.flags.push(SlurmNodeFlag::NotResponding);
            n.reason = Some("Not responding".to_owned());
            n.reason_user = Some("slurm".to_owned());
        })
    }

    /// slurmctld stops hearing from slurmd: NOT_RESPONDING, its state,
    /// drain and reason kept (before `SlurmdTimeout` takes it DOWN).
    pub fn slurmd_silent(&mut self, name: &str) -> &mut Self {
        self.slurm_change(name, |n| {
            if !n.flags.contains(&SlurmNodeFlag::NotResponding) {
                n.flags.push(SlurmNodeFlag::NotResponding);
            }
        })
    }

    /// slurmctld hears from slurmd again (after [`Sim::slurmd_silent`]).
    pub fn slurmd_heard(&mut self, name: &str) -> &mut Self {
        self.slurm_change(name, |n| {
            n.flags.retain(|f| *f != SlurmNodeFlag::NotResponding);
        })
    }

    /// slurmd answers again and slurmctld returns the node to service.
    pub fn slurmd_back(&mut self, name: &str) -> &mut Self {
        self.slurm_change(name, |n| {
            n.flags.retain(|f| *f != SlurmNodeFlag::NotResponding);
            if n.reason.as_deref() == Some("Not responding") {
                n.state = SlurmBaseState::Idle;
                n.reason = None;
                n.reason_user = None;
            }
        })
    }

    /// A job starts on some nodes; they become ALLOCATED.
    pub fn start_job(&mut self, job_id: u64, nodes: &[&str]) -> &mut Self {
        let job = SlurmJob {
            job_id,
            state: SlurmJobState::Running,
            partition: "batch".into(),
            nodes: nodes.iter().map(|n| (*n).into()).collect(),
            node_count: nodes.len() as u32,
            pending_reason: None,
            version: 0,
        };
        self.jobs.insert(job_id, job.clone());
        self.append(Source::Slurm, Event::SlurmJob(job));
        for n in nodes {
            self.slurm_change(n, |s| s.state = SlurmBaseState::Allocated);
        }
        self
    }

    /// A job ends; its nodes become IDLE.
    pub fn end_job(&mut self, job_id: u64) -> &mut Self {
        let mut job = self.jobs.remove(&job_id).expect("known job");
        job.state = SlurmJobState::Completed;
        let nodes = job.nodes.clone();
        self.append(Source::Slurm, Event::SlurmJob(job));
        self.append(Source::Slurm, Event::SlurmJobGone { job_id, version: 0 });
        for n in &nodes {
            self.slurm_change(n, |s| s.state = SlurmBaseState::Idle);
        }
        self
    }

    // ---- Kubernetes side ----

    /// Adds a Ready Kubernetes node.
    pub fn add_kube_node(&mut self, name: &str) -> &mut Self {
        self.kube.insert(name.to_owned(), new_kube_node(name));
        self.observe_kube(name)
    }

    /// Changes a Kubernetes node and publishes the new observation.
    pub fn kube_change(&mut self, name: &str, f: impl FnOnce(&mut KubeNode)) -> &mut Self {
        f(self.kube.get_mut(name).expect("known kubernetes node"));
        self.observe_kube(name)
    }

    /// The policy changes. From now on Kubernetes node observations carry
    /// only the labels a connector built from the policy in force reports
    /// (the topology labels it reads and the default zone label), as the
    /// real one does; it reports the new ones on its next observation of
    /// each node (a relist, after the observer restarts with the policy).
    pub fn change_policy(&mut self, policy: Policy) -> &mut Self {
        let mut labels: Vec<String> = policy
            .topology
            .features
            .iter()
            .map(|f| f.label.clone())
            .chain(policy.topology.unit_label.iter().cloned())
            .chain(["topology.kubernetes.io/zone".to_owned()])
            .chain(
                Some(&policy.node_signals.slurm_nodes_annotation)
                    .filter(|a| !a.is_empty())
                    .map(|a| format!("{}{a}", lockstep_schemas::ANNOTATION_PREFIX)),
            )
            .collect();
        labels.sort();
        labels.dedup();
        self.label_filter = Some(labels);
        self.append(Source::Lockstep, Event::PolicyChanged(Box::new(policy)));
        self
    }

    /// A Kubernetes node as the connector reports it.
    fn kube_observation(&self, name: &str) -> KubeNode {
        let mut node = self.kube[name].clone();
        if let Some(watched) = &self.label_filter {
            node.labels.retain(|k, _| watched.contains(k));
        }
        node
    }

    fn observe_kube(&mut self, name: &str) -> &mut Self {
        let node = self.kube_observation(name);
        self.append(Source::Kubernetes, Event::KubeNode(node));
        self
    }

    /// `kubectl delete node`: the node object is gone.
    pub fn delete_kube_node(&mut self, name: &str) -> &mut Self {
        self.kube.remove(name).expect("known kubernetes node");
        self.append(
            Source::Kubernetes,
            Event::KubeNodeGone {
                name: name.to_owned(),
                version: 0,
            },
        );
        self
    }

    /// The node is deleted while the node watch is down: no event says so
    /// (a relist will).
    pub fn forget_kube_node(&mut self, name: &str) -> &mut Self {
        self.kube.remove(name).expect("known kubernetes node");
        self
    }

    /// The node watcher relists: every node the API server has, between
    /// `SyncStarted` and `SyncDone`.
    pub fn relist_kube_nodes(&mut self) -> &mut Self {
        let domain = lockstep_schemas::Domain::KubeNodes;
        self.append(Source::Kubernetes, Event::SyncStarted { domain });
        let nodes: Vec<KubeNode> = self.kube.keys().map(|k| self.kube_observation(k)).collect();
        for n in nodes {
            self.append(Source::Kubernetes, Event::KubeNode(n));
        }
        self.append(Source::Kubernetes, Event::SyncDone { domain });
        self
    }

    /// A Kubernetes node object (re)registers with this Ready status.
    pub fn register_kube_node(&mut self, name: &str, ready: ConditionStatus) -> &mut Self {
        let mut node = new_kube_node(name);
        node.ready = ready;
        self.kube.insert(name.to_owned(), node);
        self.observe_kube(name)
    }

    /// `kubectl cordon`.
    pub fn cordon(&mut self, name: &str) -> &mut Self {
        self.kube_change(name, |n| n.unschedulable = true)
    }

    /// `kubectl uncordon`.
    pub fn uncordon(&mut self, name: &str) -> &mut Self {
        self.kube_change(name, |n| n.unschedulable = false)
    }

    /// The kubelet's Ready condition changes.
    pub fn set_ready(&mut self, name: &str, ready: ConditionStatus) -> &mut Self {
        self.kube_change(name, |n| n.ready = ready)
    }

    /// A node condition (GPU XID, NVLink, node-problem-detector) changes.
    pub fn set_node_condition(
        &mut self,
        name: &str,
        ty: &str,
        status: ConditionStatus,
    ) -> &mut Self {
        self.kube_change(name, |n| {
            n.conditions.retain(|c| c.type_ != ty);
            n.conditions.push(NodeCondition {
                type_: ty.to_owned(),
                status,
                reason: String::new(),
                message: String::new(),
            });
            n.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        })
    }

    /// A running slurmd pod for Slurm node `name` on Kubernetes node `node`.
    pub fn add_pod(&mut self, name: &str, node: &str) -> &mut Self {
        self.pods
            .insert(format!("slurm/{name}"), new_pod(name, node));
        self.observe_pod(name)
    }

    /// A slurmd pod for Slurm node `name` just created on `node`: Pending,
    /// not Ready (the kubelet has not started its containers yet).
    pub fn add_pending_pod(&mut self, name: &str, node: &str) -> &mut Self {
        let mut pod = new_pod(name, node);
        pod.phase = PodPhase::Pending;
        pod.ready = false;
        self.pods.insert(format!("slurm/{name}"), pod);
        self.observe_pod(name)
    }

    /// Changes a pod (namespace `slurm`) and publishes the new observation.
    pub fn pod_change(&mut self, name: &str, f: impl FnOnce(&mut KubePod)) -> &mut Self {
        f(self
            .pods
            .get_mut(&format!("slurm/{name}"))
            .expect("known pod"));
        self.observe_pod(name)
    }

    /// The pod object is removed (deletion finished).
    pub fn remove_pod(&mut self, name: &str) -> &mut Self {
        self.pods
            .remove(&format!("slurm/{name}"))
            .expect("known pod");
        self.append(
            Source::Kubernetes,
            Event::KubePodGone {
                namespace: "slurm".to_owned(),
                name: name.to_owned(),
                version: 0,
            },
        );
        self
    }

    /// The pod is deleted while the watch is down: the API server no longer
    /// has it, and no event says so (a relist will).
    pub fn forget_pod(&mut self, name: &str) -> &mut Self {
        self.pods
            .remove(&format!("slurm/{name}"))
            .expect("known pod");
        self
    }

    /// The pod watcher relists (after a `410 Gone` or a restart): every pod
    /// the API server has, between `SyncStarted` and `SyncDone`.
    pub fn relist_pods(&mut self) -> &mut Self {
        let pods = self.pods.values().cloned().map(Event::KubePod).collect();
        self.listing(Source::Kubernetes, lockstep_schemas::Domain::KubePods, pods)
    }

    fn observe_pod(&mut self, name: &str) -> &mut Self {
        let pod = self.pods[&format!("slurm/{name}")].clone();
        self.append(Source::Kubernetes, Event::KubePod(pod));
        self
    }

    // ---- actuators ----

    /// Carries out every pending action: changes the virtual cluster, reports
    /// the outcome, and publishes the changed object, as the real actuators
    /// and observers would.
    pub fn actuate(&mut self) -> &mut Self {
        while let Some(a) = self.take_pending() {
            if let Some(held_by) = self.held_by_other(&a.action) {
                // The Slurm actuator reads first and leaves a drain or down
                // that lockstep did not set as it is.
                self.report(&a, OutcomeResult::Declined { held_by });
            } else if self.target_exists(&a.action) {
                if self.observed_first {
                    self.carry_out(&a.action);
                    self.report(&a, OutcomeResult::Succeeded);
                } else {
                    self.report(&a, OutcomeResult::Succeeded);
                    self.carry_out(&a.action);
                }
            } else {
                // What a real actuator reports for a 404 / unknown node.
                self.report(
                    &a,
                    OutcomeResult::Failed {
                        retryable: false,
                        error: format!("{} not found", a.action.target()),
                    },
                );
            }
        }
        self
    }

    /// Carries out the pending actions and reports their outcomes as
    /// [`Sim::actuate`] does, while lockstep's Slurm poller has not come
    /// round yet: what changed in slurmctld is published only by a later
    /// [`Sim::poll_slurm_node`] (or anything else that changes the node).
    pub fn actuate_before_poll(&mut self) -> &mut Self {
        self.poll_lags = true;
        self.actuate();
        self.poll_lags = false;
        self
    }

    /// The next pending action fails.
    pub fn fail_next(&mut self, retryable: bool, error: &str) -> &mut Self {
        let a = self.take_pending().expect("an action is pending");
        self.report(
            &a,
            OutcomeResult::Failed {
                retryable,
                error: error.to_owned(),
            },
        );
        self
    }

    /// The Slurm actuator finds the next pending drain or down already in
    /// place, that state with that reason (it reads before it writes):
    /// "already done", and nothing changes, so nothing is published.
    pub fn find_next_in_place(&mut self) -> &mut Self {
        let a = self.take_pending().expect("an action is pending");
        let in_place = match &a.action {
            Action::SlurmDrain { node, reason } => {
                self.slurm.get(node).is_some_and(|n| n.drained_with(reason))
            }
            Action::SlurmDown { node, reason } => {
                self.slurm.get(node).is_some_and(|n| n.down_with(reason))
            }
            _ => false,
        };
        assert!(in_place, "{:?} is not in place in Slurm", a.action);
        self.report(&a, OutcomeResult::AlreadyDone);
        self
    }

    /// The next pending action is lost: no outcome ever comes.
    pub fn lose_next(&mut self) -> &mut Self {
        self.take_pending().expect("an action is pending");
        self
    }

    /// Who holds the Slurm node a drain, down or resume is for, when it is
    /// not lockstep: the actuator's rule (`Ownership::held_by_other`, under
    /// the policy in force).
    fn held_by_other(&self, action: &Action) -> Option<String> {
        let (Action::SlurmDrain { node, .. }
        | Action::SlurmDown { node, .. }
        | Action::SlurmResume { node }) = action
        else {
            return None;
        };
        let n = self.slurm.get(node)?;
        let own = self.engine.reason_ownership();
        own.borrow()
            .held_by_other(n)
            .then(|| lockstep_schemas::Ownership::describe_holder(n))
    }

    fn target_exists(&self, action: &Action) -> bool {
        match action {
            Action::SlurmDrain { node, .. }
            | Action::SlurmResume { node }
            | Action::SlurmDown { node, .. }
            | Action::SlurmSetFeatures { node, .. }
            | Action::SlurmSetTopology { node, .. } => self.slurm.contains_key(node),
            Action::KubeSetPodCondition { pod, .. }
            | Action::KubeLabelPod { pod, .. }
            | Action::KubeRespondEviction { pod, .. }
            | Action::KubeDeletePod { pod, .. } => self.pods.contains_key(&format!("slurm/{pod}")),
            Action::KubeTaintNode { node, .. } | Action::KubeUntaintNode { node, .. } => {
                self.kube.contains_key(node)
            }
            Action::KubeScale { target, .. } => self.sets.contains_key(&target.name),
            Action::SlurmReserve { nodes, .. } => nodes.iter().all(|n| self.slurm.contains_key(n)),
            // scontrol deletes a reservation; one already gone is `AlreadyDone`.
            Action::SlurmUnreserve { .. } => true,
            Action::KubeSetNodeCondition { node, .. } | Action::KubeLabelNode { node, .. } => {
                self.kube.contains_key(node)
            }
        }
    }

    fn take_pending(&mut self) -> Option<IssuedAction> {
        if self.pending.is_empty() {
            None
        } else {
            Some(self.pending.remove(0))
        }
    }

    fn report(&mut self, a: &IssuedAction, result: OutcomeResult) {
        let outcome = ActionOutcome {
            action_id: a.id.clone(),
            kind: a.action.kind(),
            target: a.action.target(),
            result,
        };
        self.append(Source::Actuator, Event::ActionOutcome(outcome));
    }

    fn carry_out(&mut self, action: &Action) {
        match action {
            // A report changes nothing lockstep reads back; the one that
            // completes makes the controller mark lockstep Completed.
            Action::KubeRespondEviction { pod, complete, .. } => {
                if *complete {
                    self.pod_change(pod, |p| {
                        if let Some(e) = &mut p.eviction {
                            e.state = lockstep_schemas::ResponderState::Completed;
                            e.completed = true;
                            e.version += 1;
                        }
                    });
                }
            }
            Action::SlurmDrain { node, reason } => {
                let reason = reason.clone();
                self.slurm_change(node, |n| set_drain(n, &reason, "lockstep"));
            }
            Action::SlurmDown { node, reason } => {
                let reason = reason.clone();
                self.slurm_change(node, |n| {
                    n.state = SlurmBaseState::Down;
                    n.reason = Some(reason);
                    n.reason_user = Some("lockstep".to_owned());
                });
            }
            Action::SlurmResume { node } => {
                self.slurm_change(node, resume);
            }
            Action::KubeSetPodCondition { pod, condition, .. } => {
                let condition = condition.clone();
                self.pod_change(pod, |p| {
                    p.conditions.retain(|c| c.type_ != condition.type_);
                    p.conditions.push(condition);
                    p.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
                });
            }
            Action::KubeTaintNode { node, taint } => {
                let taint = taint.clone();
                self.kube_change(node, |n| {
                    n.taints.retain(|t| t.key != taint.key);
                    n.taints.push(taint);
                });
            }
            Action::KubeUntaintNode { node, key } => {
                let key = key.clone();
                self.kube_change(node, |n| n.taints.retain(|t| t.key != key));
            }
            Action::KubeLabelPod {
                pod, key, value, ..
            } => {
                let (key, value) = (key.clone(), value.clone());
                self.pod_change(pod, |p| match value {
                    Some(v) => {
                        p.labels.insert(key, v);
                    }
                    None => {
                        p.labels.remove(&key);
                    }
                });
            }
            Action::KubeDeletePod { pod, uid, .. } => {
                let key = format!("slurm/{pod}");
                if self.pods.get(&key).is_some_and(|p| p.uid == *uid) {
                    let set = self.pods[&key].owner.as_ref().map(|o| o.name.clone());
                    self.pod_change(pod, |p| p.deleting = true);
                    self.remove_pod(pod);
                    self.slurmd_gone(pod);
                    if let Some(set) = set.filter(|s| self.sets.contains_key(s)) {
                        self.sync_set(&set);
                    }
                }
            }
            Action::KubeScale { target, replicas } => {
                let name = target.name.clone();
                let set = self.sets.get_mut(&name).expect("known set");
                set.replicas = *replicas;
                let paused = set.paused;
                self.observe_set(&name);
                if !paused {
                    self.sync_set(&name);
                }
            }
            Action::SlurmSetFeatures { node, features } => {
                let features = features.iter().map(|f| f.as_str().into()).collect();
                self.slurm_change(node, |n| n.features = features);
            }
            Action::SlurmSetTopology { node, topology } => {
                let topology = topology.as_str().into();
                self.slurm_change(node, |n| n.topology = Some(topology));
            }
            Action::SlurmReserve { name, .. } => {
                self.reservations.insert(name.clone(), action.clone());
            }
            Action::SlurmUnreserve { name } => {
                self.reservations.remove(name);
            }
            Action::KubeSetNodeCondition { node, condition } => {
                // The connector reports the message of the foreign drain
                // condition only.
                let foreign = &self.engine.policy().node_signals.foreign_drain_condition;
                let condition = lockstep_schemas::NodeCondition {
                    type_: condition.type_.clone(),
                    status: condition.status,
                    reason: condition.reason.clone(),
                    message: if condition.type_ == *foreign {
                        condition.message.clone()
                    } else {
                        String::new()
                    },
                };
                self.kube_change(node, |n| {
                    n.conditions.retain(|c| c.type_ != condition.type_);
                    n.conditions.push(condition);
                    n.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
                });
            }
            Action::KubeLabelNode { node, key, value } => {
                let (key, value) = (key.clone(), value.clone());
                self.kube_change(node, |n| match value {
                    Some(v) => {
                        n.labels.insert(key, v);
                    }
                    None => {
                        n.labels.remove(&key);
                    }
                });
            }
        }
    }
}

impl Sim {
    /// A StatefulSet-like scale target with its pods and their Slurm nodes.
    pub fn add_set(&mut self, name: &str, replicas: u32, nodes: &[&str]) -> &mut Self {
        self.add_controller(name, SimController::StatefulSet, false, replicas, nodes)
    }

    /// A StatefulSet whose Slurm nodes are in slurm.conf (see
    /// [`SimSet::static_nodes`]).
    pub fn add_static_set(&mut self, name: &str, replicas: u32, nodes: &[&str]) -> &mut Self {
        self.add_controller(name, SimController::StatefulSet, true, replicas, nodes)
    }

    /// A ReplicaSet-like scale target with its pods and their Slurm nodes.
    pub fn add_replica_set(&mut self, name: &str, replicas: u32, nodes: &[&str]) -> &mut Self {
        self.add_controller(name, SimController::ReplicaSet, false, replicas, nodes)
    }

    fn add_controller(
        &mut self,
        name: &str,
        controller: SimController,
        static_nodes: bool,
        replicas: u32,
        nodes: &[&str],
    ) -> &mut Self {
        let kind = match controller {
            SimController::StatefulSet => "StatefulSet",
            SimController::ReplicaSet => "ReplicaSet",
        };
        self.sets.insert(
            name.to_owned(),
            SimSet {
                target: ScaleTargetRef {
                    group: "apps".to_owned(),
                    kind: kind.to_owned(),
                    namespace: "slurm".to_owned(),
                    name: name.to_owned(),
                },
                replicas,
                revision: "rev-1".to_owned(),
                nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
                created: 0,
                controller,
                static_nodes,
                slow_pulls: false,
                paused: false,
            },
        );
        self.observe_set(name);
        self.sync_set(name)
    }

    /// The set's controller stops acting on its `replicas` (see
    /// [`SimSet::paused`]).
    pub fn pause_controller(&mut self, name: &str) -> &mut Self {
        self.sets.get_mut(name).expect("known set").paused = true;
        self
    }

    /// The set's controller acts again, on the `replicas` it has now.
    pub fn resume_controller(&mut self, name: &str) -> &mut Self {
        self.sets.get_mut(name).expect("known set").paused = false;
        self.sync_set(name)
    }

    /// From now on the set's new pods take long to pull their image: they
    /// stay Pending, their slurmd not started, until [`Sim::images_pulled`].
    pub fn slow_pulls(&mut self, name: &str) -> &mut Self {
        self.sets.get_mut(name).expect("known set").slow_pulls = true;
        self
    }

    /// The set's pending pods have their image: each starts (Running and
    /// Ready) and its slurmd registers.
    pub fn images_pulled(&mut self, name: &str) -> &mut Self {
        let pending: Vec<String> = self
            .pods
            .values()
            .filter(|p| p.owner.as_ref().is_some_and(|o| o.name == name))
            .filter(|p| p.phase == PodPhase::Pending)
            .map(|p| p.name.clone())
            .collect();
        for pod in pending {
            self.slurmd_started(&pod);
            self.pod_change(&pod, |p| {
                p.phase = PodPhase::Running;
                p.ready = true;
            });
        }
        self.observe_set(name)
    }

    /// The pod's slurmd is gone: its Slurm node leaves Slurm, or with
    /// static nodes stays, NOT_RESPONDING, its state and drain kept.
    fn slurmd_gone(&mut self, pod: &str) {
        let static_nodes = self
            .sets
            .values()
            .any(|s| s.static_nodes && pod.starts_with(&format!("{}-", s.target.name)));
        if static_nodes {
            if self.slurm.contains_key(pod) {
                self.slurm_change(pod, |n| {
                    if !n.flags.contains(&SlurmNodeFlag::NotResponding) {
                        n.flags.push(SlurmNodeFlag::NotResponding);
                    }
                });
            }
            return;
        }
        self.slurm.remove(pod);
        self.append(
            Source::Slurm,
            Event::SlurmNodeGone {
                name: pod.to_owned(),
                version: 0,
            },
        );
    }

    /// A new pod's slurmd registers: a new Slurm node, or a static one
    /// answering again with the state and drain slurmctld kept.
    fn slurmd_started(&mut self, pod: &str) {
        if self.slurm.contains_key(pod) {
            self.slurm_change(pod, |n| {
                n.flags.retain(|f| *f != SlurmNodeFlag::NotResponding);
                n.state = SlurmBaseState::Idle;
            });
        } else {
            self.add_slurm_node(pod);
        }
    }

    /// A new revision of the set's pod template.
    pub fn set_revision(&mut self, name: &str, revision: &str) -> &mut Self {
        self.sets.get_mut(name).expect("known set").revision = revision.to_owned();
        self.observe_set(name)
    }

    fn observe_set(&mut self, name: &str) -> &mut Self {
        let set = &self.sets[name];
        let ready = self
            .pods
            .values()
            .filter(|p| p.owner.as_ref().is_some_and(|o| o.name == name))
            .count() as u32;
        let event = Event::KubeScaleTarget(KubeScaleTarget {
            target: set.target.clone(),
            replicas: set.replicas,
            ready_replicas: ready,
            update_revision: Some(set.revision.clone()),
            version: 0,
        });
        self.append(Source::Kubernetes, event);
        self
    }

    /// The set's controller: creates missing pods (and their Slurm nodes
    /// register), removes pods beyond `replicas` the way its kind does.
    pub fn sync_set(&mut self, name: &str) -> &mut Self {
        let set = self.sets[name].clone();
        if set.controller == SimController::ReplicaSet {
            return self.sync_replica_set(name);
        }
        let ordinals: Vec<u32> = self
            .pods
            .values()
            .filter(|p| p.owner.as_ref().is_some_and(|o| o.name == name))
            .filter_map(|p| p.name.rsplit_once('-').and_then(|(_, o)| o.parse().ok()))
            .collect();
        let mut removed: Vec<u32> = ordinals
            .iter()
            .copied()
            .filter(|&o| o >= set.replicas)
            .collect();
        removed.sort_unstable_by(|a, b| b.cmp(a));
        for o in removed {
            let pod = format!("{name}-{o}");
            self.pod_change(&pod, |p| p.deleting = true);
            self.remove_pod(&pod);
            self.slurmd_gone(&pod);
        }
        for o in (0..set.replicas).filter(|o| !ordinals.contains(o)) {
            let pod = format!("{name}-{o}");
            let node = set.nodes[o as usize % set.nodes.len()].clone();
            let created = {
                let s = self.sets.get_mut(name).expect("known set");
                s.created += 1;
                s.created
            };
            if set.slow_pulls {
                self.add_pending_pod(&pod, &node);
            } else {
                self.slurmd_started(&pod);
                self.add_pod(&pod, &node);
            }
            let revision = set.revision.clone();
            self.pod_change(&pod, |p| {
                p.uid = format!("uid-{pod_name}-{created}", pod_name = p.name);
                p.owner = Some(OwnerRef {
                    kind: "StatefulSet".to_owned(),
                    name: name.to_owned(),
                });
                p.revision = Some(revision);
            });
        }
        self.observe_set(name)
    }

    fn sync_replica_set(&mut self, name: &str) -> &mut Self {
        let set = self.sets[name].clone();
        let mine: Vec<KubePod> = self
            .pods
            .values()
            .filter(|p| p.owner.as_ref().is_some_and(|o| o.name == name) && !p.deleting)
            .cloned()
            .collect();
        let excess = mine.len().saturating_sub(set.replicas as usize);
        let mut ranked = mine.clone();
        // kube-controller-manager's ranking for a scale-down (all pods here
        // are assigned): not Ready first, then the lowest deletion cost,
        // then the newest.
        let created = |p: &KubePod| -> u64 {
            p.name
                .rsplit_once('-')
                .and_then(|(_, n)| n.parse().ok())
                .unwrap_or(0)
        };
        let cost = |p: &KubePod| -> i64 {
            p.labels
                .get("annotation:controller.kubernetes.io/pod-deletion-cost")
                .and_then(|c| c.parse().ok())
                .unwrap_or(0)
        };
        ranked.sort_by_key(|p| {
            (
                p.running_and_ready(),
                cost(p),
                std::cmp::Reverse(created(p)),
            )
        });
        for p in ranked.into_iter().take(excess) {
            let pod = p.name.clone();
            self.pod_change(&pod, |p| p.deleting = true);
            self.remove_pod(&pod);
            self.slurmd_gone(&pod);
        }
        for _ in mine.len()..set.replicas as usize {
            let n = {
                let s = self.sets.get_mut(name).expect("known set");
                s.created += 1;
                s.created
            };
            let pod = format!("{name}-{n}");
            let node = set.nodes[n as usize % set.nodes.len()].clone();
            self.slurmd_started(&pod);
            self.add_pod(&pod, &node);
            self.pod_change(&pod, |p| {
                p.uid = format!("uid-{pod_name}", pod_name = p.name);
                p.owner = Some(OwnerRef {
                    kind: "ReplicaSet".to_owned(),
                    name: name.to_owned(),
                });
            });
        }
        self.observe_set(name)
    }

    /// A job waits in the queue for `nodes` nodes of `partition`.
    pub fn submit(&mut self, job_id: u64, partition: &str, nodes: u32, reason: &str) -> &mut Self {
        let job = SlurmJob {
            job_id,
            state: SlurmJobState::Pending,
            partition: partition.into(),
            nodes: vec![],
            node_count: nodes,
            pending_reason: Some(reason.to_owned()),
            version: 0,
        };
        self.jobs.insert(job_id, job.clone());
        self.append(Source::Slurm, Event::SlurmJob(job));
        self
    }

    /// A pending job starts on these nodes.
    pub fn schedule(&mut self, job_id: u64, nodes: &[&str]) -> &mut Self {
        let job = self.jobs.get_mut(&job_id).expect("known job");
        job.state = SlurmJobState::Running;
        job.pending_reason = None;
        job.nodes = nodes.iter().map(|n| (*n).into()).collect();
        let job = job.clone();
        self.append(Source::Slurm, Event::SlurmJob(job));
        for n in nodes {
            self.slurm_change(n, |s| s.state = SlurmBaseState::Allocated);
        }
        self
    }

    /// The Slurm connector loses or regains sight of slurmctld. Regained, it
    /// lists every node and job in full, as the real observer does after a
    /// loss ([`Sim::slurm_seen_again`] for the status alone).
    pub fn slurm_visible(&mut self, visible: bool) -> &mut Self {
        if visible {
            return self.slurm_seen_again().relist_slurm();
        }
        self.append(
            Source::Slurm,
            Event::ConnectorStatus {
                connector: lockstep_schemas::Connector::Slurm,
                visible,
                detail: "slurmrestd: connection refused".to_owned(),
            },
        );
        self
    }

    /// The Slurm connector reports that it sees slurmctld again, before it
    /// has listed anything.
    pub fn slurm_seen_again(&mut self) -> &mut Self {
        self.append(
            Source::Slurm,
            Event::ConnectorStatus {
                connector: lockstep_schemas::Connector::Slurm,
                visible: true,
                detail: String::new(),
            },
        );
        self
    }

    /// The Slurm connector lists every node, then every job, each between
    /// `SyncStarted` and `SyncDone` (its first poll, a resync, the poll after
    /// it lost sight of Slurm).
    pub fn relist_slurm(&mut self) -> &mut Self {
        let nodes = self.slurm.values().cloned().map(Event::SlurmNode).collect();
        self.listing(Source::Slurm, lockstep_schemas::Domain::SlurmNodes, nodes);
        let jobs = self.jobs.values().cloned().map(Event::SlurmJob).collect();
        self.listing(Source::Slurm, lockstep_schemas::Domain::SlurmJobs, jobs)
    }

    /// A full listing of one domain: `events` between `SyncStarted` and
    /// `SyncDone`.
    fn listing(
        &mut self,
        source: Source,
        domain: lockstep_schemas::Domain,
        events: Vec<Event>,
    ) -> &mut Self {
        self.append(source, Event::SyncStarted { domain });
        for e in events {
            self.append(source, e);
        }
        self.append(source, Event::SyncDone { domain });
        self
    }

    /// Sets (or with `None` removes) a label on a Kubernetes node.
    pub fn label_node(&mut self, name: &str, key: &str, value: Option<&str>) -> &mut Self {
        self.kube_change(name, |n| match value {
            Some(v) => {
                n.labels.insert(key.to_owned(), v.to_owned());
            }
            None => {
                n.labels.remove(key);
            }
        })
    }
}

/// A Ready Kubernetes node.
fn new_kube_node(name: &str) -> KubeNode {
    KubeNode::ready(name)
}

/// A Running and Ready slurmd pod in namespace `slurm`.
fn new_pod(name: &str, node: &str) -> KubePod {
    KubePod {
        uid: format!("uid-{name}"),
        ..KubePod::running("slurm", name, node)
    }
}

fn set_drain(n: &mut SlurmNode, reason: &str, user: &str) {
    if !n.flags.contains(&SlurmNodeFlag::Drain) {
        n.flags.push(SlurmNodeFlag::Drain);
    }
    n.reason = Some(reason.to_owned());
    n.reason_user = Some(user.to_owned());
}

fn resume(n: &mut SlurmNode) {
    n.flags.retain(|f| *f != SlurmNodeFlag::Drain);
    if n.state == SlurmBaseState::Down {
        n.state = SlurmBaseState::Idle;
    }
    n.reason = None;
    n.reason_user = None;
}
