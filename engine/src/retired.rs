//! What lockstep set under an earlier policy and the current one no longer
//! names: reason prefixes, taint keys, pod condition types, the busy label,
//! feature prefixes, and the node condition and annotation of node signals. After a policy change lockstep removes what it set
//! under an old name, and keeps owning the drains it made under an old
//! prefix; without this memory a renamed condition or label, a taint turned
//! off, or a changed prefix left lockstep's marks behind for good, and its
//! own drains became "foreign", never resumed.
//!
//! | row | after a policy change                                   | effect                                              |
//! |-----|---------------------------------------------------------|-----------------------------------------------------|
//! | 1   | a name of the old policy is not in the new one           | remembered as retired (at most [`RETIRED_NAMES_MAX`] per kind, the oldest forgotten first) |
//! | 2   | a name of the new policy was retired                     | no longer retired: it is the policy's again         |
//! | 3   | a label the new policy reads was not read before         | not acted on for a Kubernetes node until that node has been observed again ([`newly_read_labels`]) |
//!
//! This module only keeps the names; the rules that use them live in
//! `drain` (ownership), `topology` (features) and the engine's Kubernetes
//! side (taints, pod conditions, labels). It never decides an action.

use lockstep_schemas::{Policy, ANNOTATION_PREFIX};
use serde::{Deserialize, Serialize};

/// Retired names kept per kind. Each policy change retires at most a few;
/// past this many the oldest are forgotten (and what lockstep set under
/// them, if still there, is left).
pub(crate) const RETIRED_NAMES_MAX: usize = 16;

/// Names of earlier policies that the current one does not use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Retired {
    /// Drain reason prefixes: drains with them are still lockstep's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
    /// Taint keys lockstep set on Kubernetes nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
    /// Pod condition types lockstep set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<String>,
    /// Pod labels lockstep set (the busy label).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// Slurm feature prefixes lockstep managed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feature_prefixes: Vec<String>,
    /// Kubernetes node condition types lockstep set (the foreign drain
    /// condition of `node_signals`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_conditions: Vec<String>,
    /// Kubernetes node labels and (`annotation:`) annotations lockstep set
    /// (the annotation naming a node's Slurm nodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_labels: Vec<String>,
}

/// The names a policy makes lockstep set, by kind (the fields of [`Retired`]).
fn names(p: &Policy) -> [Vec<String>; 7] {
    let non_empty = |s: &str| (!s.trim().is_empty()).then(|| s.to_owned());
    let signals = &p.node_signals;
    [
        non_empty(&p.drain.reason_prefix).into_iter().collect(),
        [
            p.health.unhealthy_taint.as_ref(),
            p.drain.foreign_drain_taint.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|t| t.key.clone())
        .collect(),
        [
            p.drain.foreign_drain_condition.as_str(),
            p.health.slurm_health_condition.as_str(),
        ]
        .into_iter()
        .filter_map(non_empty)
        .collect(),
        non_empty(&p.scaling.busy_label).into_iter().collect(),
        p.topology
            .features
            .iter()
            .filter_map(|f| non_empty(&f.prefix))
            .collect(),
        non_empty(&signals.foreign_drain_condition)
            .into_iter()
            .collect(),
        non_empty(&signals.slurm_nodes_annotation)
            .map(|a| format!("{ANNOTATION_PREFIX}{a}"))
            .into_iter()
            .collect(),
    ]
}

impl Retired {
    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
            && self.taints.is_empty()
            && self.conditions.is_empty()
            && self.labels.is_empty()
            && self.feature_prefixes.is_empty()
            && self.node_conditions.is_empty()
            && self.node_labels.is_empty()
    }

    /// Rows 1 and 2, for a change from `old` to `new`.
    pub fn policy_changed(&mut self, old: &Policy, new: &Policy) {
        let [op, ot, oc, ol, of, onc, onl] = names(old);
        let [np, nt, nc, nl, nf, nnc, nnl] = names(new);
        for (list, old, new) in [
            (&mut self.prefixes, op, np),
            (&mut self.taints, ot, nt),
            (&mut self.conditions, oc, nc),
            (&mut self.labels, ol, nl),
            (&mut self.feature_prefixes, of, nf),
            (&mut self.node_conditions, onc, nnc),
            (&mut self.node_labels, onl, nnl),
        ] {
            list.retain(|n| !new.contains(n));
            for n in old {
                if !new.contains(&n) && !list.contains(&n) {
                    list.push(n);
                }
            }
            if list.len() > RETIRED_NAMES_MAX {
                list.drain(..list.len() - RETIRED_NAMES_MAX);
            }
        }
    }
}

/// Row 3: the Kubernetes node labels `new` reads (feature labels, the
/// topology unit label) that `old` did not. The connector reports a label
/// only once a policy names it, so until a node is observed again its
/// labels say nothing about these: absent is "not seen", not "not set".
pub(crate) fn newly_read_labels(old: &Policy, new: &Policy) -> Vec<String> {
    let read = |p: &Policy| -> Vec<String> {
        p.topology
            .features
            .iter()
            .map(|f| f.label.clone())
            .chain(p.topology.unit_label.iter().cloned())
            .collect()
    };
    let before = read(old);
    let mut added: Vec<String> = read(new)
        .into_iter()
        .filter(|l| !before.contains(l))
        .collect();
    added.sort();
    added.dedup();
    added
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_schemas::LabelFeature;

    #[test]
    fn retired_names_table() {
        let base = Policy::default();
        // (change to the policy) -> (prefixes, taints, conditions, labels)
        type Change = fn(&mut Policy);
        type Row = (
            Change,
            &'static [&'static str],
            &'static [&'static str],
            &'static [&'static str],
            &'static [&'static str],
        );
        let rows: &[Row] = &[
            (|_| {}, &[], &[], &[], &[]),
            (
                |p| p.health.unhealthy_taint = None,
                &[],
                &["lockstep.io/slurm-unhealthy"],
                &[],
                &[],
            ),
            (
                |p| p.drain.reason_prefix = "ls:".into(),
                &["lockstep:"],
                &[],
                &[],
                &[],
            ),
            (
                |p| p.health.slurm_health_condition = "SlurmHealthy".into(),
                &[],
                &[],
                &["SlurmNodeHealthy"],
                &[],
            ),
            (
                |p| p.drain.foreign_drain_condition = String::new(),
                &[],
                &[],
                &["SlurmNodeDrained"],
                &[],
            ),
        ];
        // Node signals: the node condition and the annotation lockstep set.
        let mut on = base.clone();
        on.node_signals.foreign_drain_condition = "SlurmNodeDrained".into();
        on.node_signals.slurm_nodes_annotation = "lockstep.dev/slurm-nodes".into();
        let mut renamed = on.clone();
        renamed.node_signals.foreign_drain_condition = "SlurmDrainedByOthers".into();
        renamed.node_signals.slurm_nodes_annotation = String::new();
        let mut r = Retired::default();
        r.policy_changed(&on, &renamed);
        assert_eq!(r.node_conditions, ["SlurmNodeDrained"]);
        assert_eq!(r.node_labels, ["annotation:lockstep.dev/slurm-nodes"]);
        r.policy_changed(&renamed, &on);
        assert_eq!(r.node_conditions, ["SlurmDrainedByOthers"]);
        assert!(r.node_labels.is_empty());
        for (i, (change, prefixes, taints, conditions, labels)) in rows.iter().enumerate() {
            let mut new = base.clone();
            change(&mut new);
            let mut r = Retired::default();
            r.policy_changed(&base, &new);
            assert_eq!(r.prefixes, *prefixes, "row {i}");
            assert_eq!(r.taints, *taints, "row {i}");
            assert_eq!(r.conditions, *conditions, "row {i}");
            assert_eq!(r.labels, *labels, "row {i}");
            // And back: the names are the policy's again (and the new ones
            // retired in turn).
            r.policy_changed(&new, &base);
            let [p, t, c, l, _, _, _] = names(&base);
            assert!(
                p.iter().all(|n| !r.prefixes.contains(n))
                    && t.iter().all(|n| !r.taints.contains(n))
                    && c.iter().all(|n| !r.conditions.contains(n))
                    && l.iter().all(|n| !r.labels.contains(n)),
                "row {i}: {r:?}"
            );
        }
    }

    #[test]
    fn busy_label_and_feature_prefixes_are_remembered_and_bounded() {
        let mut old = Policy::default();
        old.scaling.busy_label = "lockstep.io/busy".into();
        old.topology.features = vec![LabelFeature {
            label: "zone".into(),
            prefix: "zone-".into(),
        }];
        let mut r = Retired::default();
        r.policy_changed(&old, &Policy::default());
        assert_eq!(r.labels, ["lockstep.io/busy"]);
        assert_eq!(r.feature_prefixes, ["zone-"]);
        let mut p = Policy::default();
        for i in 0..(RETIRED_NAMES_MAX + 4) {
            let mut q = p.clone();
            q.drain.reason_prefix = format!("p{i}:");
            r.policy_changed(&p, &q);
            p = q;
        }
        assert_eq!(r.prefixes.len(), RETIRED_NAMES_MAX);
        assert_eq!(r.prefixes.last().map(String::as_str), Some("p18:"));
    }

    #[test]
    fn labels_read_for_the_first_time() {
        let old = Policy::default();
        let mut new = Policy::default();
        new.topology.features = vec![LabelFeature {
            label: "nvidia.com/gpu.product".into(),
            prefix: "gpu-".into(),
        }];
        new.topology.unit_label = Some("nvidia.com/gpu.clique".into());
        assert_eq!(
            newly_read_labels(&old, &new),
            ["nvidia.com/gpu.clique", "nvidia.com/gpu.product"]
        );
        assert!(newly_read_labels(&new, &new).is_empty());
        assert!(newly_read_labels(&new, &old).is_empty());
    }
}
