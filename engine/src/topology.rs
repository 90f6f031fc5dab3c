//! Topology policy: Kubernetes node labels become Slurm features and a Slurm
//! topology unit for every Slurm node on that Kubernetes node, and follow the
//! pod when it moves to another node.
//!
//! | row | holds when                                         | action / report            | rule                |
//! |-----|----------------------------------------------------|----------------------------|---------------------|
//! | 1   | a feature label's value differs from the feature   | `SlurmSetFeatures`         | `topology.features` |
//! | 2   | the unit label's value differs from the topology   | `SlurmSetTopology`         | `topology.unit`     |
//! | 3   | the unit label is missing, empty or not a valid name | a report, no action      | `topology.invalid`  |
//!
//! An empty or invalid topology never goes to Slurm: it makes slurmd
//! register as INVALID_REG. Features lockstep does not manage (no configured
//! prefix) are kept as they are; features with the prefix of a label
//! feature an earlier policy had are removed (lockstep set them). A label
//! the policy has just started to read, and that the Kubernetes node has
//! not been observed with yet (`unseen`), is not acted on: its features and
//! the topology stay as they are (absent there means "not seen yet", not
//! "not set").

use lockstep_schemas::{
    valid_topology_token, Action, KubeNode, Rule, SlurmNode, Text, TopologyPolicy, Transition,
};

use crate::ctx::{Ctx, Output};
use crate::node::NodeCtl;

/// The feature list lockstep wants, or `None` when the node already has it
/// (or lockstep cannot see the Kubernetes node's labels).
pub(crate) fn features_want(
    slurm: &SlurmNode,
    kube: Option<&KubeNode>,
    policy: &TopologyPolicy,
    unseen: &[String],
    retired_prefixes: &[String],
) -> Option<Vec<Text>> {
    if policy.features.is_empty() && retired_prefixes.is_empty() {
        return None;
    }
    let kube = kube?;
    let waiting = |f: &str| {
        policy
            .features
            .iter()
            .any(|lf| unseen.contains(&lf.label) && f.starts_with(&lf.prefix))
    };
    let managed = |f: &str| {
        !waiting(f)
            && (policy.features.iter().any(|lf| f.starts_with(&lf.prefix))
                || retired_prefixes.iter().any(|p| f.starts_with(p.as_str())))
    };
    let mut want: Vec<Text> = slurm
        .features
        .iter()
        .filter(|f| !managed(f))
        .cloned()
        .collect();
    for lf in policy
        .features
        .iter()
        .filter(|lf| !unseen.contains(&lf.label))
    {
        if let Some(value) = kube.labels.get(&lf.label) {
            let feature = lockstep_schemas::format_text!("{}{value}", lf.prefix);
            if valid_topology_token(&feature) {
                want.push(feature);
            }
        }
    }
    want.sort();
    want.dedup();
    (want != slurm.features).then_some(want)
}

/// What the node's topology should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TopologyWant {
    /// Not managed, or the labels cannot be seen: leave it.
    Leave,
    /// Set it to this.
    Set(String),
    /// The label cannot become a topology; why.
    Invalid(String),
}

/// Rows 2 and 3.
pub(crate) fn topology_want(
    slurm: &SlurmNode,
    kube: Option<(&str, &KubeNode)>,
    policy: &TopologyPolicy,
    unseen: &[String],
) -> TopologyWant {
    let Some(label) = &policy.unit_label else {
        return TopologyWant::Leave;
    };
    if unseen.contains(label) {
        return TopologyWant::Leave;
    }
    let Some((kube_name, kube)) = kube else {
        return TopologyWant::Leave;
    };
    match kube.labels.get(label).map(String::as_str) {
        None | Some("") => TopologyWant::Invalid(format!(
            "kubernetes node {kube_name} has no value for topology label {label}"
        )),
        Some(unit) if !valid_topology_token(unit) => TopologyWant::Invalid(format!(
            "kubernetes node {kube_name} topology label {label}={unit:?} is not a valid topology unit"
        )),
        Some(unit) => {
            let topology = format!("{}:{unit}", policy.topology_name);
            if slurm.topology.as_deref() == Some(topology.as_str()) {
                TopologyWant::Leave
            } else {
                TopologyWant::Set(topology)
            }
        }
    }
}

/// What rows 1-3 want for one Slurm node: its features, its topology, and
/// why its unit label cannot be used (row 3), if it cannot.
pub(crate) fn wants(
    name: &str,
    slurm: &SlurmNode,
    kube: Option<(&str, &KubeNode)>,
    policy: &TopologyPolicy,
    unseen: &[String],
    retired_prefixes: &[String],
) -> (Option<Action>, Option<Action>, Option<String>) {
    let features = features_want(
        slurm,
        kube.map(|(_, k)| k),
        policy,
        unseen,
        retired_prefixes,
    )
    .map(|features| Action::SlurmSetFeatures {
        node: name.to_owned(),
        features: features.into_iter().map(String::from).collect(),
    });
    let (topology, invalid) = match topology_want(slurm, kube, policy, unseen) {
        TopologyWant::Leave => (None, None),
        TopologyWant::Set(topology) => (
            Some(Action::SlurmSetTopology {
                node: name.to_owned(),
                topology,
            }),
            None,
        ),
        TopologyWant::Invalid(why) => (None, Some(why)),
    };
    (features, topology, invalid)
}

/// A transition when the unit label becomes unusable or usable again
/// (`topology` row 3).
pub(crate) fn report_issue(
    ctl: &mut NodeCtl,
    name: &str,
    invalid: Option<String>,
    ctx: &Ctx<'_>,
    out: &mut Output,
) {
    if invalid != ctl.topology_issue {
        let (rule, detail) = match &invalid {
            Some(why) => (
                Rule::TopologyInvalid,
                format!("{why}; slurm's topology is left as it is"),
            ),
            None => (Rule::Topology, "topology label usable again".to_owned()),
        };
        out.transitions.push(Transition {
            seq: ctx.seq,
            time_ms: ctx.now_ms,
            node: name.to_owned(),
            from: ctl.status.phase,
            to: ctl.status.phase,
            rule,
            cause: ctx.event.clone(),
            detail,
        });
        ctl.topology_issue = invalid;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use lockstep_schemas::{ConditionStatus, LabelFeature, SlurmBaseState};

    use super::*;

    fn slurm(features: &[&str], topology: Option<&str>) -> SlurmNode {
        SlurmNode {
            name: "n1".into(),
            state: SlurmBaseState::Idle,
            flags: vec![],
            reason: None,
            reason_user: None,
            features: features.iter().map(|f| Text::from(*f)).collect(),
            topology: topology.map(Text::from),
            partitions: vec![],
            version: 0,
        }
    }

    fn kube(labels: &[(&str, &str)]) -> KubeNode {
        KubeNode {
            read_labels: None,
            maintenance: None,
            name: "k1".into(),
            unschedulable: false,
            ready: ConditionStatus::True,
            conditions: vec![],
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
            taints: vec![],
            identity: Default::default(),
            devices: Default::default(),
            version: 0,
        }
    }

    fn policy() -> TopologyPolicy {
        TopologyPolicy {
            features: vec![LabelFeature {
                label: "topology.kubernetes.io/zone".into(),
                prefix: "zone-".into(),
            }],
            unit_label: Some("nvidia.com/gpu.clique".into()),
            topology_name: "nvl".into(),
        }
    }

    #[test]
    fn features_table() {
        let p = policy();
        let zone_a = kube(&[("topology.kubernetes.io/zone", "a")]);
        // (features now, labels, wanted)
        type Row<'a> = (&'a [&'a str], &'a KubeNode, Option<&'a [&'a str]>);
        let rows: &[Row<'_>] = &[
            (&["gpu"], &zone_a, Some(&["gpu", "zone-a"])),
            (&["gpu", "zone-a"], &zone_a, None),
            (&["gpu", "zone-b"], &zone_a, Some(&["gpu", "zone-a"])),
            (&["gpu", "zone-b"], &kube(&[]), Some(&["gpu"])),
            (
                &["gpu"],
                &kube(&[("topology.kubernetes.io/zone", "a b")]),
                None,
            ),
        ];
        for (now, k, want) in rows {
            let got = features_want(&slurm(now, None), Some(k), &p, &[], &[]);
            let want = want.map(|w| w.iter().map(|f| Text::from(*f)).collect::<Vec<_>>());
            assert_eq!(got, want, "{now:?} {:?}", k.labels);
        }
        assert_eq!(
            features_want(&slurm(&["gpu"], None), None, &p, &[], &[]),
            None,
            "labels unseen: leave"
        );
        // A label the policy just started to read, not yet observed on the
        // node: its features stay (a job may be running on them).
        let unseen = ["topology.kubernetes.io/zone".to_owned()];
        assert_eq!(
            features_want(
                &slurm(&["gpu", "zone-b"], None),
                Some(&kube(&[])),
                &p,
                &unseen,
                &[]
            ),
            None
        );
        // Features of a label feature an earlier policy had: removed.
        let retired = ["rack-".to_owned()];
        assert_eq!(
            features_want(
                &slurm(&["gpu", "rack-7", "zone-a"], None),
                Some(&zone_a),
                &p,
                &[],
                &retired
            ),
            Some(vec![Text::from("gpu"), Text::from("zone-a")])
        );
    }

    #[test]
    fn topology_table() {
        let p = policy();
        let k = |v: &str| kube(&[("nvidia.com/gpu.clique", v)]);
        use TopologyWant::*;
        assert_eq!(
            topology_want(&slurm(&[], None), Some(("k1", &k("c7"))), &p, &[]),
            Set("nvl:c7".into())
        );
        assert_eq!(
            topology_want(&slurm(&[], Some("nvl:c7")), Some(("k1", &k("c7"))), &p, &[]),
            Leave
        );
        assert!(matches!(
            topology_want(&slurm(&[], None), Some(("k1", &k(""))), &p, &[]),
            Invalid(_)
        ));
        assert!(matches!(
            topology_want(&slurm(&[], None), Some(("k1", &k("a:b"))), &p, &[]),
            Invalid(_)
        ));
        assert!(matches!(
            topology_want(&slurm(&[], None), Some(("k1", &kube(&[]))), &p, &[]),
            Invalid(_)
        ));
        assert_eq!(topology_want(&slurm(&[], None), None, &p, &[]), Leave);
        // The unit label not observed yet since the policy started to read it.
        let unseen = ["nvidia.com/gpu.clique".to_owned()];
        assert_eq!(
            topology_want(
                &slurm(&[], Some("nvl:c1")),
                Some(("k1", &kube(&[]))),
                &p,
                &unseen
            ),
            Leave
        );
    }
}
