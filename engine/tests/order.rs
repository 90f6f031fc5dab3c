//! Level-triggered means order-free: whatever order the observations of one
//! node arrive in, once they have all arrived the reducer wants the same
//! thing. Every permutation of the events that make a Slurm node want a
//! feature (and its Kubernetes node cordoned) must end with the action
//! issued, once the node has been observed under the policy (the relist a
//! policy change brings).

use std::collections::BTreeMap;

mod common;

use lockstep_engine::{Engine, Output};
use lockstep_schemas::{
    Action, Envelope, Event, EventRecord, LabelFeature, Policy, SlurmBaseState, SlurmNode, Source,
};

fn events() -> Vec<Event> {
    let mut policy = Policy::default();
    policy.topology.features = vec![LabelFeature {
        label: "lockstep.io/gpu".into(),
        prefix: "gpu-".into(),
    }];
    let mut events = vec![Event::PolicyChanged(Box::new(policy))];
    events.extend(common::both_visible());
    events.extend([
        Event::SlurmNode(SlurmNode {
            name: "n3".into(),
            state: SlurmBaseState::Idle,
            flags: vec![],
            reason: None,
            reason_user: None,
            features: vec![],
            topology: None,
            partitions: vec!["batch".into()],
            version: 0,
        }),
        Event::KubeNode(common::kube_node(
            "k6",
            true,
            BTreeMap::from([("lockstep.io/gpu".into(), "h100".into())]),
        )),
        Event::KubePod(common::running_pod("n3", "u3", "k6")),
    ]);
    events
}

fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for p in permutations(n - 1) {
        for i in 0..=p.len() {
            let mut q = p.clone();
            q.insert(i, n - 1);
            out.push(q);
        }
    }
    out
}

#[test]
fn every_arrival_order_ends_with_the_feature_and_the_drain_wanted() {
    let events = events();
    let mut failures = Vec::new();
    for order in permutations(events.len()) {
        let mut engine = Engine::new(Policy::default());
        let mut out = Output::default();
        let mut actions = Vec::new();
        for (i, &e) in order.iter().enumerate() {
            let rec = EventRecord {
                seq: i as u64 + 1,
                time_ms: 1_000 + i as u64,
                envelope: Envelope::new(Source::Test, 1_000, events[e].clone()),
            };
            out.clear();
            engine.apply(&rec, &mut out);
            actions.extend(out.actions.iter().map(|a| a.action.clone()));
        }
        // The Kubernetes observer restarts with the policy and lists the
        // node again: a label the policy started to read after the node was
        // observed is acted on only from this observation on.
        let relist = EventRecord {
            seq: order.len() as u64 + 1,
            time_ms: 2_000,
            envelope: Envelope::new(Source::Test, 2_000, events[4].clone()),
        };
        out.clear();
        engine.apply(&relist, &mut out);
        actions.extend(out.actions.iter().map(|a| a.action.clone()));
        let features = actions.iter().any(
            |a| matches!(a, Action::SlurmSetFeatures { features, .. } if features == &["gpu-h100"]),
        );
        let drain = actions
            .iter()
            .any(|a| matches!(a, Action::SlurmDrain { node, .. } if node == "n3"));
        if !features || !drain {
            failures.push((order, features, drain));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 720 orders miss an action, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}
