//! Synthetic logs for the benchmarks and the tests: a cluster of Slurm nodes
//! in pods on Kubernetes nodes, brought up, then a steady-state mix of the
//! events a real cluster produces (Slurm state changes from jobs starting
//! and ending, job updates, unchanged relists, kubelet heartbeats, ticks,
//! and now and then a cordon with its drain and outcome).
//!
//! A seed and a [`Shape`] give the same log, byte for byte, on every machine
//! and with every build: benchmark figures and tests depend on it, so a
//! change here that changes the records is a change of those figures.

use std::collections::BTreeMap;

use lockstep_engine::{Engine, Output};
use lockstep_schemas::{
    ActionOutcome, ConditionStatus, Envelope, Event, EventRecord, KubeNode, KubePod, OutcomeResult,
    PodPhase, Policy, SlurmBaseState, SlurmJob, SlurmJobState, SlurmNode, Source, Text,
};

/// Deterministic pseudo-random numbers (SplitMix64): the same seed gives the
/// same log on every machine, without a dependency.
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The shape of a synthetic cluster.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Slurm nodes (one pod each).
    pub slurm_nodes: usize,
    /// Slurm nodes per Kubernetes node.
    pub per_kube_node: usize,
    /// Jobs waiting in the queue (kept constant: each job that ends brings a
    /// new submission).
    pub pending_jobs: usize,
    /// Turn on the scaling policy (the pods belong to one StatefulSet scaled
    /// from the partition) and the topology policy (zone features, block
    /// topology from node labels).
    pub scaling_and_topology: bool,
}

impl Shape {
    /// Drain and health only, no queue.
    pub const fn plain(slurm_nodes: usize, per_kube_node: usize) -> Self {
        Self {
            slurm_nodes,
            per_kube_node,
            pending_jobs: 0,
            scaling_and_topology: false,
        }
    }
}

/// A whole fleet cordoned at once, lockstep's actuators silent:
/// `slurm_nodes` idle Slurm nodes, one per Kubernetes node, scaling and
/// topology on, every Kubernetes node cordoned and nothing lockstep issued
/// for that answered. Its shape, its log, and the actions in flight at the
/// end of it.
pub fn cordoned_fleet(slurm_nodes: usize, seed: u64) -> (Shape, Vec<EventRecord>, usize) {
    let shape = Shape {
        slurm_nodes,
        per_kube_node: 1,
        pending_jobs: 0,
        scaling_and_topology: true,
    };
    let mut g = Generator::new(shape, seed);
    let in_flight = g.cordon_all();
    (shape, g.into_records(), in_flight)
}

/// The policy of a synthetic cluster.
pub fn policy(shape: Shape) -> Policy {
    let mut p = Policy::default();
    if shape.scaling_and_topology {
        p.topology.features = vec![lockstep_schemas::LabelFeature {
            label: "topology.kubernetes.io/zone".to_owned(),
            prefix: "zone-".to_owned(),
        }];
        p.topology.unit_label = Some("example.com/block".to_owned());
        p.topology.topology_name = "blocks".to_owned();
        p.scaling.targets = vec![lockstep_schemas::ScaleRule {
            target: gpu_set(),
            partition: "gpu".to_owned(),
            min_replicas: 1,
            max_replicas: shape.slurm_nodes as u32,
            scale_up_cooldown_s: 30,
            scale_down_cooldown_s: 120,
            idle_before_scale_down_s: 300,
            max_unavailable: 1,
        }];
    }
    p
}

fn gpu_set() -> lockstep_schemas::ScaleTargetRef {
    lockstep_schemas::ScaleTargetRef {
        group: "apps".to_owned(),
        kind: "StatefulSet".to_owned(),
        namespace: "slurm".to_owned(),
        name: "gpu".to_owned(),
    }
}

/// A cluster under construction, and its log.
pub struct Generator {
    shape: Shape,
    rng: Rng,
    seq: u64,
    now_ms: u64,
    slurm: Vec<SlurmNode>,
    kube: Vec<KubeNode>,
    jobs: BTreeMap<u64, (SlurmJob, Vec<usize>)>,
    queue: std::collections::VecDeque<SlurmJob>,
    next_job: u64,
    /// Recent drain action ids awaiting an outcome, from a live engine.
    engine: Engine,
    out: Output,
    records: Vec<EventRecord>,
}

impl Generator {
    /// Brings up a cluster: policy, Kubernetes nodes, Slurm nodes, pods.
    pub fn new(shape: Shape, seed: u64) -> Self {
        let kube_nodes = shape.slurm_nodes.div_ceil(shape.per_kube_node);
        let mut g = Self {
            shape,
            rng: Rng::new(seed),
            seq: 0,
            now_ms: 1_772_334_000_000,
            slurm: Vec::with_capacity(shape.slurm_nodes),
            kube: Vec::with_capacity(kube_nodes),
            jobs: BTreeMap::new(),
            queue: std::collections::VecDeque::new(),
            next_job: 1,
            engine: Engine::new(policy(shape)),
            out: Output::default(),
            records: Vec::new(),
        };
        g.push(
            Source::Lockstep,
            Event::PolicyChanged(Box::new(policy(shape))),
        );
        if shape.scaling_and_topology {
            g.push(
                Source::Kubernetes,
                Event::KubeScaleTarget(lockstep_schemas::KubeScaleTarget {
                    target: gpu_set(),
                    replicas: shape.slurm_nodes as u32,
                    ready_replicas: shape.slurm_nodes as u32,
                    update_revision: Some("rev-1".to_owned()),
                    version: 0,
                }),
            );
        }
        for k in 0..kube_nodes {
            let node = KubeNode {
                read_labels: None,
                maintenance: None,
                name: lockstep_schemas::format_text!("node-{k:05}"),
                unschedulable: false,
                ready: ConditionStatus::True,
                conditions: vec![],
                labels: [
                    (
                        "topology.kubernetes.io/zone".to_owned(),
                        format!("{}", k % 4),
                    ),
                    ("example.com/block".to_owned(), format!("b{}", k / 18)),
                ]
                .into(),
                taints: vec![],
                identity: Default::default(),
                devices: Default::default(),
                version: 0,
            };
            g.kube.push(node.clone());
            g.push(Source::Kubernetes, Event::KubeNode(node));
        }
        for i in 0..shape.slurm_nodes {
            let name = format!("gpu-{i:05}");
            let node = SlurmNode {
                name: name.as_str().into(),
                state: SlurmBaseState::Idle,
                flags: vec![],
                reason: None,
                reason_user: None,
                features: vec!["gpu".into(), "h100".into()],
                topology: None,
                partitions: vec!["gpu".into()],
                version: 0,
            };
            g.slurm.push(node.clone());
            g.push(Source::Slurm, Event::SlurmNode(node));
            let pod = KubePod {
                namespace: "slurm".to_owned(),
                name,
                uid: format!("uid-{i:08x}"),
                node_name: Some(g.kube[i / shape.per_kube_node].name.to_string()),
                phase: PodPhase::Running,
                deleting: false,
                disruption_target: false,
                labels: BTreeMap::new(),
                conditions: vec![],
                owner: shape
                    .scaling_and_topology
                    .then(|| lockstep_schemas::OwnerRef {
                        kind: "StatefulSet".to_owned(),
                        name: "gpu".to_owned(),
                    }),
                revision: shape.scaling_and_topology.then(|| "rev-1".to_owned()),
                ready: true,
                unhealthy_devices: Default::default(),
                eviction: Default::default(),
                version: 0,
            };
            g.push(Source::Kubernetes, Event::KubePod(pod));
        }
        if shape.scaling_and_topology {
            // Features and topology as lockstep would have set them.
            for i in 0..shape.slurm_nodes {
                let k = i / shape.per_kube_node;
                let n = &mut g.slurm[i];
                n.features = vec![
                    "gpu".into(),
                    "h100".into(),
                    format!("zone-{}", k % 4).into(),
                ];
                n.features.sort();
                n.topology = Some(format!("blocks:b{}", k / 18).into());
                let node = n.clone();
                g.push(Source::Slurm, Event::SlurmNode(node));
            }
        }
        for _ in 0..shape.pending_jobs {
            g.submit();
        }
        g
    }

    /// Queues a job for 1-4 nodes.
    fn submit(&mut self) {
        let width = 1 + self.rng.below(4) as u32;
        let job = SlurmJob {
            job_id: self.next_job,
            state: SlurmJobState::Pending,
            partition: "gpu".into(),
            node_count: width,
            nodes: vec![],
            pending_reason: Some("Resources".to_owned()),
            version: 0,
        };
        self.next_job += 1;
        self.queue.push_back(job.clone());
        self.push(Source::Slurm, Event::SlurmJob(job));
    }

    fn push(&mut self, source: Source, event: Event) {
        self.seq += 1;
        let rec = EventRecord {
            seq: self.seq,
            time_ms: self.now_ms,
            envelope: Envelope::new(source, self.now_ms, event),
        };
        self.out.clear();
        self.engine.apply(&rec, &mut self.out);
        self.records.push(rec);
    }

    /// Appends `n` events of the steady-state mix.
    pub fn steady_state(&mut self, n: usize) {
        let target = self.records.len() + n;
        while self.records.len() < target {
            // A busy cluster: about a thousand events a second, so ticks
            // (appended only when the log is quiet) are rare.
            self.now_ms += self.rng.below(3);
            match self.rng.below(100) {
                // A job starts or ends: job event, then its nodes change state.
                0..=29 => self.job_churn(),
                // An unchanged relist of a Slurm node.
                30..=44 => {
                    let i = self.rng.below(self.slurm.len() as u64) as usize;
                    let node = self.slurm[i].clone();
                    self.push(Source::Slurm, Event::SlurmNode(node));
                }
                // A kubelet heartbeat: nothing lockstep reads changed.
                45..=74 => {
                    let k = self.rng.below(self.kube.len() as u64) as usize;
                    let node = self.kube[k].clone();
                    self.push(Source::Kubernetes, Event::KubeNode(node));
                }
                75..=76 => self.push(Source::Lockstep, Event::Tick),
                77..=89 => {
                    let i = self.rng.below(self.slurm.len() as u64) as usize;
                    let node = self.slurm[i].clone();
                    self.push(Source::Slurm, Event::SlurmNode(node));
                }
                // Now and then a cordon or uncordon, with the actuator's
                // outcomes and Slurm showing the effect.
                90 if self.rng.below(4) == 0 => self.cordon_flip(),
                _ => {
                    let k = self.rng.below(self.kube.len() as u64) as usize;
                    let node = self.kube[k].clone();
                    self.push(Source::Kubernetes, Event::KubeNode(node));
                }
            }
        }
        self.records.truncate(target);
    }

    fn job_churn(&mut self) {
        let start = self.jobs.len() < self.slurm.len() / 8 || self.rng.below(2) == 0;
        if start {
            let (job_id, width) = match self.queue.pop_front() {
                Some(j) => (j.job_id, j.node_count as usize),
                None => {
                    self.next_job += 1;
                    (self.next_job - 1, 1 + self.rng.below(4) as usize)
                }
            };
            let first = self.rng.below((self.slurm.len() - width) as u64) as usize;
            let nodes: Vec<Text> = self.slurm[first..first + width]
                .iter()
                .map(|n| n.name.as_str().into())
                .collect();
            let job = SlurmJob {
                job_id,
                state: SlurmJobState::Running,
                partition: "gpu".into(),
                node_count: width as u32,
                nodes,
                pending_reason: None,
                version: 0,
            };
            self.jobs
                .insert(job.job_id, (job.clone(), (first..first + width).collect()));
            self.push(Source::Slurm, Event::SlurmJob(job));
            for i in first..first + width {
                self.slurm[i].state = SlurmBaseState::Allocated;
                let node = self.slurm[i].clone();
                self.push(Source::Slurm, Event::SlurmNode(node));
            }
        } else if let Some((&id, _)) = self
            .jobs
            .iter()
            .nth(self.rng.below(self.jobs.len() as u64) as usize)
        {
            let (mut job, nodes) = self.jobs.remove(&id).expect("picked from the map");
            job.state = SlurmJobState::Completed;
            self.push(Source::Slurm, Event::SlurmJob(job));
            self.push(
                Source::Slurm,
                Event::SlurmJobGone {
                    job_id: id,
                    version: 0,
                },
            );
            if self.shape.pending_jobs > 0 {
                self.submit();
            }
            for i in nodes {
                self.slurm[i].state = SlurmBaseState::Idle;
                let node = self.slurm[i].clone();
                self.push(Source::Slurm, Event::SlurmNode(node));
            }
        }
    }

    fn cordon_flip(&mut self) {
        let k = self.rng.below(self.kube.len() as u64) as usize;
        self.kube[k].unschedulable = !self.kube[k].unschedulable;
        let node = self.kube[k].clone();
        self.push(Source::Kubernetes, Event::KubeNode(node));
        self.settle_outcomes();
    }

    /// Reports success for what is pending and shows its effect in Slurm.
    fn settle_outcomes(&mut self) {
        for (target, id) in self.engine.pending() {
            let lockstep_schemas::Target::SlurmNodeState { node } = &target else {
                continue;
            };
            let Some(i) = node
                .strip_prefix("gpu-")
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            self.push(
                Source::Actuator,
                Event::ActionOutcome(ActionOutcome {
                    action_id: id,
                    kind: lockstep_schemas::ActionKind::SlurmDrain,
                    target: target.clone(),
                    result: OutcomeResult::Succeeded,
                }),
            );
            let n = &mut self.slurm[i];
            if n.flags.contains(&lockstep_schemas::SlurmNodeFlag::Drain) {
                n.flags.clear();
                n.reason = None;
                n.reason_user = None;
            } else {
                n.flags = vec![lockstep_schemas::SlurmNodeFlag::Drain];
                n.reason = Some(format!(
                    "lockstep: kubernetes node {} cordoned",
                    self.kube[i / self.shape.per_kube_node].name
                ));
                n.reason_user = Some("lockstep".to_owned());
            }
            let node = self.slurm[i].clone();
            self.push(Source::Slurm, Event::SlurmNode(node));
        }
    }

    /// Cordons every Kubernetes node at once and reports no outcome for
    /// what that makes lockstep issue (a whole fleet drained, its actuators
    /// silent: what a new leader finds in flight). Returns how many actions
    /// are in flight after.
    pub fn cordon_all(&mut self) -> usize {
        for k in 0..self.kube.len() {
            self.now_ms += 1;
            self.kube[k].unschedulable = true;
            let node = self.kube[k].clone();
            self.push(Source::Kubernetes, Event::KubeNode(node));
        }
        self.engine.pending_ids().count()
    }

    /// Index of the first steady-state record (after bring-up).
    pub fn bring_up_len(shape: Shape) -> usize {
        1 + shape.slurm_nodes.div_ceil(shape.per_kube_node) + 2 * shape.slurm_nodes
    }

    /// The log so far.
    pub fn records(&self) -> &[EventRecord] {
        &self.records
    }

    /// The records generated since the last call (all of them, the first
    /// time), taken out of the generator.
    pub fn take_records(&mut self) -> Vec<EventRecord> {
        std::mem::take(&mut self.records)
    }

    /// The log.
    pub fn into_records(self) -> Vec<EventRecord> {
        self.records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a, 64 bits: a fingerprint that is the same with every build.
    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }

    fn fingerprint(shape: Shape, seed: u64, steady: usize) -> u64 {
        let mut g = Generator::new(shape, seed);
        g.steady_state(steady);
        fnv1a(&serde_json::to_vec(g.records()).expect("records are JSON"))
    }

    /// The logs the tests and the benchmark figures are made of. A value
    /// here changes only when the generator's records change (or an
    /// event's JSON form does): write the reason beside the new value.
    #[test]
    fn the_same_seed_and_shape_give_the_same_log() {
        let busy = Shape {
            slurm_nodes: 100,
            per_kube_node: 8,
            pending_jobs: 20,
            scaling_and_topology: true,
        };
        let cases = [
            // Moved from lockstep-benches to lockstep-testkit: unchanged.
            (Shape::plain(40, 4), 7, 16_283_088_062_123_704_985),
            (Shape::plain(40, 4), 42, 12_479_863_364_373_239_999),
            (busy, 1, 17_644_043_839_353_540_903),
            (busy, 42, 17_283_653_545_852_744_721),
        ];
        for (shape, seed, want) in cases {
            assert_eq!(
                fingerprint(shape, seed, 5000),
                want,
                "{shape:?}, seed {seed}"
            );
        }
    }
}
