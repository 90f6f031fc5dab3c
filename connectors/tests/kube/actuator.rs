//! lockstep's Kubernetes actuator against the real API server: each action
//! once, with its preconditions, and failures that say whether to retry.

use std::time::{Duration, Instant};

use lockstep_connectors::kube::{Actuator, ActuatorConfig, ObserveSpec, ScaleKind};
use lockstep_schemas::{
    Action, ConditionStatus, OutcomeResult, PodCondition, Policy, ScaleTargetRef, Taint,
    TaintEffect,
};
use lockstep_testkit::issued;
use lockstep_testkit::kube::{
    condition, node_obj, pod_obj, shared, stateful_set_obj, unique, NS, TEST_LABEL,
};
use serde_json::{json, Value};

use crate::support::{actuator, assert_failed, KubeConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_pod_condition_patches_status_once() {
    let cp = shared();
    let act = actuator(cp).await;
    let pod = unique("pod");
    cp.create(&pod_obj(&pod, "act", None));
    cp.patch_status(
        &["pod", &pod, "-n", NS],
        &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
    );
    let set = |status, reason: &str, message: &str| {
        issued(
            1,
            Action::KubeSetPodCondition {
                namespace: NS.to_owned(),
                pod: pod.clone(),
                condition: PodCondition {
                    type_: "SlurmNodeDrained".to_owned(),
                    status,
                    reason: reason.to_owned(),
                    message: message.to_owned(),
                },
            },
        )
    };
    let a = set(ConditionStatus::True, "SlurmDrain", "drained by admin");
    let o = act.execute(&a).await;
    assert_eq!(o.result, OutcomeResult::Succeeded);
    assert_eq!(
        (o.action_id.clone(), o.kind, o.target.clone()),
        (a.id.clone(), a.action.kind(), a.action.target())
    );
    let obj = cp.get(&["pod", &pod, "-n", NS, "--show-managed-fields"]);
    let c = condition(&obj, "SlurmNodeDrained")
        .expect("condition set")
        .clone();
    assert_eq!(
        (
            c["status"].as_str(),
            c["reason"].as_str(),
            c["message"].as_str()
        ),
        (Some("True"), Some("SlurmDrain"), Some("drained by admin"))
    );
    let t1 = c["lastTransitionTime"]
        .as_str()
        .expect("lastTransitionTime")
        .to_owned();
    assert!(condition(&obj, "Ready").is_some(), "other conditions kept");
    assert!(
        obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["manager"] == "lockstep"),
        "field manager lockstep: {}",
        obj["metadata"]["managedFields"]
    );

    assert_eq!(act.execute(&a).await.result, OutcomeResult::AlreadyDone);

    // Same status, new message: updated, transition time kept.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let o = act
        .execute(&set(ConditionStatus::True, "SlurmDrain", "still drained"))
        .await;
    assert_eq!(o.result, OutcomeResult::Succeeded);
    let c = condition(&cp.get(&["pod", &pod, "-n", NS]), "SlurmNodeDrained")
        .unwrap()
        .clone();
    assert_eq!(
        (c["message"].as_str(), c["lastTransitionTime"].as_str()),
        (Some("still drained"), Some(t1.as_str()))
    );

    // New status: new transition time.
    let o = act
        .execute(&set(ConditionStatus::False, "SlurmNotDrained", ""))
        .await;
    assert_eq!(o.result, OutcomeResult::Succeeded);
    let c = condition(&cp.get(&["pod", &pod, "-n", NS]), "SlurmNodeDrained")
        .unwrap()
        .clone();
    assert_eq!(c["status"].as_str(), Some("False"));
    assert!(
        c["lastTransitionTime"].as_str().unwrap() > t1.as_str(),
        "{c}"
    );
    assert_eq!(
        act.execute(&set(ConditionStatus::False, "SlurmNotDrained", ""))
            .await
            .result,
        OutcomeResult::AlreadyDone
    );

    // A condition lockstep wrote is observed even under a policy that no
    // longer names it (so that it can be retired); somebody else's is not.
    cp.kubectl(&[
        "patch",
        "pod",
        &pod,
        "-n",
        NS,
        "--subresource=status",
        "--type=strategic",
        "-p",
        r#"{"status": {"conditions": [{"type": "SiteCheck", "status": "True"}]}}"#,
    ]);
    let obj: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(cp.get(&["pod", &pod, "-n", NS, "--show-managed-fields"])).unwrap();
    let mut renamed = Policy::default();
    renamed.drain.foreign_drain_condition = "SlurmDrainedByOthers".to_owned();
    let observed =
        lockstep_connectors::kube::reduce::pod(&obj, &ObserveSpec::from_policy(&renamed, &[]))
            .unwrap();
    let types: Vec<&str> = observed
        .conditions
        .iter()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(types, ["SlurmNodeDrained"], "{observed:?}");

    cp.kubectl(&[
        "delete",
        "pod",
        &pod,
        "-n",
        NS,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    let o = act.execute(&a).await;
    assert_failed(&o, false, "not found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taint_and_untaint_keep_other_taints() {
    let cp = shared();
    let act = actuator(cp).await;
    let node = unique("tnode");
    cp.create(&node_obj(&node, "act", "z1"));
    cp.kubectl(&["taint", "node", &node, "example.com/foreign=x:NoSchedule"]);
    let taints = || -> Vec<(String, String, String)> {
        let obj = cp.get(&["node", &node]);
        let mut v: Vec<_> = obj["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|t| {
                (
                    t["key"].as_str().unwrap().to_owned(),
                    t["value"].as_str().unwrap_or("").to_owned(),
                    t["effect"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let before = taints();
    assert!(
        before.iter().any(|t| t.0 == "example.com/foreign"),
        "{before:?}"
    );
    let taint = |value: &str| {
        issued(
            1,
            Action::KubeTaintNode {
                node: node.clone(),
                taint: Taint {
                    key: "lockstep.io/slurm-unhealthy".to_owned(),
                    value: value.to_owned(),
                    effect: TaintEffect::NoSchedule,
                },
            },
        )
    };
    assert_eq!(
        act.execute(&taint("")).await.result,
        OutcomeResult::Succeeded
    );
    let mut want = before.clone();
    want.push((
        "lockstep.io/slurm-unhealthy".to_owned(),
        String::new(),
        "NoSchedule".to_owned(),
    ));
    want.sort();
    assert_eq!(taints(), want);
    assert_eq!(
        act.execute(&taint("")).await.result,
        OutcomeResult::AlreadyDone
    );

    // A new value replaces the taint of that key.
    assert_eq!(
        act.execute(&taint("down")).await.result,
        OutcomeResult::Succeeded
    );
    let got = taints();
    assert_eq!(
        got.iter()
            .filter(|t| t.0 == "lockstep.io/slurm-unhealthy")
            .count(),
        1,
        "{got:?}"
    );
    assert!(got.contains(&(
        "lockstep.io/slurm-unhealthy".to_owned(),
        "down".to_owned(),
        "NoSchedule".to_owned()
    )));

    let untaint = issued(
        1,
        Action::KubeUntaintNode {
            node: node.clone(),
            key: "lockstep.io/slurm-unhealthy".to_owned(),
        },
    );
    assert_eq!(act.execute(&untaint).await.result, OutcomeResult::Succeeded);
    assert_eq!(taints(), before, "only lockstep's taint removed");
    assert_eq!(
        act.execute(&untaint).await.result,
        OutcomeResult::AlreadyDone
    );

    cp.kubectl(&["delete", "node", &node]);
    assert_failed(&act.execute(&taint("")).await, false, "not found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_pod_sets_and_removes() {
    let cp = shared();
    let act = actuator(cp).await;
    let pod = unique("lpod");
    cp.create(&pod_obj(&pod, "act", None));
    let label = |value: Option<&str>| {
        issued(
            1,
            Action::KubeLabelPod {
                namespace: NS.to_owned(),
                pod: pod.clone(),
                key: "lockstep.io/slurm-busy".to_owned(),
                value: value.map(str::to_owned),
            },
        )
    };
    let busy =
        || cp.get(&["pod", &pod, "-n", NS])["metadata"]["labels"]["lockstep.io/slurm-busy"].clone();
    assert_eq!(
        act.execute(&label(Some("true"))).await.result,
        OutcomeResult::Succeeded
    );
    assert_eq!(busy(), json!("true"));
    assert_eq!(
        act.execute(&label(Some("true"))).await.result,
        OutcomeResult::AlreadyDone
    );
    assert_eq!(
        act.execute(&label(None)).await.result,
        OutcomeResult::Succeeded
    );
    assert_eq!(busy(), Value::Null);
    assert_eq!(
        cp.get(&["pod", &pod, "-n", NS])["metadata"]["labels"][TEST_LABEL],
        json!("act"),
        "other labels kept"
    );
    assert_eq!(
        act.execute(&label(None)).await.result,
        OutcomeResult::AlreadyDone
    );
    // An invalid label value is a 422: not retryable.
    assert_failed(
        &act.execute(&label(Some("not a valid value!"))).await,
        false,
        "422",
    );
    cp.kubectl(&[
        "delete",
        "pod",
        &pod,
        "-n",
        NS,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_pod_only_with_its_uid() {
    let cp = shared();
    let act = actuator(cp).await;
    let node = unique("dnode");
    let (bound, unbound) = (unique("dpod"), unique("dpod"));
    cp.create(&node_obj(&node, "act", "z1"));
    cp.create(&pod_obj(&bound, "act", Some(&node)));
    cp.create(&pod_obj(&unbound, "act", None));
    let uid = |p: &str| {
        cp.get(&["pod", p, "-n", NS])["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let delete = |pod: &str, uid: String| {
        issued(
            1,
            Action::KubeDeletePod {
                namespace: NS.to_owned(),
                pod: pod.to_owned(),
                uid,
            },
        )
    };

    let wrong = delete(&bound, "00000000-0000-0000-0000-00000000beef".to_owned());
    assert_failed(&act.execute(&wrong).await, false, "uid precondition");
    assert!(
        cp.exists(&["pod", &bound, "-n", NS]),
        "refused delete left the pod"
    );
    assert!(cp.get(&["pod", &bound, "-n", NS])["metadata"]["deletionTimestamp"].is_null());

    // Bound pod: graceful delete, and without a kubelet it stays, deleting.
    let right = delete(&bound, uid(&bound));
    assert_eq!(act.execute(&right).await.result, OutcomeResult::Succeeded);
    assert!(cp.get(&["pod", &bound, "-n", NS])["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(act.execute(&right).await.result, OutcomeResult::AlreadyDone);

    // Unbound pod: deleted at once.
    let right = delete(&unbound, uid(&unbound));
    assert_eq!(act.execute(&right).await.result, OutcomeResult::Succeeded);
    assert!(!cp.exists(&["pod", &unbound, "-n", NS]));
    assert_eq!(act.execute(&right).await.result, OutcomeResult::AlreadyDone);

    cp.kubectl(&[
        "delete",
        "pod",
        &bound,
        "-n",
        NS,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    cp.kubectl(&["delete", "node", &node]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_patches_the_scale_subresource() {
    let cp = shared();
    let act = actuator(cp).await;
    let name = unique("scale");
    cp.create(&stateful_set_obj(&name, "act", 2));
    let target = ScaleTargetRef {
        group: "apps".to_owned(),
        kind: "StatefulSet".to_owned(),
        namespace: NS.to_owned(),
        name: name.clone(),
    };
    let scale = |replicas| {
        issued(
            1,
            Action::KubeScale {
                target: target.clone(),
                replicas,
            },
        )
    };
    assert_eq!(
        act.execute(&scale(5)).await.result,
        OutcomeResult::Succeeded
    );
    assert_eq!(
        cp.get(&["statefulset", &name, "-n", NS])["spec"]["replicas"],
        json!(5)
    );
    assert_eq!(
        act.execute(&scale(5)).await.result,
        OutcomeResult::AlreadyDone
    );
    assert_eq!(
        act.execute(&scale(0)).await.result,
        OutcomeResult::Succeeded
    );
    assert_eq!(
        cp.get(&["statefulset", &name, "-n", NS])["spec"]["replicas"],
        json!(0)
    );

    // Kinds it cannot scale, each a clear failure that waiting does not fix
    // (a served NodeSet is scaled in `nodeset.rs`).
    let scale_kind = |group: &str, kind: &str| {
        issued(
            1,
            Action::KubeScale {
                target: ScaleTargetRef {
                    group: group.to_owned(),
                    kind: kind.to_owned(),
                    ..target.clone()
                },
                replicas: 1,
            },
        )
    };
    let widget = ("lockstep-test.invalid", "Widget");
    let act_for_policy = Actuator::new(
        cp.kube_config().await,
        vec![
            ScaleKind::discovered(widget.0, widget.1),
            ScaleKind::discovered("", "ConfigMap"),
        ],
        ActuatorConfig::default(),
    )
    .expect("actuator");
    // (what, the actuator, the kind, the error), one a line.
    let cases = [
        (
            "not named by the policy",
            &act,
            widget,
            "unknown scale target kind",
        ),
        (
            "named, but its api group not served",
            &act_for_policy,
            widget,
            "is not served by the kubernetes api",
        ),
        (
            "named, served without a scale subresource",
            &act_for_policy,
            ("", "ConfigMap"),
            "has no scale subresource",
        ),
    ];
    for (what, actuator, (group, kind), error) in cases {
        let outcome = actuator.execute(&scale_kind(group, kind)).await;
        assert_failed(&outcome, false, error);
        assert!(
            matches!(&outcome.result, OutcomeResult::Failed { error, .. } if error.contains(kind)),
            "{what}: {outcome:?}"
        );
    }
    cp.kubectl(&["delete", "statefulset", &name, "-n", NS]);
    assert_failed(&act.execute(&scale(1)).await, false, "not found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_or_silent_api_fails_retryably_in_bounded_time() {
    let cp = shared();
    let action = issued(
        1,
        Action::KubeLabelPod {
            namespace: NS.to_owned(),
            pod: "p".to_owned(),
            key: "k".to_owned(),
            value: None,
        },
    );
    let config = ActuatorConfig {
        connect_timeout_ms: 500,
        request_timeout_ms: 500,
        action_timeout_ms: 1_500,
        ..ActuatorConfig::default()
    };

    // Nothing listens: connection refused.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut c = cp.kube_config().await;
    c.cluster_url = format!("https://{closed}").parse().unwrap();
    let act = Actuator::new(c, vec![], config.clone()).unwrap();
    assert_failed(&act.execute(&action).await, true, "cannot reach");

    // Something listens and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let mut c = cp.kube_config().await;
    c.cluster_url = format!("https://{addr}").parse().unwrap();
    let act = Actuator::new(c, vec![], config).unwrap();
    let t0 = Instant::now();
    let o = act.execute(&action).await;
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    assert!(
        matches!(
            o.result,
            OutcomeResult::Failed {
                retryable: true,
                ..
            }
        ),
        "{o:?}"
    );
    hold.abort();

    // A Slurm action is not for this actuator.
    let act = actuator(cp).await;
    let o = act
        .execute(&issued(
            1,
            Action::SlurmResume {
                node: "n".to_owned(),
            },
        ))
        .await;
    assert_failed(&o, false, "not a kubernetes action");
}
