//! Counts of what the model holds, for metrics a site scales and alerts on:
//! Slurm nodes by state and partition, pending demand per partition, phases,
//! drains by owner and rule, nodes held by health damping, actions in
//! flight. Read-only: it never changes the engine, so it changes no state
//! hash, and it reads only what the log already brought (no extra load on
//! Slurm).
//!
//! A child of `engine` so that it can read the engine's private state; it
//! owns no state of its own and must never decide anything.

use std::collections::{BTreeMap, HashMap};

use lockstep_schemas::{SlurmBaseState, SlurmJobState, SlurmNode, SlurmNodeFlag};

use super::Engine;
use crate::slot::Slot;
use lockstep_schemas::{Phase, Rule};

/// Counts of the model at one moment; see [`Engine::stats`].
///
/// Label-like keys come from small fixed sets (states, phases, rules,
/// action kinds) except partition names, which are the site's own (few).
/// No key is ever a node name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Slurm nodes by (partition, state); a node in several partitions
    /// counts in each, as in `sinfo`; one in none under partition `""`.
    /// States: see [`slurm_state`].
    pub slurm_nodes: BTreeMap<(String, &'static str), u64>,
    /// Pending jobs by partition.
    pub pending_jobs: BTreeMap<String, u64>,
    /// Nodes wanted by pending jobs that more nodes can help, by partition:
    /// what scaling follows, and what an autoscaler would scale a NodeSet on.
    pub pending_nodes: BTreeMap<String, u64>,
    /// Slurm nodes by lockstep phase ([`Phase::name`]).
    pub phases: BTreeMap<&'static str, u64>,
    /// Drains in force by (owner, rule): owner `lockstep` (phases draining,
    /// drained, resuming; rule: what keeps it so) or `other` (a foreign
    /// drain, rule `drain.foreign`).
    pub drains: BTreeMap<(&'static str, &'static str), u64>,
    /// Nodes that health damping holds: the cluster-wide drain rate bound
    /// (`health.rate_limited`), flap hold, resume delay.
    pub health_held: BTreeMap<&'static str, u64>,
    /// Actions sent and not answered yet, by kind.
    pub in_flight: BTreeMap<&'static str, u64>,
    /// The longest a node has been in phase draining: lockstep wants it out
    /// and Slurm does not show it yet (ms of log time; 0: none draining).
    pub draining_oldest_ms: u64,
    /// Whether lockstep sees Slurm.
    pub slurm_visible: bool,
    /// Whether lockstep sees Kubernetes.
    pub kube_visible: bool,
    /// The log's clock: the largest append time applied (ms).
    pub now_ms: u64,
}

/// Every state [`slurm_state`] gives but `other`, in a fixed order.
#[cfg(test)]
const SLURM_STATES: [&str; 12] = [
    "idle",
    "mixed",
    "allocated",
    "completing",
    "draining",
    "drained",
    "down",
    "not_responding",
    "fail",
    "error",
    "future",
    "unknown",
];

/// A Slurm node's state as `sinfo` would sum it up, from a fixed set
/// ([`SLURM_STATES`], plus `other` for a base state this build does not
/// know): down, fail and error first, then not responding, then drain
/// (`draining` while jobs hold it, `drained` once none do), then the base
/// state.
pub fn slurm_state(n: &SlurmNode) -> &'static str {
    let busy = matches!(n.state, SlurmBaseState::Allocated | SlurmBaseState::Mixed)
        || n.has(&SlurmNodeFlag::Completing);
    match &n.state {
        SlurmBaseState::Down => return "down",
        SlurmBaseState::Error => return "error",
        _ => {}
    }
    if n.has(&SlurmNodeFlag::Fail) {
        return "fail";
    }
    if n.has(&SlurmNodeFlag::NotResponding) {
        return "not_responding";
    }
    if n.has(&SlurmNodeFlag::Drain) {
        return if busy { "draining" } else { "drained" };
    }
    if n.has(&SlurmNodeFlag::Completing) {
        return "completing";
    }
    match &n.state {
        SlurmBaseState::Idle => "idle",
        SlurmBaseState::Mixed => "mixed",
        SlurmBaseState::Allocated => "allocated",
        SlurmBaseState::Future => "future",
        SlurmBaseState::Unknown => "unknown",
        _ => "other",
    }
}

impl Stats {
    /// Adds the counts of another part of the model ([`Engine::stats_part`])
    /// taken after these; the moment-wide fields (visibility, clock) are the
    /// later part's.
    pub fn merge(&mut self, part: Stats) {
        fn add<K: Ord>(to: &mut BTreeMap<K, u64>, from: BTreeMap<K, u64>) {
            for (k, n) in from {
                *to.entry(k).or_default() += n;
            }
        }
        add(&mut self.slurm_nodes, part.slurm_nodes);
        add(&mut self.pending_jobs, part.pending_jobs);
        // One figure per partition, from the model's index, not a count.
        self.pending_nodes.extend(part.pending_nodes);
        add(&mut self.phases, part.phases);
        add(&mut self.drains, part.drains);
        add(&mut self.health_held, part.health_held);
        add(&mut self.in_flight, part.in_flight);
        self.draining_oldest_ms = self.draining_oldest_ms.max(part.draining_oldest_ms);
        self.slurm_visible = part.slurm_visible;
        self.kube_visible = part.kube_visible;
        self.now_ms = part.now_ms;
    }
}

/// How many parts to count a model in, at most: [`Engine::stats_parts`].
pub const STATS_PARTS_MAX: usize = 16;

impl Engine {
    /// Counts of the model for metrics (see [`Stats`]). One pass over the
    /// nodes, jobs and action slots: call it at a bounded rate (the service
    /// does once a second), not per record. [`Self::stats_part`] takes it a
    /// part at a time.
    pub fn stats(&self) -> Stats {
        self.stats_part(0, 1)
    }

    /// Into how many parts to count this model so that each part walks
    /// about 16,384 nodes, jobs and pods at most (a few milliseconds): 1 up
    /// to that size, then powers of two up to [`STATS_PARTS_MAX`].
    pub fn stats_parts(&self) -> usize {
        let [slurm, _, pods, jobs] = self.sizes();
        (((slurm + pods + jobs) >> 14) + 1)
            .next_power_of_two()
            .min(STATS_PARTS_MAX)
    }

    /// [`Self::stats`] of part `part` of `parts` (`parts` a power of two up
    /// to [`STATS_PARTS_MAX`]): the Slurm nodes, jobs, node states and action
    /// slots that fall in that part of their tables, and in part 0 what
    /// belongs to no one entry (each known partition's figures, scale
    /// targets' slots). [`Stats::merge`] of every part, each taken in turn,
    /// is the whole count; between two parts the model may change, so such a
    /// count spans the moments its parts were taken.
    pub fn stats_part(&self, part: usize, parts: usize) -> Stats {
        assert!(
            parts.is_power_of_two() && parts <= STATS_PARTS_MAX && part < parts,
            "part {part} of {parts}"
        );
        let mut s = Stats {
            slurm_visible: self.model.slurm_visible,
            kube_visible: self.model.kube_visible,
            now_ms: self.now_ms,
            ..Stats::default()
        };
        // Borrowed keys while counting: no allocation per node.
        let mut by_state: HashMap<(&str, &'static str), u64> = HashMap::new();
        for seen in self.model.slurm_nodes.values_of_part(part, parts) {
            let state = slurm_state(&seen.obs);
            if seen.obs.partitions.is_empty() {
                *by_state.entry(("", state)).or_default() += 1;
            }
            for p in &seen.obs.partitions {
                *by_state.entry((p.as_str(), state)).or_default() += 1;
            }
        }
        s.slurm_nodes = by_state
            .into_iter()
            .map(|((p, st), n)| ((p.to_owned(), st), n))
            .collect();

        let mut pending: HashMap<&str, u64> = HashMap::new();
        for job in self.model.jobs.values_of_part(part, parts) {
            if job.obs.state == SlurmJobState::Pending {
                *pending.entry(job.obs.partition.as_str()).or_default() += 1;
            }
        }
        let known = self
            .model
            .partitions
            .keys()
            .filter(|_| part == 0)
            .map(String::as_str);
        for p in known.clone().chain(pending.keys().copied()) {
            s.pending_nodes
                .insert(p.to_owned(), self.model.pending_nodes(p));
        }
        for p in known {
            s.pending_jobs.insert(p.to_owned(), 0);
        }
        for (p, n) in pending {
            *s.pending_jobs.entry(p.to_owned()).or_default() += n;
        }

        for ctl in self.ctl.values_of_part(part, parts) {
            let st = &ctl.status;
            *s.phases.entry(st.phase.name()).or_default() += 1;
            match st.phase {
                Phase::Draining | Phase::Drained | Phase::Resuming => {
                    *s.drains.entry(("lockstep", st.rule.name())).or_default() += 1;
                }
                Phase::ForeignDrain => {
                    *s.drains
                        .entry(("other", Rule::ForeignDrain.name()))
                        .or_default() += 1;
                }
                _ => {}
            }
            if matches!(
                st.rule,
                Rule::RateLimited | Rule::FlapHold | Rule::ResumeDelayed
            ) {
                *s.health_held.entry(st.rule.name()).or_default() += 1;
            }
            if st.phase == Phase::Draining {
                let since = ctl.causes.iter().map(|(_, o)| o.ms).min();
                if let Some(since) = since {
                    s.draining_oldest_ms =
                        s.draining_oldest_ms.max(self.now_ms.saturating_sub(since));
                }
            }
        }

        for f in self
            .flights
            .slots_of_part(part, parts)
            .filter_map(Slot::pending)
        {
            *s.in_flight.entry(f.action.kind().name()).or_default() += 1;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(state: &str, flags: &[SlurmNodeFlag]) -> SlurmNode {
        SlurmNode {
            name: "n1".into(),
            state: SlurmBaseState::parse(state),
            flags: flags.to_vec(),
            reason: None,
            reason_user: None,
            features: vec![],
            topology: None,
            partitions: vec![],
            version: 0,
        }
    }

    #[test]
    fn a_slurm_state_sums_up_base_state_and_flags_as_sinfo_would() {
        use SlurmNodeFlag::{Completing, Drain, Fail, NotResponding};
        // (base state, flags, state)
        let cases: &[(&str, &[SlurmNodeFlag], &str)] = &[
            ("IDLE", &[], "idle"),
            ("MIXED", &[], "mixed"),
            ("ALLOCATED", &[], "allocated"),
            ("IDLE", &[Completing], "completing"),
            ("ALLOCATED", &[Drain], "draining"),
            ("IDLE", &[Completing, Drain], "draining"),
            ("IDLE", &[Drain], "drained"),
            ("DOWN", &[Drain], "down"),
            ("IDLE", &[NotResponding], "not_responding"),
            ("IDLE", &[Drain, NotResponding], "not_responding"),
            ("MIXED", &[Fail], "fail"),
            ("ERROR", &[], "error"),
            ("FUTURE", &[], "future"),
            ("UNKNOWN", &[], "unknown"),
            ("SOMETHING_NEW", &[], "other"),
        ];
        for (state, flags, want) in cases {
            assert_eq!(slurm_state(&node(state, flags)), *want, "{state} {flags:?}");
            assert!(*want == "other" || SLURM_STATES.contains(want), "{want}");
        }
    }
}
