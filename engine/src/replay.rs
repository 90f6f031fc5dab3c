//! Folding a recorded log through the reducer: the timeline, `--verify`
//! (recomputed actions against recorded ones), and the audit of one node.
//!
//! Pure like the rest of the crate: records come in as values, the caller
//! reads files and prints.

use std::collections::HashMap;

use lockstep_schemas::log::SnapshotPart;
use lockstep_schemas::{Action, Event, EventId, EventRecord, IssuedAction, Record, Target};

use crate::{Engine, Output, SnapshotError, Transition, LAYOUT};

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
        let mut a = self.recorded.iter();
        let mut b = self.recomputed.iter();
        loop {
            match (a.next(), b.next()) {
                (None, None) => return,
                (Some(x), Some(y)) if x == y => self.matched += 1,
                (x, y) => {
                    let seq = match (x, y) {
                        (Some(x), Some(y)) => x.seq.min(y.seq),
                        (Some(v), None) | (None, Some(v)) => v.seq,
                        (None, None) => unreachable!("handled above"),
                    };
                    self.divergence = Some(Divergence {
                        seq,
                        recorded: x.cloned(),
                        recomputed: y.cloned(),
                    });
                    return;
                }
            }
        }
    }
}

/// How the actions of a what-if run (`lockstep replay --policy`) differ
/// from the recorded ones.
///
/// The what-if run folds the recorded observations: the world it sees is the
/// one the recorded actions shaped, and it does not react to actions that
/// were never carried out. So the comparison
///
/// - matches actions by what they do (kind, target and content: the
///   [`Action`] value), not by id, sequence or time: the same drain issued
///   a few records later is the same decision;
/// - compares first attempts only: a retry repeats an action already
///   counted, and the what-if run's retries come from the log holding no
///   outcomes for actions it alone issued;
/// - leaves out what-if actions that react to the effect of a recorded
///   action the what-if run would not have issued (resuming a drain it never
///   set, scaling back a scale-up it never made): where the recorded run
///   left a target otherwise than the what-if run would have, an action that
///   changes it again says nothing about the policy. They are kept apart in
///   [`WhatIf::reactions`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WhatIf {
    /// Recorded actions (first attempts) the what-if run would not have issued.
    pub not_issued: Vec<IssuedAction>,
    /// Actions (first attempts) the what-if run would have issued that were
    /// not recorded.
    pub issued: Vec<IssuedAction>,
    /// What-if actions left out: reactions to the effect of a recorded action
    /// the what-if run did not issue.
    pub reactions: Vec<IssuedAction>,
    /// Recorded first attempts.
    pub recorded: u64,
    /// What-if first attempts.
    pub what_if: u64,
    /// Recorded retries (attempt > 1), not compared.
    pub recorded_retries: u64,
    /// What-if retries (attempt > 1), not compared.
    pub what_if_retries: u64,
}

/// What an action leaves its target as. Resumes, untaints and label
/// removals return a target to how lockstep found it: equal to never
/// having acted on it.
fn effect(action: &Action) -> Option<&Action> {
    match action {
        Action::SlurmResume { .. }
        | Action::KubeUntaintNode { .. }
        | Action::KubeLabelPod { value: None, .. } => None,
        other => Some(other),
    }
}

impl WhatIf {
    /// Compares the recorded actions with those of a what-if run.
    pub fn compare(recorded: &[IssuedAction], what_if: &[IssuedAction]) -> Self {
        let first = |v: &[IssuedAction]| -> Vec<IssuedAction> {
            let mut v: Vec<IssuedAction> = v.iter().filter(|a| a.attempt <= 1).cloned().collect();
            // Stable: actions of one record keep their order.
            v.sort_by_key(|a| a.seq);
            v
        };
        let (rec, wi) = (first(recorded), first(what_if));
        let mut diff = Self {
            recorded: rec.len() as u64,
            what_if: wi.len() as u64,
            recorded_retries: (recorded.len() - rec.len()) as u64,
            what_if_retries: (what_if.len() - wi.len()) as u64,
            ..Self::default()
        };

        // Walk both runs in log order, keeping what each left every target
        // as. At one sequence the what-if actions come first: actions caused
        // by the same record are simultaneous, and a reaction needs the
        // world to show an effect, which takes a later record.
        let mut rec_effect: HashMap<Target, Option<&Action>> = HashMap::new();
        let mut wi_effect: HashMap<Target, Option<&Action>> = HashMap::new();
        let mut compared: Vec<&IssuedAction> = Vec::new();
        let (mut r, mut w) = (0, 0);
        while r < rec.len() || w < wi.len() {
            let take_what_if = w < wi.len() && (r == rec.len() || wi[w].seq <= rec[r].seq);
            if take_what_if {
                let a = &wi[w];
                w += 1;
                let target = a.action.target();
                let theirs = rec_effect.get(&target).copied().flatten();
                let ours = wi_effect.get(&target).copied().flatten();
                let mine = effect(&a.action);
                // The recorded run left the target otherwise than this run
                // would have, and this action changes what it left.
                if theirs.is_some() && theirs != ours && mine != theirs {
                    diff.reactions.push(a.clone());
                } else {
                    wi_effect.insert(target, mine);
                    compared.push(a);
                }
            } else {
                let a = &rec[r];
                r += 1;
                rec_effect.insert(a.action.target(), effect(&a.action));
            }
        }

        // Match by content, in log order. (Grouped by target: `Action` has
        // no hash, and a target sees few actions.)
        let mut unmatched: HashMap<Target, Vec<Option<&IssuedAction>>> = HashMap::new();
        for a in &rec {
            unmatched
                .entry(a.action.target())
                .or_default()
                .push(Some(a));
        }
        for a in compared {
            let slot = unmatched.get_mut(&a.action.target()).and_then(|list| {
                list.iter_mut()
                    .find(|r| r.is_some_and(|r| r.action == a.action))
            });
            match slot {
                Some(slot) => *slot = None,
                None => diff.issued.push(a.clone()),
            }
        }
        diff.not_issued = unmatched
            .into_values()
            .flatten()
            .flatten()
            .cloned()
            .collect();
        diff.not_issued
            .sort_by(|a, b| (a.seq, &a.id).cmp(&(b.seq, &b.id)));
        diff
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
    /// The header, a recorded action or a snapshot part that is not the
    /// last: nothing was applied.
    Skipped,
    /// An event was applied and produced this output.
    Applied(&'a EventRecord, &'a Output),
    /// The last part of a snapshot: the state is now the one it carries,
    /// at this sequence.
    Restored(u64),
}

/// Why a replay cannot go on from a snapshot record.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A snapshot after events were applied, or its parts out of order.
    #[error("snapshot part {part} of seq {seq} is out of place: a log holds one snapshot, in order, before its first event")]
    Misplaced {
        /// The snapshot's sequence.
        seq: u64,
        /// The part.
        part: u32,
    },
    /// The parts' bytes do not hash to the state hash they name.
    #[error("the snapshot of seq {seq} hashes to {found}, not to the state hash {named} it names: it was altered or damaged")]
    Hash {
        /// The snapshot's sequence.
        seq: u64,
        /// The hash the parts name.
        named: String,
        /// The hash of their bytes.
        found: String,
    },
    /// Another state layout, or bytes that do not decode.
    #[error("the snapshot of seq {seq} does not restore in this lockstep (state layout {LAYOUT}): {source}; replay the file with the lockstep that wrote it, or export the window again from the whole log")]
    Restore {
        /// The snapshot's sequence.
        seq: u64,
        /// Why.
        source: SnapshotError,
    },
    /// A what-if replay (`--policy`) needs the log from its start: a
    /// snapshot's state was reached under the recorded policy.
    #[error("the log starts from a snapshot of seq {seq}, reached under the recorded policy: a replay with another policy needs the log from its first record")]
    Pinned {
        /// The snapshot's sequence.
        seq: u64,
    },
}

/// Folds log records through an [`Engine`].
#[derive(Debug)]
pub struct Replay {
    engine: Engine,
    /// A `--policy` replay: no snapshot may replace its engine.
    pinned: bool,
    /// The snapshot parts read so far, and their bytes.
    parts: Vec<u8>,
    next_part: u32,
    out: Output,
    verifier: Verifier,
    verify: bool,
    totals: Totals,
}

impl Replay {
    /// Replays into `engine`.
    pub fn new(engine: Engine) -> Self {
        Self {
            pinned: engine.is_pinned(),
            engine,
            parts: Vec::new(),
            next_part: 0,
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
    /// [`Replay::divergence`]; a snapshot, once its last part is in, becomes
    /// the state the events that follow are applied to.
    ///
    /// # Errors
    /// A snapshot that cannot become the state: out of place, altered, of
    /// another layout, or in a `--policy` replay.
    pub fn feed<'a>(&'a mut self, rec: &'a Record) -> Result<Step<'a>, ReplayError> {
        Ok(match rec {
            Record::Header(_) => Step::Skipped,
            Record::Snapshot(part) => self.restore(part)?,
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
        })
    }

    fn restore(&mut self, part: &SnapshotPart) -> Result<Step<'static>, ReplayError> {
        let (seq, at) = (part.seq, part.part);
        if self.pinned {
            return Err(ReplayError::Pinned { seq });
        }
        if self.totals.events > 0 || self.engine.last_seq() > 0 || at != self.next_part {
            return Err(ReplayError::Misplaced { seq, part: at });
        }
        self.parts.extend_from_slice(&part.bytes);
        self.next_part += 1;
        if self.next_part < part.parts {
            return Ok(Step::Skipped);
        }
        let bytes = std::mem::take(&mut self.parts);
        let found = crate::engine::hex_sha256(&bytes);
        if found != part.state_hash {
            return Err(ReplayError::Hash {
                seq,
                named: part.state_hash.clone(),
                found,
            });
        }
        let engine =
            Engine::restore(&bytes).map_err(|source| ReplayError::Restore { seq, source })?;
        if engine.last_seq() != seq {
            return Err(ReplayError::Misplaced { seq, part: at });
        }
        self.engine = engine;
        Ok(Step::Restored(seq))
    }

    /// The first place where the recomputed actions differ from the recorded
    /// ones, once the whole log has been fed.
    pub fn divergence(&mut self) -> Option<Divergence> {
        self.verifier.finish();
        self.verifier.divergence.clone()
    }

    /// How a what-if run's actions differ from the recorded ones, once the
    /// whole log has been fed (see [`WhatIf`]). Needs [`Replay::verifying`].
    pub fn what_if(&self) -> WhatIf {
        WhatIf::compare(&self.verifier.recorded, &self.verifier.recomputed)
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

/// The engine's state as snapshot records, for the start of a file that
/// replays alone from there (see [`Record::Snapshot`]).
pub fn snapshot_parts(engine: &Engine) -> Vec<SnapshotPart> {
    let bytes = engine.snapshot();
    let hash = crate::engine::hex_sha256(&bytes);
    SnapshotPart::split(&bytes, engine.last_seq(), engine.now_ms(), &hash, LAYOUT)
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
            Event::SlurmJob(j) => j.nodes.iter().any(|n| *n == self.node),
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
            | Target::PodEviction { namespace, pod }
            | Target::Pod { namespace, pod } => {
                engine.pod_key_of(&self.node).as_deref()
                    == Some(format!("{namespace}/{pod}").as_str())
            }
            Target::NodeTaint { node, .. }
            | Target::NodeCondition { node, .. }
            | Target::NodeLabel { node, .. } => {
                engine.placement(&self.node).as_deref() == Some(node.as_str())
            }
            Target::SlurmReservation { name } => engine.placement(&self.node).is_some_and(|k| {
                name.strip_prefix(engine.policy().maintenance.reservation_prefix.as_str())
                    == Some(k.as_str())
            }),
            Target::Scale { .. } => false,
        }
    }

    /// The chain, in log order.
    pub fn entries(&self) -> &[AuditEntry] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use lockstep_schemas::{ActionId, ScaleTargetRef};

    use super::*;

    fn issued(seq: u64, attempt: u32, action: Action) -> IssuedAction {
        IssuedAction {
            id: ActionId::derive(seq, action.kind(), &action.target()),
            seq,
            time_ms: seq * 1000,
            cause: EventId(format!("e{seq}")),
            rule: "test".into(),
            attempt,
            action,
        }
    }

    fn drain(node: &str, reason: &str) -> Action {
        Action::SlurmDrain {
            node: node.into(),
            reason: reason.into(),
        }
    }

    fn resume(node: &str) -> Action {
        Action::SlurmResume { node: node.into() }
    }

    fn scale(replicas: u32) -> Action {
        Action::KubeScale {
            target: ScaleTargetRef {
                group: "apps".into(),
                kind: "StatefulSet".into(),
                namespace: "slurm".into(),
                name: "gpu".into(),
            },
            replicas,
        }
    }

    /// (seq, action) pairs, first attempts.
    fn run(actions: &[(u64, Action)]) -> Vec<IssuedAction> {
        actions
            .iter()
            .map(|(seq, a)| issued(*seq, 1, a.clone()))
            .collect()
    }

    fn seqs(v: &[IssuedAction]) -> Vec<(u64, &'static str)> {
        v.iter().map(|a| (a.seq, a.action.kind().name())).collect()
    }

    #[test]
    fn what_if_compares_actions_by_what_they_do() {
        let d = || drain("n1", "lockstep: cordoned");
        // (story, recorded, what-if, not issued, issued, reactions)
        type Case = (
            &'static str,
            Vec<IssuedAction>,
            Vec<IssuedAction>,
            Vec<(u64, &'static str)>,
            Vec<(u64, &'static str)>,
            Vec<(u64, &'static str)>,
        );
        let cases: Vec<Case> = vec![
            (
                "the same drain a few records later is the same decision",
                run(&[(11, d()), (20, resume("n1"))]),
                run(&[(14, d()), (25, resume("n1"))]),
                vec![],
                vec![],
                vec![],
            ),
            (
                "no cordon drains: the resume of the recorded drain is a reaction",
                run(&[(11, d()), (20, resume("n1"))]),
                run(&[(13, resume("n1"))]),
                vec![(11, "slurm_drain"), (20, "slurm_resume")],
                vec![],
                vec![(13, "slurm_resume")],
            ),
            (
                "another reason is another drain",
                run(&[(11, d())]),
                run(&[(11, drain("n1", "lockstep: other"))]),
                vec![(11, "slurm_drain")],
                vec![(11, "slurm_drain")],
                vec![],
            ),
            (
                "once the recorded drain was lifted, a drain of its own counts",
                run(&[(10, d()), (20, resume("n1"))]),
                run(&[(100, drain("n1", "lockstep: not ready"))]),
                vec![(10, "slurm_drain"), (20, "slurm_resume")],
                vec![(100, "slurm_drain")],
                vec![],
            ),
            (
                "what it undoes of its own doing counts",
                vec![],
                run(&[(10, d()), (30, resume("n1"))]),
                vec![],
                vec![(10, "slurm_drain"), (30, "slurm_resume")],
                vec![],
            ),
            (
                "scaling back a scale-up it never made is a reaction",
                run(&[(50, scale(3))]),
                run(&[(50, scale(2)), (60, scale(2))]),
                vec![(50, "kube_scale")],
                vec![(50, "kube_scale")],
                vec![(60, "kube_scale")],
            ),
            (
                "a repeated action needs as many matches",
                run(&[(10, d()), (20, resume("n1")), (30, d())]),
                run(&[(10, d()), (20, resume("n1"))]),
                vec![(30, "slurm_drain")],
                vec![],
                vec![],
            ),
        ];
        for (story, recorded, what_if, not_issued, issued, reactions) in cases {
            let diff = WhatIf::compare(&recorded, &what_if);
            assert_eq!(seqs(&diff.not_issued), not_issued, "{story}: not issued");
            assert_eq!(seqs(&diff.issued), issued, "{story}: issued");
            assert_eq!(seqs(&diff.reactions), reactions, "{story}: reactions");
        }
    }

    #[test]
    fn retries_are_counted_not_compared() {
        let d = drain("n1", "lockstep: cordoned");
        let recorded = vec![issued(11, 1, d.clone()), issued(12, 2, d.clone())];
        let what_if: Vec<_> = (1..=8)
            .map(|a| issued(10 + u64::from(a), a, d.clone()))
            .collect();
        let diff = WhatIf::compare(&recorded, &what_if);
        assert_eq!(
            diff,
            WhatIf {
                recorded: 1,
                what_if: 1,
                recorded_retries: 1,
                what_if_retries: 7,
                ..WhatIf::default()
            }
        );
    }
}
