//! Object versions and pod readiness on the wire: logs written before the
//! fields existed decode to "unknown version" and "ready as Running meant",
//! and encode back to the same bytes (so they replay to the same state).

use lockstep_schemas::{Event, KubePod, PodPhase};

/// One event of each kind that carries an object, as lockstep wrote them
/// before observations had versions and pods had `ready`.
const OLD: &[&str] = &[
    r#"{"slurm_node":{"name":"n1","state":"IDLE","flags":["DRAIN"],"reason":"lockstep: x","reason_user":"slurm"}}"#,
    r#"{"slurm_node_gone":{"name":"n1"}}"#,
    r#"{"slurm_job":{"job_id":7,"state":"RUNNING","partition":"batch","nodes":["n1"],"node_count":1}}"#,
    r#"{"slurm_job_gone":{"job_id":7}}"#,
    r#"{"slurm_partition":{"name":"batch","nodes":["n1"]}}"#,
    r#"{"slurm_partition_gone":{"name":"batch"}}"#,
    r#"{"kube_node":{"name":"k1","unschedulable":true,"ready":"True"}}"#,
    r#"{"kube_node_gone":{"name":"k1"}}"#,
    r#"{"kube_pod":{"namespace":"slurm","name":"p","uid":"u","node_name":"k1","phase":"Running","deleting":false,"disruption_target":false}}"#,
    r#"{"kube_pod":{"namespace":"slurm","name":"p","uid":"u","phase":"Pending","deleting":false,"disruption_target":false}}"#,
    r#"{"kube_pod_gone":{"namespace":"slurm","name":"p"}}"#,
    r#"{"kube_scale_target":{"target":{"group":"apps","kind":"StatefulSet","namespace":"slurm","name":"gpu"},"replicas":3,"ready_replicas":3}}"#,
    r#"{"kube_scale_target_gone":{"target":{"group":"apps","kind":"StatefulSet","namespace":"slurm","name":"gpu"}}}"#,
];

#[test]
fn old_events_decode_unversioned_and_encode_to_the_same_bytes() {
    for old in OLD {
        let e: Event = serde_json::from_str(old).unwrap();
        assert_eq!(e.version(), 0, "{old}");
        assert_eq!(serde_json::to_string(&e).unwrap(), *old);
        let packed = rmp_serde::to_vec_named(&e).unwrap();
        let back: Event = rmp_serde::from_slice(&packed).unwrap();
        assert_eq!(back, e, "{old}");
    }
}

#[test]
fn old_pods_read_ready_as_running_meant() {
    // (old event, Running and Ready): what the earlier "Running" rule said.
    for (old, serves) in [(OLD[8], true), (OLD[9], false)] {
        let Event::KubePod(p) = serde_json::from_str(old).unwrap() else {
            panic!("{old}")
        };
        assert_eq!(p.running_and_ready(), serves, "{old}");
    }
}

#[test]
fn versions_and_readiness_round_trip() {
    let mut pod: KubePod = match serde_json::from_str(OLD[8]).unwrap() {
        Event::KubePod(p) => p,
        _ => unreachable!(),
    };
    pod.version = 41;
    pod.ready = false;
    let text = serde_json::to_string(&Event::KubePod(pod.clone())).unwrap();
    assert!(text.contains(r#""ready":false"#) && text.contains(r#""version":41"#));
    let back: Event = serde_json::from_str(&text).unwrap();
    assert_eq!(back, Event::KubePod(pod.clone()));
    assert!(!pod.running_and_ready());
    let gone: Event =
        serde_json::from_str(r#"{"kube_pod_gone":{"namespace":"slurm","name":"p","version":42}}"#)
            .unwrap();
    assert_eq!(gone.version(), 42);
}

#[test]
fn sameness_ignores_only_the_version() {
    let Event::KubePod(a) = serde_json::from_str(OLD[8]).unwrap() else {
        unreachable!()
    };
    // (change, still the same observation)
    type Change = fn(&mut KubePod);
    let cases: [(Change, bool); 4] = [
        (|p| p.version = 99, true),
        (|p| p.ready = false, false),
        (|p| p.phase = PodPhase::Pending, false),
        (|p| p.deleting = true, false),
    ];
    for (i, (change, same)) in cases.into_iter().enumerate() {
        let mut b = a.clone();
        change(&mut b);
        assert_eq!(a.same_but_version(&b), same, "case {i}");
    }
}
