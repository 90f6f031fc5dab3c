//! An independent world model for lockstep: a virtual Kubernetes cluster
//! (API server, StatefulSet and ReplicaSet controllers, scheduler, node
//! lifecycle controller, kubelets), a virtual slurmctld with its slurmds and
//! jobs, lockstep's connectors (watchers, poller, actuators) and the reducer
//! itself, all on one virtual clock.
//!
//! It is written from how Kubernetes and Slurm are documented to behave, not
//! from the reducer: the reducer only sees the log the connectors would
//! write, and its actions are carried out the way the real systems would
//! carry them out, so that a wrong decision has its real consequence later
//! in the log (a job killed by a StatefulSet scale-down, a drain that never
//! lifts). Every change in the world records who made it ([`Actor`]), which
//! is what the properties in [`check`] judge lockstep by.
//!
//! It owns the simulation and its bookkeeping; it must never read the
//! reducer's state to decide what the world does (only the actions the
//! reducer emits reach it), and never use a real clock or unseeded
//! randomness: the same schedule always gives the same log.
//!
//! - [`schedule`]: what happens (the input), and its proptest strategies.
//! - `kube`: API server objects, controllers, scheduler and kubelets.
//! - `slurm`: slurmctld's nodes, jobs and scheduler.
//! - `observe`: lockstep's Kubernetes watchers and Slurm poller.
//! - `actuate`: lockstep's actuators.
//! - `slinky`: Slinky's slurm-operator, when the setup runs it.
//! - [`check`]: the properties an administrator expects.
//! - [`search`]: seeded schedules and shrinking, for the soak program.
//! - [`incident`]: failing schedules saved under `incidents/world/`.
//! - `model_tests`: the model against the documented behaviour, lockstep idle.

pub mod check;
pub mod incident;
pub mod schedule;
pub mod search;

mod actuate;
mod kube;
#[cfg(test)]
mod model_tests;
mod observe;
mod slinky;
mod slurm;

use std::collections::BTreeMap;

use lockstep_engine::{Engine, Output};
use lockstep_schemas::{Envelope, Event, EventRecord, IssuedAction, Policy, Record, Source};
use serde::{Deserialize, Serialize};

pub use check::{check, Property, Violation};
pub use schedule::{Bounds, Op, Schedule, Setup, Step};

use kube::Kube;
use observe::Observers;
use schedule::PolicyState;
use slurm::Slurm;

/// Virtual time, ms since the start of the run.
pub type Ms = u64;

/// Log time of virtual time 0 (the same epoch as the incidents).
pub const EPOCH_MS: u64 = crate::EPOCH_MS;

/// Who made a change in the world.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Actor {
    /// The cluster as it was set up.
    Setup,
    /// A step of the schedule (an administrator, a failure), by index.
    Step(usize),
    /// lockstep, through one of its actions.
    Lockstep {
        /// The action's id.
        action: String,
        /// When the reducer issued it (virtual ms).
        issued_ms: Ms,
    },
    /// slurmctld on its own (a node not responding).
    Slurmctld,
    /// Slinky's slurm-operator, or the preStop hook of one of its worker pods.
    Slinky,
}

impl Actor {
    /// Whether lockstep made the change.
    pub fn is_lockstep(&self) -> bool {
        matches!(self, Self::Lockstep { .. })
    }
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Setup => f.write_str("the setup"),
            Self::Step(i) => write!(f, "step {}", i + 1),
            Self::Lockstep { action, .. } => write!(f, "lockstep action {action}"),
            Self::Slurmctld => f.write_str("slurmctld"),
            Self::Slinky => f.write_str("Slinky's slurm-operator"),
        }
    }
}

/// Timing of the world. The Kubernetes and Slurm values are the documented
/// defaults where a schedule can afford them, shortened where noted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorldConfig {
    /// lockstep appends a `Tick` when the log has been quiet this long
    /// (the service's default is 1 s; 10 s keeps logs short and is no
    /// longer than any timer of the generated policies but the first retry
    /// backoff, which it delays by at most one tick).
    pub tick_interval_ms: u64,
    /// lockstep's Slurm poll interval (the observer's default): the nodes'
    /// lane sees a change at the next multiple of it (plus 20 ms).
    pub slurm_poll_interval_ms: u64,
    /// The observer polls jobs and partitions in a lane of their own, at a
    /// phase of its own, and a long queue takes seconds to list: a change
    /// reaches that lane's listing this long after it is made (drawn per
    /// change from a stream of its own, so that every other draw stays).
    pub slurm_jobs_lane_ms: (u64, u64),
    /// slurm.conf `SlurmdTimeout` (default 300 s; shortened).
    pub slurmd_timeout_ms: u64,
    /// slurmctld pings each node every `SlurmdTimeout / 3`.
    pub slurmd_ping_interval_ms: u64,
    /// slurm.conf `MinJobAge`: a finished job stays in the job table this long.
    pub min_job_age_ms: u64,
    /// Epilog and cleanup: a node stays COMPLETING this long after a job ends.
    pub completing_ms: u64,
    /// kube-controller-manager `--node-monitor-grace-period` (40 s before 1.32, 50 s since).
    pub node_monitor_grace_ms: u64,
    /// The default `tolerationSeconds` of the not-ready and unreachable
    /// NoExecute taints (DefaultTolerationSeconds admission plugin: 300 s).
    pub eviction_toleration_ms: u64,
    /// PodGC deletes pods bound to a node that no longer exists after this quarantine.
    pub podgc_orphan_ms: u64,
    /// Time from a pod being bound to its containers running (image pull, start).
    pub pod_start_ms: (u64, u64),
    /// Readiness probe: Ready this long after the containers run.
    pub pod_ready_ms: u64,
    /// slurmd registers this long after its container starts.
    pub slurmd_register_ms: u64,
    /// A watch event reaches lockstep's watcher within this latency.
    pub kube_watch_latency_ms: (u64, u64),
    /// lockstep's actuators take up an action within this latency.
    pub actuator_latency_ms: (u64, u64),
    /// The Slurm actuator writes a node's state this long after it read it.
    pub actuator_write_ms: (u64, u64),
    /// How far behind the world lockstep's observations may be: a change
    /// made this long before a decision was visible to it. Used to tell a
    /// race lockstep could not see from a decision it should not have made.
    pub observation_lag_ms: u64,
    /// Whether lockstep's actions are carried out (off: the world alone,
    /// for tests of the model).
    pub lockstep_acts: bool,
    /// The world is quiet once no step has happened and no job has started
    /// or ended for this long; the end-state properties are checked then.
    /// It covers the longest chain a step or a job end can leave behind: a
    /// timed step still running (NotReady up to 400 s, with a 300 s
    /// eviction), the flap hold after the last health drain (120 s), and a
    /// scale-in from max to min after the last job (idle 30 s, then per step
    /// a 20 s cooldown, drain and pod removal), with retries.
    pub quiet_ms: u64,
}

impl Default for WorldConfig {
    fn default() -> Self {
        Self {
            tick_interval_ms: 10_000,
            slurm_poll_interval_ms: 1_000,
            slurm_jobs_lane_ms: (20, 2_500),
            slurmd_timeout_ms: 60_000,
            slurmd_ping_interval_ms: 20_000,
            min_job_age_ms: 300_000,
            completing_ms: 2_000,
            node_monitor_grace_ms: 40_000,
            eviction_toleration_ms: 300_000,
            podgc_orphan_ms: 40_000,
            pod_start_ms: (2_000, 8_000),
            pod_ready_ms: 2_000,
            slurmd_register_ms: 1_000,
            kube_watch_latency_ms: (20, 300),
            actuator_latency_ms: (50, 800),
            actuator_write_ms: (20, 300),
            observation_lag_ms: 1_500,
            lockstep_acts: true,
            quiet_ms: 900_000,
        }
    }
}

/// A deterministic generator for latencies (SplitMix64).
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn between(&mut self, (lo, hi): (u64, u64)) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// True with probability `percent` %.
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Something due at a virtual time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ev {
    /// A schedule step.
    Step(usize),
    /// A timed step ends (NotReady over, XID cleared, slurmd answers again).
    StepEnds(usize),
    /// lockstep appends a Tick if the log has been quiet.
    Tick,
    /// Kubernetes controllers and the scheduler reconcile.
    Controllers,
    /// A pod's containers start.
    ContainersStart { uid: String },
    /// A pod's readiness probe passes.
    PodReady { uid: String },
    /// A terminating pod's containers have stopped.
    ContainersStopped { uid: String },
    /// The kubelet confirms a graceful deletion: the pod object goes away.
    PodFinalized { uid: String },
    /// The node lifecycle controller looks at a node (Unknown, eviction).
    NodeMonitor { node: String, epoch: u64 },
    /// PodGC removes pods bound to a deleted node.
    PodGc { node: String },
    /// A host finishes booting.
    KubeletUp { node: String, epoch: u64 },
    /// Watch events of one kind reach lockstep's watcher.
    KubeDeliver { kind: observe::Kind },
    /// lockstep's new Kubernetes observer (after a policy change) lists.
    KubeRestart,
    /// slurmd of a pod registers with slurmctld.
    SlurmdRegister { uid: String, instance: u64 },
    /// slurmctld's ping cycle.
    Ping,
    /// slurmctld's scheduler runs.
    SlurmSchedule,
    /// A job's run time is over.
    JobEnds { job: u64 },
    /// A job's epilog finished.
    JobDone { job: u64 },
    /// A finished job leaves the job table.
    JobPurged { job: u64 },
    /// One of lockstep's Slurm observer's lanes polls Slurm.
    SlurmPoll(observe::Lane),
    /// An actuator takes up an action: it reads the target (and, for
    /// anything but Slurm's node state, writes it at once).
    Execute { index: usize },
    /// The Slurm actuator writes what it decided on after its `read`
    /// (slurmrestd has no conditional write: whatever landed between the
    /// read and now is overwritten).
    Write {
        index: usize,
        read: Box<actuate::NodeRead>,
    },
    /// Slinky's slurm-operator syncs the worker pods on a Kubernetes node
    /// (its Node watch enqueued them; its slurm-client cache refreshed).
    SlinkySync { node: String },
    /// A terminating worker pod's preStop hook runs.
    PreStop { uid: String },
}

/// lockstep itself: the log, and the reducer folding it.
pub struct Lockstep {
    /// The reducer.
    pub engine: Engine,
    out: Output,
    /// The log: events and the actions issued, in order.
    pub records: Vec<Record>,
    /// Every action issued, in order.
    pub issued: Vec<IssuedAction>,
    /// Indices (into `records`) of connector observations, for re-delivery.
    observations: Vec<usize>,
    seq: u64,
    last_append_ms: Ms,
}

impl Lockstep {
    fn new() -> Self {
        Self {
            engine: Engine::new(Policy::default()),
            out: Output::default(),
            records: Vec::new(),
            issued: Vec::new(),
            observations: Vec::new(),
            seq: 0,
            last_append_ms: 0,
        }
    }

    /// Appends an envelope at virtual time `now`; returns the indices (into
    /// `issued`) of the actions the reducer issued.
    fn append_envelope(&mut self, now: Ms, envelope: Envelope) -> std::ops::Range<usize> {
        self.seq += 1;
        let rec = EventRecord {
            seq: self.seq,
            time_ms: EPOCH_MS + now,
            envelope,
        };
        self.out.clear();
        self.engine.apply(&rec, &mut self.out);
        if matches!(rec.envelope.source, Source::Kubernetes | Source::Slurm)
            && !matches!(
                rec.envelope.event,
                Event::SyncStarted { .. } | Event::SyncDone { .. } | Event::ConnectorStatus { .. }
            )
        {
            self.observations.push(self.records.len());
        }
        self.records.push(Record::Event(rec));
        self.last_append_ms = now;
        let first = self.issued.len();
        for a in &self.out.actions {
            self.records.push(Record::Action(a.clone()));
            self.issued.push(a.clone());
        }
        first..self.issued.len()
    }

    /// The event records of the log.
    pub fn events(&self) -> impl Iterator<Item = &EventRecord> {
        self.records.iter().filter_map(|r| match r {
            Record::Event(e) => Some(e),
            _ => None,
        })
    }
}

/// Facts the world records as it goes, for the properties.
#[derive(Debug, Default)]
pub struct Facts {
    /// Violations seen while running (the online properties).
    pub violations: Vec<Violation>,
    /// Jobs that died of something other than their end, with who caused it.
    pub job_kills: Vec<JobKill>,
    /// Virtual time of each step.
    pub step_ms: Vec<Ms>,
    /// Virtual time of each policy edit.
    pub policy_edits_ms: Vec<Ms>,
    /// World steps that ran (some do nothing: a pod that does not exist).
    pub steps_done: usize,
    /// Count of world events processed.
    pub world_events: u64,
    /// When a job last started, ended or was killed.
    pub last_job_change_ms: Ms,
    /// When a pod that had to pull its image last started its containers
    /// (0 when images are on every node).
    pub last_pulled_start_ms: Ms,
    /// lockstep's writes of a Slurm node's reason, per node, in its
    /// current spell out of service: (the reason it replaced was someone
    /// else's, when).
    pub reason_writes: BTreeMap<String, Vec<(bool, Ms)>>,
}

/// A job that was killed.
#[derive(Debug, Clone)]
pub struct JobKill {
    /// Job id.
    pub job: u64,
    /// The Slurm node whose loss killed it.
    pub node: String,
    /// When slurmctld killed it (virtual ms).
    pub at_ms: Ms,
    /// When it had started.
    pub started_ms: Ms,
    /// When what killed it happened (slurmd died, the node was set DOWN).
    pub cause_ms: Ms,
    /// Who caused it.
    pub by: Actor,
    /// How, in words.
    pub how: String,
}

/// The whole world.
pub struct World {
    pub(crate) cfg: WorldConfig,
    pub(crate) setup: Setup,
    steps: Vec<Step>,
    pub(crate) now: Ms,
    /// What is due, by (virtual time, order): a step's order is its
    /// index, every other event's the next of [`World::order`]. Among
    /// events due at one instant, the lower order runs first.
    queue: BTreeMap<(Ms, u64), Ev>,
    /// The order the last event scheduled was given; it starts past the
    /// steps' indices, so no event ever takes a step's place in the queue,
    /// or another's.
    order: u64,
    pub(crate) rng: Rng,
    /// Draws of the Slurm jobs' lane alone.
    pub(crate) lane_rng: Rng,
    pub(crate) kube: Kube,
    pub(crate) slurm: Slurm,
    pub(crate) obs: Observers,
    /// lockstep: its log and its reducer.
    pub ls: Lockstep,
    pub(crate) edits: PolicyState,
    pub(crate) policy: Policy,
    /// What happened, for the properties.
    pub facts: Facts,
    executed: std::collections::BTreeSet<String>,
    end_ms: Ms,
    /// The pod a timed step acts on, resolved when it starts (pods come and
    /// go; its end must find the same one).
    step_pods: BTreeMap<usize, String>,
    /// Reason prefixes of the policies in force before the current one:
    /// lockstep's Slurm actuator follows the policy (the service hands it
    /// the reason ownership of every `PolicyChanged`).
    pub(crate) earlier_prefixes: Vec<String>,
}

impl World {
    /// A world set up as `schedule.setup` says, with lockstep's log started
    /// (the policy, then a full listing of every kind of object).
    pub fn new(schedule: &Schedule, cfg: WorldConfig) -> Self {
        let setup = schedule.setup.clone();
        let edits = PolicyState::default();
        let policy = schedule::policy_for(&setup, edits);
        let mut w = Self {
            rng: Rng(setup.jitter_seed),
            lane_rng: Rng(setup.jitter_seed ^ 0x6a6f_6273_6c61_6e65),
            kube: Kube::default(),
            slurm: Slurm::default(),
            obs: Observers::new(&policy),
            ls: Lockstep::new(),
            edits,
            policy,
            facts: Facts::default(),
            executed: Default::default(),
            step_pods: BTreeMap::new(),
            earlier_prefixes: Vec::new(),
            steps: schedule.steps.clone(),
            now: 0,
            queue: BTreeMap::new(),
            order: schedule.steps.len() as u64,
            end_ms: 0,
            cfg,
            setup,
        };
        w.build_cluster();
        let p = w.policy.clone();
        w.append(Source::Lockstep, Event::PolicyChanged(Box::new(p)));
        for kind in observe::Kind::ALL {
            w.kube_relist(kind, true);
        }
        w.slurm_relist(true, true);
        let mut t = 0;
        for (i, s) in w.steps.iter().enumerate() {
            t += s.after_ms;
            w.facts.step_ms.push(t);
            w.queue.insert((t, i as u64), Ev::Step(i));
        }
        w.end_ms = t + w.cfg.quiet_ms;
        debug_assert!(w.end_ms >= w.quiet_since_ms());
        w.at(w.cfg.tick_interval_ms, Ev::Tick);
        w.at(w.cfg.slurmd_ping_interval_ms, Ev::Ping);
        w
    }

    /// Runs the schedule until the world has been quiet for `quiet_ms`.
    pub fn run(mut self) -> Self {
        loop {
            let deadline = self.quiet_since_ms() + self.cfg.quiet_ms;
            match self.queue.keys().next() {
                Some(&(at, _)) if at <= deadline => self.run_until(at),
                _ => {
                    self.end_ms = deadline;
                    self.now = deadline;
                    return self;
                }
            }
        }
    }

    /// Runs everything due up to virtual time `t`.
    pub(crate) fn run_until(&mut self, t: Ms) {
        while let Some((&(at, o), _)) = self.queue.iter().next() {
            if at > t {
                break;
            }
            let ev = self.queue.remove(&(at, o)).expect("present");
            debug_assert!(at >= self.now);
            self.now = at;
            self.facts.world_events += 1;
            self.handle(ev);
        }
        self.now = self.now.max(t);
    }

    /// Since when the world has been quiet: the last step, or the last job
    /// start or end after it, or the last start of a pod that pulled its
    /// image (a rolling replacement of slow pods outlasts any step)
    /// (virtual ms).
    pub fn quiet_since_ms(&self) -> Ms {
        let last_step = self.facts.step_ms.last().copied().unwrap_or(0);
        last_step
            .max(self.facts.last_job_change_ms)
            .max(self.facts.last_pulled_start_ms)
    }

    /// The end of the run (virtual ms).
    pub fn end_ms(&self) -> Ms {
        self.end_ms
    }

    /// lockstep's log as a timeline: one line per event, the actions it
    /// caused indented under it (virtual seconds).
    pub fn timeline(&self) -> String {
        let mut out = String::new();
        for r in &self.ls.records {
            match r {
                Record::Event(e) => {
                    if matches!(e.envelope.event, Event::Tick) {
                        continue;
                    }
                    out.push_str(&format!(
                        "{:>8.1} s #{:<5} {:<10} {}\n",
                        (e.time_ms - EPOCH_MS) as f64 / 1000.0,
                        e.seq,
                        e.envelope.source.name(),
                        e.envelope.event.summary()
                    ));
                }
                Record::Action(a) => out.push_str(&format!(
                    "{:>8} -> {} [{} #{}] {}\n",
                    "",
                    a.action.describe(),
                    a.rule,
                    a.attempt,
                    a.id
                )),
                Record::Header(_) | Record::Snapshot(_) => {}
            }
        }
        out
    }

    /// The world as it stands: scale targets, Kubernetes nodes, pods, Slurm
    /// nodes and jobs, one a line.
    pub fn state(&self) -> String {
        let mut out = String::new();
        for w in &self.kube.sets {
            out.push_str(&format!(
                "set {} replicas={} by {} ready={}\n",
                w.name, w.replicas, w.replicas_by, w.ready_replicas
            ));
        }
        for n in self.kube.nodes.values() {
            let taints: Vec<String> = n
                .taints
                .iter()
                .map(|(t, by)| format!("{} by {by}", t.key))
                .collect();
            out.push_str(&format!(
                "node {} {:?} Ready={:?}{} taints={taints:?}\n",
                n.name,
                n.host,
                n.ready,
                if n.unschedulable { " cordoned" } else { "" }
            ));
        }
        for p in self.kube.pods.values() {
            out.push_str(&format!(
                "pod {} {:?} ready={} on {} {}{} cost={}\n",
                p.name,
                p.phase,
                p.ready,
                p.node.as_deref().unwrap_or("-"),
                p.deletion
                    .as_ref()
                    .map_or(String::new(), |(_, by)| format!("deleting (by {by}) ")),
                if p.disruption_target { "evicted " } else { "" },
                p.deletion_cost()
            ));
        }
        for n in self.slurm.nodes.values() {
            out.push_str(&format!(
                "slurm {} {}{}{}{} jobs={:?} reason={:?}\n",
                n.name,
                n.base,
                n.drain
                    .as_ref()
                    .map_or(String::new(), |(by, _)| format!("+DRAIN(by {by})")),
                if n.completing > 0 { "+COMPLETING" } else { "" },
                if n.not_responding {
                    "+NOT_RESPONDING"
                } else {
                    ""
                },
                n.jobs,
                n.reason
            ));
        }
        for j in self.slurm.jobs.values() {
            out.push_str(&format!(
                "job {} {} {} nodes={} on {:?} {:?}\n",
                j.id, j.state, j.partition, j.node_count, j.nodes, j.pending_reason
            ));
        }
        out
    }

    /// The policy in force at the end.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Schedules `ev` at `now + delay_ms`.
    pub(crate) fn at(&mut self, delay_ms: u64, ev: Ev) {
        self.order += 1;
        let replaced = self.queue.insert((self.now + delay_ms, self.order), ev);
        assert!(replaced.is_none(), "an event took the place of another");
    }

    /// Appends one event to lockstep's log and hands the actions it caused
    /// to the actuators.
    pub(crate) fn append(&mut self, source: Source, event: Event) {
        let env = Envelope::new(source, EPOCH_MS + self.now, event);
        self.append_envelope(env);
    }

    fn append_envelope(&mut self, env: Envelope) {
        let issued = self.ls.append_envelope(self.now, env);
        if !self.cfg.lockstep_acts {
            return;
        }
        for index in issued {
            let lat = self.rng.between(self.cfg.actuator_latency_ms);
            self.at(lat, Ev::Execute { index });
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Step(i) => {
                self.facts.steps_done += 1;
                self.step(i);
            }
            Ev::StepEnds(i) => self.step_ends(i),
            Ev::Tick => {
                let due = self.ls.last_append_ms + self.cfg.tick_interval_ms;
                if self.now >= due {
                    self.append(Source::Lockstep, Event::Tick);
                }
                let next = self.ls.last_append_ms + self.cfg.tick_interval_ms;
                self.at(next - self.now, Ev::Tick);
            }
            Ev::Controllers => self.reconcile(),
            Ev::ContainersStart { uid } => self.containers_start(&uid),
            Ev::PodReady { uid } => self.pod_ready(&uid),
            Ev::ContainersStopped { uid } => self.containers_stopped(&uid),
            Ev::PodFinalized { uid } => self.pod_finalized(&uid),
            Ev::NodeMonitor { node, epoch } => self.node_monitor(&node, epoch),
            Ev::PodGc { node } => self.pod_gc(&node),
            Ev::KubeletUp { node, epoch } => self.kubelet_up(&node, epoch),
            Ev::KubeDeliver { kind } => self.kube_deliver(kind),
            Ev::KubeRestart => {
                for kind in observe::Kind::ALL {
                    self.kube_relist(kind, true);
                }
            }
            Ev::SlurmdRegister { uid, instance } => self.slurmd_register(&uid, instance),
            Ev::Ping => {
                self.ping();
                self.at(self.cfg.slurmd_ping_interval_ms, Ev::Ping);
            }
            Ev::SlurmSchedule => self.slurm_schedule(),
            Ev::JobEnds { job } => self.job_ends(job),
            Ev::JobDone { job } => self.job_done(job),
            Ev::JobPurged { job } => self.job_purged(job),
            Ev::SlurmPoll(lane) => self.slurm_poll(lane),
            Ev::Execute { index } => self.execute(index),
            Ev::Write { index, read } => self.write(index, &read),
            Ev::SlinkySync { node } => self.slinky_sync(&node),
            Ev::PreStop { uid } => self.pre_stop(&uid),
        }
    }

    fn step(&mut self, i: usize) {
        let op = self.steps[i].op.clone();
        let by = Actor::Step(i);
        match op {
            Op::Cordon { node } => self.set_cordon(node, true, &by),
            Op::Uncordon { node } => self.set_cordon(node, false, &by),
            Op::NodeNotReady { node, for_s } => {
                if self.kubelet_not_ready(node, &by) {
                    self.at(u64::from(for_s) * 1000, Ev::StepEnds(i));
                }
            }
            Op::HostDies { node } => self.host_dies(node, &by),
            Op::HostBack { node } => self.host_back(node),
            Op::DeleteNode { node } => self.delete_node(node, &by),
            Op::ForceDeletePod { pod } => self.force_delete(pod, &by),
            Op::EvictPod { pod } => self.evict(pod, &by),
            Op::XidError { node, for_s } => {
                if self.set_xid(node, true) {
                    self.at(u64::from(for_s) * 1000, Ev::StepEnds(i));
                }
            }
            Op::Relabel { node, rack, value } => self.relabel(node, rack, value),
            Op::NewRevision { fixed } => self.new_revision(usize::from(fixed), &by),
            Op::Redeliver { back } => self.redeliver(back),
            // A listing of Slurm fails while slurmrestd does not answer.
            Op::Relist {
                kind: schedule::RelistKind::SlurmNodes | schedule::RelistKind::SlurmJobs,
                ..
            } if self.slurm.restd_down => {}
            Op::Relist { kind, forget } => match kind {
                schedule::RelistKind::KubeNodes => self.kube_relist(observe::Kind::Nodes, forget),
                schedule::RelistKind::KubePods => self.kube_relist(observe::Kind::Pods, forget),
                schedule::RelistKind::KubeScaleTargets => {
                    self.kube_relist(observe::Kind::Targets, forget)
                }
                schedule::RelistKind::SlurmNodes => self.slurm_relist(forget, false),
                schedule::RelistKind::SlurmJobs => self.slurm_relist_jobs(forget),
            },
            Op::SubmitJob {
                fixed,
                nodes,
                run_s,
            } => self.submit(fixed, nodes, run_s),
            Op::AdminDrain { pod, reason } => self.admin_drain(pod, reason, &by),
            Op::AdminResume { pod } => self.admin_resume(pod, &by),
            Op::SlurmdBlip { pod, for_s } => {
                if let Some(name) = self.pod_name(pod) {
                    if self.slurmd_blip(&name, Some(&by)) {
                        self.step_pods.insert(i, name);
                        self.at(u64::from(for_s) * 1000, Ev::StepEnds(i));
                    }
                }
            }
            Op::AdminRewriteReason { pod, reason } => self.admin_rewrite_reason(pod, reason, &by),
            Op::SlurmrestdDown { for_s } => {
                if self.slurmrestd_down(true) {
                    self.at(u64::from(for_s) * 1000, Ev::StepEnds(i));
                }
            }
            Op::Policy { edit } => {
                let prefix = self.policy.drain.reason_prefix.clone();
                if !self.earlier_prefixes.contains(&prefix) {
                    self.earlier_prefixes.push(prefix);
                }
                self.edits.apply(edit);
                self.policy = schedule::policy_for(&self.setup, self.edits);
                self.facts.policy_edits_ms.push(self.now);
                let p = self.policy.clone();
                self.append(Source::Lockstep, Event::PolicyChanged(Box::new(p)));
                // The Kubernetes observer's spec follows the policy (which
                // labels, conditions and taints it reports): a new observer
                // starts and lists everything under the new spec.
                self.obs.set_spec(&self.policy);
                self.at(500, Ev::KubeRestart);
            }
        }
    }

    fn step_ends(&mut self, i: usize) {
        match self.steps[i].op.clone() {
            Op::NodeNotReady { node, .. } => self.kubelet_recovers(node),
            Op::XidError { node, .. } => {
                self.set_xid(node, false);
            }
            Op::SlurmdBlip { .. } => {
                if let Some(name) = self.step_pods.remove(&i) {
                    self.slurmd_blip(&name, None);
                }
            }
            Op::SlurmrestdDown { .. } => {
                self.slurmrestd_down(false);
            }
            _ => {}
        }
    }

    /// Re-appends an earlier observation verbatim: a re-publish after the
    /// stream's deduplication window has passed.
    fn redeliver(&mut self, back: u16) {
        let n = self.ls.observations.len();
        if n == 0 {
            return;
        }
        let idx = self.ls.observations[n - 1 - usize::from(back) % n];
        let Record::Event(rec) = &self.ls.records[idx] else {
            unreachable!("observations index event records")
        };
        let env = rec.envelope.clone();
        self.append_envelope(env);
    }

    /// The Slurm node name of a pod reference, if such a pod exists.
    pub(crate) fn pod_name(&self, r: schedule::PodRef) -> Option<String> {
        let set = usize::from(r.set.min(1));
        if set >= self.kube.sets.len() {
            return None;
        }
        let names: Vec<&String> = self
            .kube
            .pods
            .values()
            .filter(|p| p.set == set)
            .map(|p| &p.name)
            .collect();
        if names.is_empty() {
            return None;
        }
        Some(names[usize::from(r.index) % names.len()].clone())
    }

    /// The name of the Kubernetes node with this index (deleted ones included).
    pub(crate) fn node_name(&self, i: u8) -> String {
        format!(
            "k8s-{}",
            usize::from(i) % usize::from(self.setup.kube_nodes.max(1))
        )
    }
}

/// Runs a schedule with the default world configuration.
pub fn run(schedule: &Schedule) -> World {
    World::new(schedule, WorldConfig::default()).run()
}
