//! Folding a recorded log through the reducer: the timeline, `--verify`
//! (recomputed actions against recorded ones), and the audit of one node.
//!
//! Pure like the rest of the crate: records come in as values, the caller
//! reads files and prints.

use lockstep_schemas::{Event, EventId, EventRecord, IssuedAction, Record, Target};

use crate::{Engine, Output, Transition};

/// Where recomputed and recorded actions first differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// The first sequence at which they differ.
    pub seq: u64,
    /// The recorded action there, if any.
    pub recorded: Option<IssuedAction>,
    /// The recomputed action there, if any.
    pub recomputed: Option<IssuedAction>,
}

/// Compares the recorded and recomputed actions. Within one record the
/// order of its actions carries no meaning (a service that restarted may
/// publish them in another order), so both sides are compared in
/// (sequence, id) order.
#[derive(Debug, Default)]
struct Verifier {
    recorded: Vec<IssuedAction>,
    recomputed: Vec<IssuedAction>,
    divergence: Option<Divergence>,
    matched: u64,
    finished: bool,
}

impl Verifier {
    fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        let key = |a: &IssuedAction| (a.seq, a.id.clone());
        self.recorded.sort_by_key(key);
        self.recomputed.sort_by_key(key);
        let mut a = std::mem::take(&mut self.recorded).into_iter();
        let mut b = std::mem::take(&mut self.recomputed).into_iter();
        loop {
            match (a.next(), b.next()) {
                (None, None) => return,
                (Some(x), Some(y)) if x == y => self.matched += 1,
                (x, y) => {
                    let seq = match (&x, &y) {
                        (Some(x), Some(y)) => x.seq.min(y.seq),
                        (Some(v), None) | (None, Some(v)) => v.seq,
                        (None, None) => unreachable!("handled above"),
                    };
                    self.divergence = Some(Divergence {
                        seq,
                        recorded: x,
                        recomputed: y,
                    });
                    return;
                }
            }
        }
    }
}

/// Totals of a replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Event records applied.
    pub events: u64,
    /// Action records read from the log.
    pub recorded_actions: u64,
    /// Actions the reducer issued.
    pub actions: u64,
    /// Transitions.
    pub transitions: u64,
}

/// What one record produced.
#[derive(Debug)]
pub enum Step<'a> {
    /// The header or a recorded action: nothing was applied.
    Skipped,
    /// An event was applied and produced this output.
    Applied(&'a EventRecord, &'a Output),
}

/// Folds log records through an [`Engine`].
#[derive(Debug)]
pub struct Replay {
    engine: Engine,
    out: Output,
    verifier: Verifier,
    verify: bool,
    totals: Totals,
}

impl Replay {
    /// Replays into `engine`.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            out: Output::default(),
            verifier: Verifier::default(),
            verify: false,
            totals: Totals::default(),
        }
    }

    /// Keeps recorded and recomputed actions for [`Replay::divergence`].
    pub fn verifying(mut self) -> Self {
        self.verify = true;
        self
    }

    /// Applies one record. Events are applied; recorded actions are kept for
    /// [`Replay::divergence`].
    pub fn feed<'a>(&'a mut self, rec: &'a Record) -> Step<'a> {
        match rec {
            Record::Header(_) => Step::Skipped,
            Record::Action(a) => {
                self.totals.recorded_actions += 1;
                if self.verify {
                    self.verifier.recorded.push(a.clone());
                }
                Step::Skipped
            }
            Record::Event(ev) => {
                self.out.clear();
                self.engine.apply(ev, &mut self.out);
                self.totals.events += 1;
                self.totals.actions += self.out.actions.len() as u64;
                self.totals.transitions += self.out.transitions.len() as u64;
                if self.verify {
                    self.verifier
                        .recomputed
                        .extend(self.out.actions.iter().cloned());
                }
                Step::Applied(ev, &self.out)
            }
        }
    }

    /// The first place where the recomputed actions differ from the recorded
    /// ones, once the whole log has been fed.
    pub fn divergence(&mut self) -> Option<Divergence> {
        self.verifier.finish();
        self.verifier.divergence.clone()
    }

    /// Recorded actions that matched (after [`Replay::divergence`]).
    pub fn matched(&self) -> u64 {
        self.verifier.matched
    }

    /// Totals so far.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// What the last applied event produced.
    pub fn output(&self) -> &Output {
        &self.out
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// One link of a node's causal chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditEntry {
    /// An event about the node, its pod or its Kubernetes node.
    Event {
        /// Sequence.
        seq: u64,
        /// Log time (ms).
        time_ms: u64,
        /// Event id.
        id: EventId,
        /// Summary.
        summary: String,
    },
    /// A transition of the node.
    Transition(Transition),
    /// An action on the node, its pod or its Kubernetes node.
    Action(IssuedAction),
}

/// Collects the causal chain of one Slurm node during a replay:
/// event -> transition -> action -> outcome.
#[derive(Debug)]
pub struct Audit {
    node: String,
    entries: Vec<AuditEntry>,
    /// Ids of actions on the node, so their outcomes are kept.
    action_ids: std::collections::HashSet<String>,
}

impl Audit {
    /// Audits one Slurm node.
    pub fn new(node: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            entries: Vec::new(),
            action_ids: Default::default(),
        }
    }

    /// Looks at one applied record. Call with the engine as it is after the
    /// record was applied.
    pub fn observe(&mut self, rec: &EventRecord, out: &Output, engine: &Engine) {
        let related = self.related(&rec.envelope.event, engine);
        let caused = out.transitions.iter().any(|t| t.node == self.node)
            || out
                .actions
                .iter()
                .any(|a| self.targets_node(&a.action.target(), engine));
        if related || caused {
            self.entries.push(AuditEntry::Event {
                seq: rec.seq,
                time_ms: rec.time_ms,
                id: rec.envelope.id.clone(),
                summary: rec.envelope.event.summary(),
            });
        }
        for t in out.transitions.iter().filter(|t| t.node == self.node) {
            self.entries.push(AuditEntry::Transition(t.clone()));
        }
        for a in &out.actions {
            if self.targets_node(&a.action.target(), engine) {
                self.action_ids.insert(a.id.0.clone());
                self.entries.push(AuditEntry::Action(a.clone()));
            }
        }
    }

    fn related(&self, event: &Event, engine: &Engine) -> bool {
        let kube = engine.placement(&self.node);
        let pod = engine.pod_key_of(&self.node);
        match event {
            Event::SlurmNode(n) => n.name == self.node,
            Event::SlurmNodeGone { name, .. } => *name == self.node,
            Event::SlurmJob(j) => j.nodes.contains(&self.node),
            Event::KubeNode(n) => kube.as_deref() == Some(n.name.as_str()),
            Event::KubeNodeGone { name, .. } => kube.as_deref() == Some(name.as_str()),
            Event::KubePod(p) => {
                pod.as_deref() == Some(format!("{}/{}", p.namespace, p.name).as_str())
            }
            Event::KubePodGone {
                namespace, name, ..
            } => pod.as_deref() == Some(format!("{namespace}/{name}").as_str()),
            Event::ActionOutcome(o) => self.action_ids.contains(&o.action_id.0),
            Event::PolicyChanged(_) | Event::ConnectorStatus { .. } => true,
            _ => false,
        }
    }

    fn targets_node(&self, target: &Target, engine: &Engine) -> bool {
        match target {
            Target::SlurmNodeState { node }
            | Target::SlurmNodeFeatures { node }
            | Target::SlurmNodeTopology { node } => *node == self.node,
            Target::PodCondition { namespace, pod, .. }
            | Target::PodLabel { namespace, pod, .. }
            | Target::Pod { namespace, pod } => {
                engine.pod_key_of(&self.node).as_deref()
                    == Some(format!("{namespace}/{pod}").as_str())
            }
            Target::NodeTaint { node, .. } => {
                engine.placement(&self.node).as_deref() == Some(node.as_str())
            }
            Target::Scale { .. } => false,
        }
    }

    /// The chain, in log order.
    pub fn entries(&self) -> &[AuditEntry] {
        &self.entries
    }
}
