//! Invariants of the reducer over random logs (DESIGN.md "Invariants"):
//! the same log gives the same state, transitions and actions at any batch
//! split and across snapshot/restore; re-delivered events change nothing;
//! lockstep never resumes a drain it does not own; never two actions in
//! flight for one target.
//!
//! A failing case prints the shrunk sequence of operations that reproduces it.

use std::collections::BTreeMap;

use lockstep_engine::{Engine, Output, Phase, Transition};
use lockstep_schemas::{
    Action, ActionOutcome, ConditionStatus, Domain, Envelope, Event, EventRecord, IssuedAction,
    KubeNode, KubePod, MappingMode, NodeCondition, OutcomeResult, PodPhase, Policy, Record,
    SlurmBaseState, SlurmNode, SlurmNodeFlag, Source, TaintEffect, TaintSpec, Target,
};
use proptest::prelude::*;

/// Slurm node names, also the names of their pods: ordinals of StatefulSet `gpu`.
const SLURM: [&str; 4] = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"];
const KUBE: [&str; 3] = ["k1", "k2", "k3"];
const PREFIX: &str = "lockstep:";
const MIN_REPLICAS: u32 = 1;
const MAX_REPLICAS: u32 = 3;

fn gpu_set() -> lockstep_schemas::ScaleTargetRef {
    lockstep_schemas::ScaleTargetRef {
        group: "apps".into(),
        kind: "StatefulSet".into(),
        namespace: "slurm".into(),
        name: "gpu".into(),
    }
}

/// One thing that happens in the random cluster.
#[derive(Debug, Clone)]
enum Op {
    Slurm {
        node: usize,
        state: u8,
        drain: Option<bool>,
        not_responding: bool,
    },
    SlurmGone {
        node: usize,
    },
    Kube {
        node: usize,
        cordoned: bool,
        ready: u8,
        xid: bool,
        taint: bool,
    },
    Pod {
        node: usize,
        on: usize,
        deleting: bool,
        evicted: bool,
        cond: u8,
    },
    PodGone {
        node: usize,
    },
    Advance {
        s: u64,
    },
    /// Report an outcome for the i-th pending action (if any).
    Outcome {
        pick: usize,
        result: u8,
    },
    Sync {
        domain: u8,
        keep: u8,
    },
    SlurmVisible(bool),
    /// A new policy: host mode, and whether the set's pods are scaled in by
    /// deleting them (`delete_pod`) rather than by ordinal.
    Policy {
        host: bool,
        delete_pod: bool,
    },
    /// A job: 0 pending (scalable), 1 pending (held), 2 running, 3 gone.
    Job {
        id: u64,
        state: u8,
        nodes: u8,
        count: u32,
    },
    Scale {
        replicas: u32,
        revision: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..4usize, 0..4u8, prop::option::of(any::<bool>()), prop::bool::weighted(0.15))
            .prop_map(|(node, state, drain, not_responding)| Op::Slurm { node, state, drain, not_responding }),
        1 => (0..4usize).prop_map(|node| Op::SlurmGone { node }),
        4 => (0..3usize, prop::bool::weighted(0.3), 0..4u8, prop::bool::weighted(0.2), any::<bool>())
            .prop_map(|(node, cordoned, ready, xid, taint)| Op::Kube { node, cordoned, ready, xid, taint }),
        3 => (0..4usize, 0..3usize, prop::bool::weighted(0.15), prop::bool::weighted(0.15), 0..3u8)
            .prop_map(|(node, on, deleting, evicted, cond)| Op::Pod { node, on, deleting, evicted, cond }),
        1 => (0..4usize).prop_map(|node| Op::PodGone { node }),
        4 => prop_oneof![1..20u64, 20..200u64].prop_map(|s| Op::Advance { s }),
        4 => (0..4usize, 0..4u8).prop_map(|(pick, result)| Op::Outcome { pick, result }),
        1 => (0..3u8, any::<u8>()).prop_map(|(domain, keep)| Op::Sync { domain, keep }),
        1 => any::<bool>().prop_map(Op::SlurmVisible),
        1 => (prop::bool::weighted(0.3), prop::bool::weighted(0.3))
            .prop_map(|(host, delete_pod)| Op::Policy { host, delete_pod }),
        3 => (0..5u64, 0..4u8, any::<u8>(), 1..4u32).prop_map(|(id, state, nodes, count)| Op::Job { id, state, nodes, count }),
        1 => (0..5u32, any::<bool>()).prop_map(|(replicas, revision)| Op::Scale { replicas, revision }),
    ]
}

fn policy(host: bool) -> Policy {
    let mut p = Policy::default();
    p.health.not_ready_grace_s = 30;
    p.health.node_conditions = vec!["GpuXid".into()];
    p.health.drains_per_minute_max = 2;
    p.health.flaps_max = 2;
    p.health.flap_hold_s = 300;
    p.health.resume_after_s = 20;
    p.drain.foreign_drain_taint = Some(TaintSpec {
        key: "lockstep.io/foreign-drain".into(),
        value: String::new(),
        effect: TaintEffect::PreferNoSchedule,
    });
    p.actions.timeout_s = 45;
    p.scaling.targets = vec![lockstep_schemas::ScaleRule {
        target: gpu_set(),
        partition: "batch".into(),
        min_replicas: MIN_REPLICAS,
        max_replicas: MAX_REPLICAS,
        scale_up_cooldown_s: 10,
        scale_down_cooldown_s: 20,
        idle_before_scale_down_s: 30,
        max_unavailable: 1,
    }];
    p.actions.attempts_max = 3;
    if host {
        p.mapping.mode = MappingMode::Host;
    }
    p
}

/// The random cluster as the connectors see it, for building events.
#[derive(Default)]
struct World {
    slurm: BTreeMap<usize, SlurmNode>,
    pods: BTreeMap<usize, KubePod>,
}

/// Turns operations into a log, resolving outcome picks against the
/// reducer's pending actions as it goes (the same way every time).
fn build_log(ops: &[Op]) -> Vec<EventRecord> {
    let mut engine = Engine::new(Policy::default());
    let mut out = Output::default();
    let mut world = World::default();
    let mut recs = Vec::new();
    let mut now = 1_000_000u64;
    let mut revision = 0u64;
    let mut push =
        |mut event: Event, now: u64, engine: &mut Engine, recs: &mut Vec<EventRecord>| {
            // Every observation and deletion gets the next revision, as etcd
            // gives them (a relisted object gets a newer one: the versions-only
            // change a relist may bring).
            stamp(&mut event, &mut revision);
            // Stride 2: the odd numbers stay free for re-delivered copies.
            let rec = EventRecord {
                seq: 2 * (recs.len() as u64 + 1),
                time_ms: now,
                envelope: Envelope::new(Source::Test, now, event),
            };
            out.clear();
            engine.apply(&rec, &mut out);
            recs.push(rec);
        };
    push(
        Event::PolicyChanged(Box::new(policy(false))),
        now,
        &mut engine,
        &mut recs,
    );
    for op in ops {
        let event = match op {
            Op::Slurm {
                node,
                state,
                drain,
                not_responding,
            } => {
                let mut n = SlurmNode {
                    name: SLURM[*node].into(),
                    state: [
                        SlurmBaseState::Idle,
                        SlurmBaseState::Allocated,
                        SlurmBaseState::Mixed,
                        SlurmBaseState::Down,
                    ][*state as usize]
                        .clone(),
                    flags: vec![],
                    reason: None,
                    reason_user: None,
                    features: vec![],
                    topology: None,
                    partitions: vec![],
                    version: 0,
                };
                match drain {
                    Some(owned) => {
                        n.flags.push(SlurmNodeFlag::Drain);
                        n.reason = Some(if *owned {
                            format!("{PREFIX} test")
                        } else {
                            "admin: dimm".into()
                        });
                    }
                    None if n.state == SlurmBaseState::Down => {
                        n.reason = Some("Not responding".into())
                    }
                    None => {}
                }
                if *not_responding {
                    n.flags.push(SlurmNodeFlag::NotResponding);
                }
                n.flags.sort();
                world.slurm.insert(*node, n.clone());
                Event::SlurmNode(n)
            }
            Op::SlurmGone { node } => {
                world.slurm.remove(node);
                Event::SlurmNodeGone {
                    name: SLURM[*node].into(),
                    version: 0,
                }
            }
            Op::Kube {
                node,
                cordoned,
                ready,
                xid,
                taint,
            } => Event::KubeNode(KubeNode {
                read_labels: None,
                maintenance: None,
                name: KUBE[*node].into(),
                unschedulable: *cordoned,
                ready: [
                    ConditionStatus::True,
                    ConditionStatus::True,
                    ConditionStatus::False,
                    ConditionStatus::Unknown,
                ][*ready as usize],
                conditions: if *xid {
                    vec![NodeCondition {
                        type_: "GpuXid".into(),
                        status: ConditionStatus::True,
                        reason: String::new(),
                        message: String::new(),
                    }]
                } else {
                    vec![]
                },
                labels: Default::default(),
                taints: if *taint {
                    vec![lockstep_schemas::Taint {
                        key: "lockstep.io/slurm-unhealthy".into(),
                        value: String::new(),
                        effect: TaintEffect::NoSchedule,
                    }]
                } else {
                    vec![]
                },
                identity: Default::default(),
                devices: Default::default(),
                version: 0,
            }),
            Op::Pod {
                node,
                on,
                deleting,
                evicted,
                cond,
            } => {
                let pod = KubePod {
                    namespace: "slurm".into(),
                    name: SLURM[*node].into(),
                    uid: format!("uid-{node}"),
                    node_name: Some(KUBE[*on].into()),
                    phase: PodPhase::Running,
                    deleting: *deleting,
                    disruption_target: *evicted,
                    labels: Default::default(),
                    conditions: match cond {
                        1 => vec![lockstep_schemas::PodCondition {
                            type_: "SlurmNodeDrained".into(),
                            status: ConditionStatus::True,
                            reason: "SlurmDrain".into(),
                            message: "admin: dimm".into(),
                        }],
                        2 => vec![lockstep_schemas::PodCondition {
                            type_: "SlurmNodeHealthy".into(),
                            status: ConditionStatus::False,
                            reason: "SlurmDown".into(),
                            message: String::new(),
                        }],
                        _ => vec![],
                    },
                    owner: Some(lockstep_schemas::OwnerRef {
                        kind: "StatefulSet".into(),
                        name: "gpu".into(),
                    }),
                    revision: Some(if *cond == 1 {
                        "rev-2".into()
                    } else {
                        "rev-1".into()
                    }),
                    ready: true,
                    unhealthy_devices: Default::default(),
                    eviction: Default::default(),
                    version: 0,
                };
                world.pods.insert(*node, pod.clone());
                Event::KubePod(pod)
            }
            Op::PodGone { node } => {
                world.pods.remove(node);
                Event::KubePodGone {
                    namespace: "slurm".into(),
                    name: SLURM[*node].into(),
                    version: 0,
                }
            }
            Op::Advance { s } => {
                now += s * 1000;
                Event::Tick
            }
            Op::Outcome { pick, result } => {
                let pending = engine.pending();
                if pending.is_empty() {
                    Event::Tick
                } else {
                    let (target, id) = pending[pick % pending.len()].clone();
                    Event::ActionOutcome(ActionOutcome {
                        kind: kind_of(&target),
                        action_id: id,
                        target,
                        result: match result {
                            0 => OutcomeResult::Failed {
                                retryable: true,
                                error: "timeout".into(),
                            },
                            1 => OutcomeResult::Failed {
                                retryable: false,
                                error: "invalid".into(),
                            },
                            2 => OutcomeResult::AlreadyDone,
                            _ => OutcomeResult::Succeeded,
                        },
                    })
                }
            }
            Op::Sync { domain, keep } => {
                let d = [Domain::SlurmNodes, Domain::KubePods, Domain::KubeNodes][*domain as usize];
                push(
                    Event::SyncStarted { domain: d },
                    now,
                    &mut engine,
                    &mut recs,
                );
                // Relist part of what exists; the rest is gone at SyncDone.
                if d == Domain::SlurmNodes {
                    let listed: Vec<_> = world
                        .slurm
                        .iter()
                        .filter(|(i, _)| keep >> **i & 1 == 1)
                        .map(|(i, n)| (*i, n.clone()))
                        .collect();
                    world.slurm = listed.iter().cloned().collect();
                    for (_, n) in listed {
                        push(Event::SlurmNode(n), now, &mut engine, &mut recs);
                    }
                } else if d == Domain::KubePods {
                    let listed: Vec<_> = world
                        .pods
                        .iter()
                        .filter(|(i, _)| keep >> **i & 1 == 1)
                        .map(|(i, p)| (*i, p.clone()))
                        .collect();
                    world.pods = listed.iter().cloned().collect();
                    for (_, p) in listed {
                        push(Event::KubePod(p), now, &mut engine, &mut recs);
                    }
                }
                Event::SyncDone { domain: d }
            }
            Op::SlurmVisible(v) => Event::ConnectorStatus {
                connector: lockstep_schemas::Connector::Slurm,
                visible: *v,
                detail: String::new(),
            },
            Op::Policy { host, delete_pod } => {
                let mut p = policy(*host);
                if *delete_pod {
                    p.scaling
                        .removal
                        .insert("StatefulSet".into(), lockstep_schemas::Removal::DeletePod);
                }
                Event::PolicyChanged(Box::new(p))
            }
            Op::Job {
                id,
                state,
                nodes,
                count,
            } => {
                if *state == 3 {
                    Event::SlurmJobGone {
                        job_id: *id,
                        version: 0,
                    }
                } else {
                    let running = *state == 2;
                    Event::SlurmJob(lockstep_schemas::SlurmJob {
                        job_id: *id,
                        state: if running {
                            lockstep_schemas::SlurmJobState::Running
                        } else {
                            lockstep_schemas::SlurmJobState::Pending
                        },
                        partition: "batch".into(),
                        nodes: if running {
                            (0..4)
                                .filter(|i| nodes >> i & 1 == 1)
                                .map(|i| SLURM[i].into())
                                .collect()
                        } else {
                            vec![]
                        },
                        node_count: *count,
                        pending_reason: match state {
                            0 => Some("Resources".into()),
                            1 => Some("JobHeldUser".into()),
                            _ => None,
                        },
                        version: 0,
                    })
                }
            }
            Op::Scale { replicas, revision } => {
                Event::KubeScaleTarget(lockstep_schemas::KubeScaleTarget {
                    target: gpu_set(),
                    replicas: *replicas,
                    ready_replicas: *replicas,
                    update_revision: Some(if *revision {
                        "rev-2".into()
                    } else {
                        "rev-1".into()
                    }),
                    version: 0,
                })
            }
        };
        push(event, now, &mut engine, &mut recs);
    }
    recs
}

/// Gives an observation or deletion the next version.
fn stamp(event: &mut Event, revision: &mut u64) {
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
    *revision += 1;
    *v = *revision;
}

fn kind_of(t: &Target) -> lockstep_schemas::ActionKind {
    use lockstep_schemas::ActionKind::*;
    match t {
        Target::SlurmNodeState { .. } => SlurmDrain,
        Target::PodCondition { .. } => KubeSetPodCondition,
        Target::NodeTaint { .. } => KubeTaintNode,
        Target::Pod { .. } => KubeDeletePod,
        Target::PodLabel { .. } => KubeLabelPod,
        _ => KubeScale,
    }
}

/// Everything a run produced.
#[derive(Debug, PartialEq)]
struct Run {
    transitions: Vec<Transition>,
    actions: Vec<IssuedAction>,
    hash: String,
    phases: Vec<(String, Phase)>,
}

/// Applies records in batches of the given sizes, restarting the engine from
/// a snapshot between batches (a crash after each commit).
fn run_batched(recs: &[EventRecord], batches: &[usize]) -> Run {
    let mut engine = Engine::new(Policy::default());
    let mut out = Output::default();
    let (mut transitions, mut actions) = (Vec::new(), Vec::new());
    let mut i = 0;
    let mut b = 0;
    while i < recs.len() {
        let size = batches.get(b).copied().unwrap_or(recs.len()).max(1);
        b += 1;
        for rec in &recs[i..(i + size).min(recs.len())] {
            out.clear();
            engine.apply(rec, &mut out);
            transitions.append(&mut out.transitions);
            actions.append(&mut out.actions);
        }
        i += size;
        let snap = engine.snapshot();
        engine = Engine::restore(&snap).expect("snapshots restore");
        assert_eq!(
            engine.snapshot(),
            snap,
            "a restored engine snapshots identically"
        );
    }
    Run {
        transitions,
        actions,
        hash: engine.hash(),
        phases: engine.phases(),
    }
}

fn run_once(recs: &[EventRecord]) -> Run {
    run_batched(recs, &[])
}

/// Applies each record to the engine and to a copy restored from its
/// snapshot just before (whose first look at anything is a full one): the
/// two must give the same outputs and hash, record for record. Returns the
/// actions issued, or the first difference.
fn live_beside_restored(recs: &[EventRecord]) -> Result<Vec<IssuedAction>, String> {
    let mut live = Engine::new(Policy::default());
    let (mut a, mut b) = (Output::default(), Output::default());
    let mut actions = Vec::new();
    for (i, rec) in recs.iter().enumerate() {
        let mut restored = Engine::restore(&live.snapshot()).unwrap();
        a.clear();
        b.clear();
        live.apply(rec, &mut a);
        restored.apply(rec, &mut b);
        let kind = rec.envelope.event.kind();
        if a != b {
            return Err(format!(
                "record {i} ({kind:?}) after a restore:\n{a:?}\n{b:?}"
            ));
        }
        if live.hash() != restored.hash() {
            return Err(format!("record {i} ({kind:?}): the hashes differ"));
        }
        actions.append(&mut a.actions);
    }
    Ok(actions)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn a_restored_engine_behaves_like_the_one_it_was_taken_from(
        ops in prop::collection::vec(op(), 1..80),
    ) {
        live_beside_restored(&build_log(&ops)).map_err(TestCaseError::fail)?;
    }

    /// The relevance filter (`model::slurm_relevant_change`) and the busy
    /// count are all that decide whether a new observation of a Slurm node
    /// is evaluated; so no rule may read a difference of base state they
    /// both ignore, or its decision would depend on whether something else
    /// woke the node. Replacing, in every observation, a base state by
    /// another of its class (not DOWN and not busy: IDLE, ERROR, FUTURE,
    /// UNKNOWN; busy: ALLOCATED, MIXED) must change no decision. A rule that
    /// starts reading a base state the filter does not compare fails here.
    #[test]
    fn no_rule_reads_a_base_state_the_relevance_filter_ignores(
        ops in prop::collection::vec(op(), 1..120),
        idle_as in 0..3usize,
    ) {
        let recs = build_log(&ops);
        let idle_as = [SlurmBaseState::Error, SlurmBaseState::Future, SlurmBaseState::Unknown]
            [idle_as]
            .clone();
        let remapped: Vec<EventRecord> = recs
            .iter()
            .cloned()
            .map(|mut r| {
                if let Event::SlurmNode(n) = &mut r.envelope.event {
                    n.state = match &n.state {
                        SlurmBaseState::Idle => idle_as.clone(),
                        SlurmBaseState::Allocated => SlurmBaseState::Mixed,
                        SlurmBaseState::Mixed => SlurmBaseState::Allocated,
                        other => other.clone(),
                    };
                }
                r
            })
            .collect();
        let (a, b) = (run_once(&recs), run_once(&remapped));
        // The details name the state Slurm shows; the decisions must not
        // differ.
        let decided = |r: &Run| -> Vec<_> {
            r.transitions
                .iter()
                .map(|t| (t.seq, t.node.clone(), t.from, t.to, t.rule, t.cause.clone()))
                .collect()
        };
        prop_assert_eq!(decided(&a), decided(&b));
        prop_assert_eq!(&a.actions, &b.actions);
        prop_assert_eq!(&a.phases, &b.phases);
    }

    #[test]
    fn same_log_same_everything_at_any_batch_split_and_across_restarts(
        ops in prop::collection::vec(op(), 1..120),
        batches in prop::collection::vec(1..40usize, 0..20),
    ) {
        let recs = build_log(&ops);
        let whole = run_once(&recs);
        let split = run_batched(&recs, &batches);
        prop_assert_eq!(&whole, &split);
        prop_assert_eq!(whole, run_once(&recs), "a second run on the same log");
    }

    #[test]
    fn re_delivered_events_change_nothing(
        ops in prop::collection::vec(op(), 1..120),
        dup in prop::collection::vec(any::<bool>(), 240),
    ) {
        let recs = build_log(&ops);
        // Every chosen record is delivered twice: a new sequence number, the
        // same envelope, the same append time.
        let mut doubled = Vec::new();
        for (i, r) in recs.iter().enumerate() {
            doubled.push(r.clone());
            if dup[i % dup.len()] {
                doubled.push(r.clone());
            }
        }
        // Copies take the odd sequence number after their original, so the
        // originals (and the action ids derived from them) keep theirs.
        for w in 1..doubled.len() {
            if doubled[w].seq == doubled[w - 1].seq {
                doubled[w].seq += 1;
            }
        }
        let a = run_once(&recs);
        let b = run_once(&doubled);
        let shape_t = |r: &Run| r.transitions.iter().map(|t| (t.node.clone(), t.from, t.to, t.rule, t.cause.clone(), t.time_ms)).collect::<Vec<_>>();
        let shape_a = |r: &Run| r.actions.iter().map(|a| (a.action.clone(), a.attempt, a.time_ms, a.rule.clone())).collect::<Vec<_>>();
        prop_assert_eq!(shape_t(&a), shape_t(&b));
        prop_assert_eq!(shape_a(&a), shape_a(&b));
        prop_assert_eq!(a.phases, b.phases);
    }

    /// An observation re-delivered after newer ones of its object (or after
    /// its deletion) changes nothing: the log's deduplication window is
    /// long gone, the versions tell.
    #[test]
    fn stale_re_deliveries_change_nothing(
        ops in prop::collection::vec(op(), 1..120),
        picks in prop::collection::vec((any::<prop::sample::Index>(), 0..30usize), 1..12),
    ) {
        let recs = build_log(&ops);
        let observations: Vec<usize> = (0..recs.len())
            .filter(|&i| recs[i].envelope.event.version() != 0)
            .collect();
        prop_assume!(!observations.is_empty());
        // (position to insert after, the old record delivered again)
        // Not inside a relist: there an observation equal to the one held
        // counts as listed, and versions cannot tell a copy of the last one
        // from the relist's own (see engine/src/stale.rs).
        let mut listing = vec![false; recs.len()];
        let mut open = false;
        for (i, r) in recs.iter().enumerate() {
            match r.envelope.event {
                Event::SyncStarted { .. } => open = true,
                Event::SyncDone { .. } => open = false,
                _ => {}
            }
            listing[i] = open;
        }
        let mut copies: Vec<(usize, usize)> = picks
            .iter()
            .map(|(idx, later)| {
                let from = observations[idx.index(observations.len())];
                ((from + later).min(recs.len() - 1), from)
            })
            .filter(|&(at, _)| !listing[at])
            .collect();
        copies.sort();
        copies.dedup_by_key(|c| c.0);
        let mut with_copies = Vec::new();
        let mut next = copies.iter().peekable();
        for (i, r) in recs.iter().enumerate() {
            with_copies.push(r.clone());
            if let Some(&&(at, from)) = next.peek() {
                if at == i {
                    next.next();
                    // Appended now: the log's time, the next free (odd) sequence.
                    let mut copy = recs[from].clone();
                    copy.seq = r.seq + 1;
                    copy.time_ms = r.time_ms;
                    with_copies.push(copy);
                }
            }
        }
        let a = run_once(&recs);
        let b = run_once(&with_copies);
        prop_assert_eq!(&a.transitions, &b.transitions);
        prop_assert_eq!(&a.actions, &b.actions);
        prop_assert_eq!(a.phases, b.phases);
    }

    #[test]
    fn never_resumes_a_drain_it_does_not_own_and_never_two_in_flight(
        ops in prop::collection::vec(op(), 1..150),
    ) {
        let recs = build_log(&ops);
        let mut engine = Engine::new(Policy::default());
        let mut out = Output::default();
        let mut latest: BTreeMap<String, SlurmNode> = BTreeMap::new();
        let mut in_flight: BTreeMap<Target, (String, u64)> = BTreeMap::new();
        let mut jobs: BTreeMap<u64, lockstep_schemas::SlurmJob> = BTreeMap::new();
        let mut pods: BTreeMap<String, KubePod> = BTreeMap::new();
        let mut replicas = None;
        let mut by_ordinal = true;
        for rec in &recs {
            match &rec.envelope.event {
                Event::KubePod(p) => { pods.insert(p.name.clone(), p.clone()); }
                Event::KubePodGone { name, .. } => { pods.remove(name); }
                Event::KubeScaleTarget(t) => replicas = Some(t.replicas),
                Event::PolicyChanged(p) => by_ordinal = p.scaling.removal.is_empty(),
                Event::SlurmNode(n) => { latest.insert(n.name.to_string(), n.clone()); }
                Event::SlurmNodeGone { name, .. } => { latest.remove(name); }
                Event::SlurmJob(j) => { jobs.insert(j.job_id, j.clone()); }
                Event::SlurmJobGone { job_id, .. } => { jobs.remove(job_id); }
                Event::ActionOutcome(o)
                    if in_flight.get(&o.target).is_some_and(|(id, _)| *id == o.action_id.0) =>
                {
                    in_flight.remove(&o.target);
                }
                _ => {}
            }
            out.clear();
            engine.apply(rec, &mut out);
            let timeout_ms = engine.policy().actions.timeout_s * 1000;
            for a in &out.actions {
                if let Action::KubeDeletePod { pod, .. } = &a.action {
                    let running = jobs.values().any(|j| j.state.holds_nodes() && j.nodes.iter().any(|n| n == pod));
                    prop_assert!(!running, "deleted pod {} whose slurm node runs a job", pod);
                    let node = latest.get(pod);
                    prop_assert!(
                        node.is_some_and(|n| n.flags.contains(&SlurmNodeFlag::Drain)
                            && !matches!(n.state, SlurmBaseState::Allocated | SlurmBaseState::Mixed)),
                        "deleted pod {} whose slurm node is not drained: {:?}", pod, node
                    );
                }
                if let Action::KubeScale { replicas: to, .. } = &a.action {
                    prop_assert!((MIN_REPLICAS..=MAX_REPLICAS).contains(to), "scaled to {}", to);
                    // A StatefulSet removes its highest ordinals when replicas
                    // drop: each must be a pod lockstep knows whose Slurm node is
                    // DRAINED and holds no job, or a pod being deleted already
                    // whose Slurm node holds none and takes none (DOWN or not
                    // answering). Lowering is a removal lockstep causes.
                    let from = replicas.unwrap_or(0);
                    if by_ordinal {
                        for o in *to..from {
                            let name = format!("gpu-{o}");
                            let running = jobs.values().any(|j| j.state.holds_nodes() && j.nodes.iter().any(|n| *n == name));
                            let node = latest.get(&name);
                            let drained = node.is_some_and(|n| n.flags.contains(&SlurmNodeFlag::Drain)
                                && !n.flags.contains(&SlurmNodeFlag::Completing)
                                && !matches!(n.state, SlurmBaseState::Allocated | SlurmBaseState::Mixed));
                            prop_assert!(pods.contains_key(&name), "lowered {} -> {} past {}, a pod not known", from, to, name);
                            let leaving = pods.get(&name).is_some_and(|p| p.deleting)
                                && node.is_some_and(|n| (n.state == SlurmBaseState::Down
                                    || n.flags.iter().any(|f| matches!(f, SlurmNodeFlag::NotResponding | SlurmNodeFlag::Fail)))
                                    && !n.flags.contains(&SlurmNodeFlag::Completing));
                            prop_assert!(!running && (drained || leaving), "lowered {} -> {} past {}: job {} node {:?}", from, to, name, running, node);
                        }
                    }
                }
                if let Action::SlurmResume { node } = &a.action {
                    let owned = latest.get(node).and_then(|n| n.reason.as_deref()).is_some_and(|r| r.starts_with(PREFIX));
                    prop_assert!(owned, "resumed {} whose drain is not lockstep's: {:?}", node, latest.get(node));
                }
                let target = a.action.target();
                if let Some((id, at)) = in_flight.get(&target) {
                    prop_assert!(rec.time_ms >= at + timeout_ms, "{} issued while {} is in flight on {}", a.id, id, target);
                }
                in_flight.insert(target, (a.id.0.clone(), rec.time_ms));
            }
            let pending = engine.pending();
            let mut targets: Vec<_> = pending.iter().map(|(t, _)| t).collect();
            targets.dedup();
            prop_assert_eq!(targets.len(), pending.len());
        }
    }
}

#[test]
fn records_out_of_order_are_a_bug_the_engine_refuses() {
    let recs = build_log(&[Op::Advance { s: 1 }]);
    let mut engine = Engine::new(Policy::default());
    let mut out = Output::default();
    engine.apply(&recs[1], &mut out);
    let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        engine.apply(&recs[0], &mut out)
    }));
    assert!(again.is_err());
}

#[test]
fn a_log_record_file_of_the_generated_log_is_readable() {
    // The generator's logs are ordinary logs: they encode and decode.
    let recs = build_log(&[
        Op::Advance { s: 5 },
        Op::Kube {
            node: 0,
            cordoned: true,
            ready: 0,
            xid: false,
            taint: false,
        },
    ]);
    let mut w = lockstep_schemas::log::LogWriter::new(
        Vec::new(),
        lockstep_schemas::log::Format::MessagePack,
        "t",
    )
    .unwrap();
    for r in &recs {
        w.write(&Record::Event(r.clone())).unwrap();
    }
    let bytes = w.finish().unwrap();
    let (back, err) =
        lockstep_schemas::log::read_all(lockstep_schemas::log::LogReader::msgpack(bytes));
    assert!(err.is_none());
    assert_eq!(back.len(), recs.len() + 1);
}

#[test]
fn the_operations_reach_scale_in() {
    // Three idle nodes in pods of the set, replicas 3, min 1: after the idle
    // time the top two are drained, and once Slurm shows the drains, the
    // replicas are lowered past them (by ordinal), or their pods deleted
    // (`delete_pod`).
    for delete_pod in [false, true] {
        let kinds = scale_in_run(delete_pod);
        let count = |k| kinds.iter().filter(|x| **x == k).count();
        use lockstep_schemas::ActionKind::{KubeDeletePod, KubeScale};
        if delete_pod {
            assert_eq!(count(KubeDeletePod), 2, "{kinds:?}");
        } else {
            assert_eq!(
                (count(KubeDeletePod), count(KubeScale)),
                (0, 1),
                "{kinds:?}"
            );
        }
    }
}

/// The log of `ops` with every drain of lockstep's showing the reason of a
/// scale-in drain, as Slurm shows the drain lockstep set (lockstep waits to
/// see its own drain before it trusts a node to be out).
fn with_scale_in_reasons(ops: &[Op]) -> Vec<EventRecord> {
    let mut recs = build_log(ops);
    for rec in &mut recs {
        if let Event::SlurmNode(n) = &mut rec.envelope.event {
            if n.reason.as_deref() == Some(&format!("{PREFIX} test")) {
                n.reason = Some(format!("{PREFIX} scale-in"));
            }
        }
    }
    recs
}

/// The scale policy (`delete_pod` removal or not) and a StatefulSet of 3
/// replicas whose 3 pods' Slurm nodes are idle.
fn three_idle_pods(delete_pod: bool) -> Vec<Op> {
    let mut ops = vec![
        Op::Policy {
            host: false,
            delete_pod,
        },
        Op::Scale {
            replicas: 3,
            revision: false,
        },
    ];
    for node in 0..3 {
        ops.push(Op::Slurm {
            node,
            state: 0,
            drain: None,
            not_responding: false,
        });
        ops.push(Op::Pod {
            node,
            on: node,
            deleting: false,
            evicted: false,
            cond: 0,
        });
    }
    ops
}

fn scale_in_run(delete_pod: bool) -> Vec<lockstep_schemas::ActionKind> {
    let mut ops = three_idle_pods(delete_pod);
    ops.push(Op::Advance { s: 35 });
    ops.push(Op::Advance { s: 2 });
    for node in 1..3 {
        ops.push(Op::Slurm {
            node,
            state: 0,
            drain: Some(true),
            not_responding: false,
        });
    }
    ops.push(Op::Advance { s: 2 });
    let run = run_once(&with_scale_in_reasons(&ops));
    run.actions.iter().map(|a| a.action.kind()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Policy durations are seconds multiplied into ms on log time: absurd
    /// values must mean "never", not overflow (debug builds panic on it).
    #[test]
    fn absurd_policy_durations_saturate(
        ops in prop::collection::vec(op(), 1..100),
    ) {
        let mut recs = build_log(&ops);
        for rec in &mut recs {
            if let Event::PolicyChanged(p) = &mut rec.envelope.event {
                p.health.not_ready_grace_s = u64::MAX;
                p.health.resume_after_s = u64::MAX;
                p.health.flap_window_s = u64::MAX;
                p.health.flap_hold_s = u64::MAX;
                p.actions.timeout_s = u64::MAX;
                p.actions.retry_backoff_initial_s = u64::MAX;
                p.actions.retry_backoff_max_s = u64::MAX;
                p.scaling.evaluate_every_s = u64::MAX;
                for t in &mut p.scaling.targets {
                    t.scale_up_cooldown_s = u64::MAX;
                    t.scale_down_cooldown_s = u64::MAX;
                    t.idle_before_scale_down_s = u64::MAX;
                }
            }
        }
        let run = run_once(&recs);
        prop_assert_eq!(run, run_once(&recs));
    }
}

#[test]
fn an_unhealthy_condition_already_shown_is_kept_through_the_grace_period() {
    // Slurm reports gpu-0 NOT_RESPONDING and its pod already shows
    // SlurmNodeHealthy=False (set before a restart or an upgrade): lockstep
    // keeps it, instead of flipping it to True until its grace runs out.
    let recs = build_log(&[
        Op::Slurm {
            node: 0,
            state: 0,
            drain: None,
            not_responding: true,
        },
        Op::Pod {
            node: 0,
            on: 0,
            deleting: false,
            evicted: false,
            cond: 2,
        },
        Op::Kube {
            node: 0,
            cordoned: false,
            ready: 0,
            xid: false,
            taint: true,
        },
        Op::Advance { s: 10 },
    ]);
    let run = run_once(&recs);
    let flipped = run.actions.iter().any(|a| {
        matches!(&a.action, Action::KubeSetPodCondition { condition, .. }
            if condition.type_ == "SlurmNodeHealthy" && condition.status == ConditionStatus::True)
    });
    let untainted = run
        .actions
        .iter()
        .any(|a| matches!(a.action, Action::KubeUntaintNode { .. }));
    assert!(!flipped && !untainted, "{:?}", run.actions);
}

/// Found by `never_resumes_a_drain_it_does_not_own_and_never_two_in_flight`:
/// a scale-in victim dropped (a policy change) while the deletion of its pod
/// was in flight, then picked again, deleted the pod a second time before
/// the first deletion's outcome or timeout. The slot is now parked and
/// adopted by the new victim.
#[test]
fn a_victim_dropped_while_its_pod_deletion_is_in_flight_does_not_race_it() {
    use Op::*;
    let slurm = |state, drain| Slurm {
        node: 0,
        state,
        drain,
        not_responding: false,
    };
    let ops = vec![
        slurm(0, None),
        Pod {
            node: 0,
            on: 1,
            deleting: false,
            evicted: false,
            cond: 1,
        },
        SlurmGone { node: 0 },
        slurm(0, None),
        Scale {
            replicas: 2,
            revision: false,
        },
        slurm(3, None),
        Policy {
            host: false,
            delete_pod: true,
        },
        Advance { s: 30 },
        SlurmGone { node: 1 },
        Kube {
            node: 1,
            cordoned: false,
            ready: 0,
            xid: false,
            taint: false,
        },
        slurm(3, Some(false)),
        SlurmVisible(true),
        Advance { s: 1 },
        slurm(0, None),
        slurm(0, None),
        slurm(0, None),
        Advance { s: 1 },
        Policy {
            host: false,
            delete_pod: false,
        },
        slurm(0, Some(false)),
        SlurmGone { node: 1 },
        Advance { s: 1 },
        Advance { s: 1 },
    ];
    let run = run_once(&build_log(&ops));
    let deletions: Vec<&str> = run
        .actions
        .iter()
        .filter(|a| matches!(a.action, Action::KubeDeletePod { .. }))
        .map(|a| a.id.0.as_str())
        .collect();
    assert_eq!(deletions.len(), 1, "{deletions:?}");
}

/// A scale-in waiting for its top ordinal to be idle long enough, while
/// the nodes below it keep changing: between scans scaling looks at the
/// top pod alone, and must decide exactly as a scan of every pod would (a
/// restored engine scans at its first look), then pick the top ordinal once
/// it has been idle long enough.
#[test]
fn a_scale_in_waiting_on_its_top_ordinal_decides_as_a_full_scan_would() {
    let mut ops = three_idle_pods(false);
    // The bottom node flaps (relevant to scaling, below the top) for 24 s,
    // within the 30 s idle time; a job comes and goes on it.
    for i in 0..12 {
        ops.push(Op::Slurm {
            node: 0,
            state: 0,
            drain: None,
            not_responding: i % 2 == 0,
        });
        // The job starts at the fifth flap and ends at the seventh.
        if let Some(state) = match i {
            4 => Some(2),
            6 => Some(3),
            _ => None,
        } {
            ops.push(Op::Job {
                id: 1,
                state,
                nodes: 1,
                count: 1,
            });
        }
        ops.push(Op::Advance { s: 2 });
    }
    ops.push(Op::Advance { s: 10 });
    ops.push(Op::Advance { s: 2 });
    let actions = live_beside_restored(&build_log(&ops)).unwrap();
    let drained: Vec<&str> = actions
        .iter()
        .filter_map(|a| match &a.action {
            Action::SlurmDrain { node, .. } => Some(node.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        drained.contains(&SLURM[2]),
        "the top ordinal is drained once idle long enough: {actions:?}"
    );
}
