//! Slinky's NodeSet as a scale target, on the real API server with Slinky's
//! own CRD (read from `../shared/slinky`, installed once per process):
//! lockstep discovers the kind, watches it, maps the pods Slinky labels and
//! owns to it, and scales it through its scale subresource.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lockstep_connectors::kube::{
    discover, scale_kinds, Actuator, ActuatorConfig, ObserveSpec, ScaleKind,
};
use lockstep_schemas::{
    Action, Domain, Event, KubeScaleTarget, OutcomeResult, OwnerRef, Policy, ScaleRule,
    ScaleTargetRef,
};
use lockstep_testkit::issued;
use lockstep_testkit::kube::{shared, unique, ControlPlane, NS, TEST_LABEL};
use serde_json::{json, Value};

use crate::support::{assert_failed, KubeConfig, Watch};

/// Slinky's API group.
const SLINKY: &str = "slinky.slurm.net";
/// The label Slinky gives each NodeSet pod: its hostname, the Slurm node name.
const POD_HOSTNAME: &str = "nodeset.slinky.slurm.net/pod-hostname";
/// The label Slinky gives each NodeSet pod: its ordinal.
const POD_INDEX: &str = "nodeset.slinky.slurm.net/pod-index";
/// How long the API server may take to serve a CRD once it is created.
const CRD_ESTABLISHED_WAIT_S: u64 = 60;

/// Installs Slinky's NodeSet CRD, once per process, and waits until the API
/// server serves it. Server-side apply: other test processes on the same
/// API server may install it at the same time. The Controller CRD is not
/// needed: a NodeSet's `controllerRef` is a name, not checked by the API
/// server.
fn install_node_set_crd(cp: &ControlPlane) {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let crd = lockstep_testkit::repo().join("../shared/slinky/slinky.slurm.net_nodesets.yaml");
        assert!(crd.exists(), "Slinky's NodeSet CRD at {}", crd.display());
        let crd = crd.to_str().expect("utf-8 path");
        cp.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=lockstep-test",
            "-f",
            crd,
        ]);
        cp.kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/nodesets.slinky.slurm.net",
            &format!("--timeout={CRD_ESTABLISHED_WAIT_S}s"),
        ]);
        // Established is the API server's word; discovery follows it.
        let deadline = Instant::now() + Duration::from_secs(CRD_ESTABLISHED_WAIT_S);
        while !cp
            .kubectl(&["api-resources", "--api-group", SLINKY, "-o", "name"])
            .contains("nodesets")
        {
            assert!(Instant::now() < deadline, "nodesets never in discovery");
            std::thread::sleep(Duration::from_millis(200));
        }
    });
}

/// A NodeSet of `run` with `replicas`, as a site writes one (no Slinky
/// controller runs: the test plays it where it needs to).
fn node_set_obj(name: &str, run: &str, replicas: u32) -> Value {
    json!({
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
        "metadata": {"name": name, "namespace": NS, "labels": {TEST_LABEL: run}},
        "spec": {
            "controllerRef": {"name": "slurm"},
            "replicas": replicas,
            "template": {"spec": {"containers": [{"name": "slurmd", "image": "slurmd:test"}]}},
        },
    })
}

/// Pod `<set>-<ordinal>` as the NodeSet controller makes it: Slinky's labels
/// (its hostname is the Slurm node name) and the NodeSet as its controller.
fn node_set_pod_obj(set: &str, set_uid: &str, ordinal: u32, run: &str) -> Value {
    let name = format!("{set}-{ordinal}");
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NS,
            "labels": {
                TEST_LABEL: run,
                POD_HOSTNAME: name,
                POD_INDEX: ordinal.to_string(),
                "nodeset.slinky.slurm.net/pod-name": name,
                "controller-revision-hash": format!("{set}-rev1"),
            },
            "ownerReferences": [{
                "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                "name": set, "uid": set_uid, "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {"hostname": name, "containers": [{"name": "slurmd", "image": "slurmd:test"}]},
    })
}

/// The scaling rule of NodeSet `name`.
fn node_set_rule(name: &str) -> ScaleRule {
    ScaleRule {
        target: node_set_ref(name),
        partition: "batch".to_owned(),
        min_replicas: 0,
        max_replicas: 8,
        scale_up_cooldown_s: 30,
        scale_down_cooldown_s: 120,
        idle_before_scale_down_s: 300,
        max_unavailable: 1,
    }
}

fn node_set_ref(name: &str) -> ScaleTargetRef {
    ScaleTargetRef {
        group: SLINKY.to_owned(),
        kind: "NodeSet".to_owned(),
        namespace: NS.to_owned(),
        name: name.to_owned(),
    }
}

/// A policy as a Slinky site writes it: NodeSet `name` scaled by lockstep,
/// Slurm node names from Slinky's hostname label, slurmd pods (and scale
/// targets) those of `run`.
fn slinky_policy(name: &str, run: &str) -> Policy {
    let mut policy = Policy::default();
    policy.mapping.node_name_label = Some(POD_HOSTNAME.to_owned());
    policy.mapping.pod_selector = format!("{TEST_LABEL}={run}");
    policy.scaling.targets = vec![node_set_rule(name)];
    policy
}

/// What the observer watches under `policy`: only the objects of `run`.
fn slinky_spec(policy: &Policy, run: &str) -> ObserveSpec {
    let mut spec = ObserveSpec::from_policy(policy, &[]);
    let selector = format!("{TEST_LABEL}={run}");
    spec.node_selector = Some(selector.clone());
    spec.namespace = Some(NS.to_owned());
    spec.scale_selector = Some(selector);
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_finds_the_node_set_at_the_version_its_crd_serves() {
    let cp = shared();
    install_node_set_crd(cp);
    let client = kube::Client::try_from(cp.kube_config().await).expect("client");
    let found = discover(&client, &ScaleKind::discovered(SLINKY, "NodeSet"))
        .await
        .expect("NodeSet discovered");
    assert_eq!(
        (found.version.as_str(), found.plural.as_str()),
        ("v1beta1", "nodesets")
    );
    assert_eq!(found.api_resource().api_version, "slinky.slurm.net/v1beta1");
    // The apps kinds need no asking.
    assert_eq!(
        discover(&client, &ScaleKind::stateful_set()).await.unwrap(),
        ScaleKind::stateful_set()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_set_is_observed_with_its_pods_and_scaled_through_its_scale_subresource() {
    let cp = shared();
    install_node_set_crd(cp);
    let run = unique("nodeset");
    let name = unique("cpu");
    let policy = slinky_policy(&name, &run);
    let mut spec = slinky_spec(&policy, &run);
    // A kind no API server serves waits for its CRD without holding up the
    // NodeSet's watch.
    spec.scale_kinds
        .push(ScaleKind::discovered("lockstep-test.invalid", "Widget"));
    let mut w = Watch::start(cp.kube_config().await, spec);
    w.synced(Domain::KubePods).await;

    cp.create(&node_set_obj(&name, &run, 2));
    let target = node_set_ref(&name);
    let created = KubeScaleTarget {
        target: target.clone(),
        replicas: 2,
        ready_replicas: 0,
        update_revision: None,
        version: 0,
    };
    w.next(
        "the NodeSet as a scale target",
        |e| matches!(e, Event::KubeScaleTarget(t) if t.same_but_version(&created) && t.version != 0),
    )
    .await;

    // Its status as the NodeSet controller writes it (the selector the scale
    // subresource reports, the hash its pods carry). lockstep rolls out none
    // of a NodeSet's revisions: Slinky does.
    cp.patch_status(
        &["nodeset", &name, "-n", NS],
        &json!({"status": {
            "replicas": 2, "readyReplicas": 1, "nodeSetHash": format!("{name}-rev1"),
            "selector": format!("app.kubernetes.io/instance={name}"),
        }}),
    );
    let one_ready = KubeScaleTarget {
        ready_replicas: 1,
        ..created.clone()
    };
    w.next(
        "readyReplicas from the status subresource",
        |e| matches!(e, Event::KubeScaleTarget(t) if t.same_but_version(&one_ready)),
    )
    .await;
    let scale = cp.get(&["nodeset", &name, "-n", NS, "--subresource=scale"]);
    assert_eq!(
        (
            &scale["spec"]["replicas"],
            &scale["status"]["replicas"],
            &scale["status"]["selector"]
        ),
        (
            &json!(2),
            &json!(2),
            &json!(format!("app.kubernetes.io/instance={name}"))
        ),
        "the CRD's scale subresource maps what lockstep reads: {scale}"
    );

    // A pod the NodeSet controller made: observed with its owner and the
    // Slurm node its hostname label names, which is how scaling finds the
    // NodeSet's pods (owner kind and name, namespace, the mapping label).
    let uid = cp.get(&["nodeset", &name, "-n", NS])["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_owned();
    cp.create(&node_set_pod_obj(&name, &uid, 0, &run));
    let pod_name = format!("{name}-0");
    let pod = w.pod(&pod_name, "the NodeSet's pod", |_| true).await;
    assert_eq!(
        pod.owner,
        Some(OwnerRef {
            kind: "NodeSet".to_owned(),
            name: name.clone()
        })
    );
    assert_eq!(pod.namespace, target.namespace);
    assert_eq!(
        pod.labels.get(POD_HOSTNAME),
        Some(&pod_name),
        "the Slurm node name"
    );
    assert_eq!(
        pod.revision.as_deref(),
        Some(format!("{name}-rev1").as_str())
    );

    // lockstep scales it: spec.replicas through /scale, once; the status
    // Slinky wrote is left alone.
    let act = Actuator::new(
        cp.kube_config().await,
        scale_kinds(&policy),
        ActuatorConfig::default(),
    )
    .expect("actuator");
    let to = |replicas| {
        issued(
            1,
            Action::KubeScale {
                target: target.clone(),
                replicas,
            },
        )
    };
    assert_eq!(act.execute(&to(3)).await.result, OutcomeResult::Succeeded);
    let obj = cp.get(&["nodeset", &name, "-n", NS]);
    assert_eq!(
        (&obj["spec"]["replicas"], &obj["status"]["readyReplicas"]),
        (&json!(3), &json!(1))
    );
    assert_eq!(act.execute(&to(3)).await.result, OutcomeResult::AlreadyDone);
    let scaled = KubeScaleTarget {
        replicas: 3,
        ..one_ready.clone()
    };
    w.next(
        "the scaled NodeSet",
        |e| matches!(e, Event::KubeScaleTarget(t) if t.same_but_version(&scaled)),
    )
    .await;

    cp.kubectl(&["delete", "pod", &pod_name, "-n", NS, "--wait=false"]);
    cp.kubectl(&["delete", "nodeset", &name, "-n", NS]);
    w.next(
        "the NodeSet gone",
        |e| matches!(e, Event::KubeScaleTargetGone { target: t, .. } if *t == target),
    )
    .await;
    // Gone: a clear failure that waiting does not fix.
    assert_failed(&act.execute(&to(1)).await, false, "not found");
}
