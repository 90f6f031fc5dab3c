//! The Kubernetes connector against a real kube-apiserver (and etcd), as
//! `deploy/local/kube/up.sh` builds and starts them (`lockstep_testkit::kube`:
//! a shared control plane for the tests that only touch their own objects,
//! and one that the disruptive tests stop, restart and compact, one at a
//! time). No kubelet runs: the tests create Node and Pod objects and set
//! their status through the API, as a kubelet would.
//!
//! Here the observer; the actuator in `kube/actuator.rs`, leader election
//! in `kube/lease.rs`, Slinky's NodeSet as a scale target in
//! `kube/nodeset.rs`, what they share in `kube/support.rs`.

#[path = "kube/actuator.rs"]
mod actuator;
#[path = "kube/lease.rs"]
mod lease;
#[path = "kube/nodeset.rs"]
mod nodeset;
#[path = "kube/support.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams};
use lockstep_schemas::{
    ConditionStatus, Domain, Event, KubePod, KubeScaleTarget, PodCondition, PodPhase,
    ScaleTargetRef, Taint, TaintEffect,
};
use lockstep_testkit::kube::{
    node_conditions, node_obj, pod_obj, restart_apiserver, shared, stateful_set_obj, unique,
    DISRUPT_LOCK, NS, TEST_LABEL, ZONE,
};
use lockstep_testkit::Proxy;
use serde_json::json;
use support::{mirror_nodes, spec, KubeConfig, Through, Watch, WAIT};
use tokio::sync::watch;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lifecycle_appears_as_observations() {
    let cp = shared();
    let run = unique("nodes");
    let name = unique("node");
    let mut w = Watch::start(cp.kube_config().await, spec(&run));
    w.synced(Domain::KubeNodes).await;

    cp.create(&node_obj(&name, &run, "z1"));
    let n = w.node(&name, "created node", |_| true).await;
    assert_eq!(n.ready, ConditionStatus::Unknown, "no Ready condition yet");
    assert!(!n.unschedulable);
    assert_eq!(
        n.labels,
        BTreeMap::from([(ZONE.to_owned(), "z1".to_owned())]),
        "only named labels"
    );
    assert!(
        n.taints.is_empty(),
        "node.kubernetes.io/not-ready is not lockstep's"
    );

    cp.patch_status(
        &["node", &name],
        &node_conditions("True", "2025-01-01T00:00:00Z", &[]),
    );
    w.node(&name, "Ready=True", |n| n.ready == ConditionStatus::True)
        .await;

    cp.kubectl(&["cordon", &name]);
    w.node(&name, "cordoned", |n| n.unschedulable).await;

    cp.patch_status(
        &["node", &name],
        &node_conditions("False", "2025-01-01T00:00:10Z", &[]),
    );
    w.node(&name, "NotReady", |n| {
        n.ready == ConditionStatus::False && n.unschedulable
    })
    .await;

    cp.kubectl(&["label", "node", &name, &format!("{ZONE}=z2"), "--overwrite"]);
    w.node(&name, "relabelled", |n| {
        n.labels.get(ZONE).map(String::as_str) == Some("z2")
    })
    .await;

    cp.kubectl(&["annotate", "node", &name, "lockstep.io/rack=r7"]);
    w.node(&name, "annotated", |n| {
        n.labels
            .get("annotation:lockstep.io/rack")
            .map(String::as_str)
            == Some("r7")
    })
    .await;

    cp.patch_status(
        &["node", &name],
        &node_conditions(
            "False",
            "2025-01-01T00:00:20Z",
            &[("GpuXid", "True", "Xid79")],
        ),
    );
    let n = w
        .node(&name, "GpuXid condition", |n| !n.conditions.is_empty())
        .await;
    assert_eq!(n.conditions[0].type_, "GpuXid");
    assert_eq!(
        (n.conditions[0].status, n.conditions[0].reason.as_str()),
        (ConditionStatus::True, "Xid79")
    );

    cp.kubectl(&[
        "taint",
        "node",
        &name,
        "lockstep.io/slurm-unhealthy=:NoSchedule",
        "example.com/other=x:NoSchedule",
    ]);
    let n = w
        .node(&name, "lockstep taint", |n| !n.taints.is_empty())
        .await;
    assert_eq!(
        n.taints,
        vec![Taint {
            key: "lockstep.io/slurm-unhealthy".to_owned(),
            value: String::new(),
            effect: TaintEffect::NoSchedule
        }],
        "only lockstep's taints"
    );

    // A kubelet heartbeat (new lastHeartbeatTime, same statuses), a label
    // and an annotation lockstep does not read: nothing to report.
    cp.patch_status(
        &["node", &name],
        &node_conditions(
            "False",
            "2025-01-01T00:05:00Z",
            &[("GpuXid", "True", "Xid79")],
        ),
    );
    cp.kubectl(&["label", "node", &name, "unwatched=y", "--overwrite"]);
    cp.kubectl(&["annotate", "node", &name, "noise=1"]);
    let got = w.quiet(Duration::from_millis(1_500)).await;
    assert!(
        got.is_empty(),
        "heartbeat and unwatched changes made events: {got:?}"
    );

    cp.kubectl(&["delete", "node", &name]);
    w.next(
        "node gone",
        |e| matches!(e, Event::KubeNodeGone { name: n, version } if *n == name && *version != 0),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_lifecycle_appears_as_observations() {
    let cp = shared();
    let run = unique("pods");
    let (node, p1, p2, stranger) = (unique("pnode"), unique("pod"), unique("pod"), unique("pod"));
    cp.create(&node_obj(&node, &run, "z1"));
    let mut w = Watch::start(cp.kube_config().await, spec(&run));
    w.synced(Domain::KubePods).await;

    // A pod without the selector's label is never seen.
    let mut other = pod_obj(&stranger, &run, Some(&node));
    other["metadata"]["labels"][TEST_LABEL] = json!("someone-else");
    cp.create(&other);

    cp.create(&pod_obj(&p1, &run, Some(&node)));
    let p = w.pod(&p1, "created pod", |_| true).await;
    let uid = cp.get(&["pod", &p1, "-n", NS])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(p.version, 0, "the pod's resourceVersion is its version");
    assert_eq!(
        p,
        KubePod {
            namespace: NS.to_owned(),
            name: p1.clone(),
            uid,
            node_name: Some(node.clone()),
            phase: PodPhase::Pending,
            ready: false,
            deleting: false,
            disruption_target: false,
            labels: BTreeMap::from([("slurm.node".to_owned(), format!("slurm-{p1}"))]),
            conditions: vec![],
            owner: Some(lockstep_schemas::OwnerRef {
                kind: "StatefulSet".to_owned(),
                name: "compute".to_owned()
            }),
            revision: Some("compute-rev1".to_owned()),
            unhealthy_devices: Default::default(),
            eviction: Default::default(),
            version: p.version,
        }
    );

    cp.patch_status(
        &["pod", &p1, "-n", NS],
        &json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastProbeTime": null},
            {"type": "SlurmNodeDrained", "status": "True", "reason": "Admin", "message": "maintenance"},
        ]}}),
    );
    let p = w
        .pod(&p1, "running with a managed condition", |p| {
            p.phase == PodPhase::Running
        })
        .await;
    assert_eq!(
        p.conditions,
        vec![PodCondition {
            type_: "SlurmNodeDrained".to_owned(),
            status: ConditionStatus::True,
            reason: "Admin".to_owned(),
            message: "maintenance".to_owned(),
        }],
        "only the conditions lockstep manages"
    );
    assert!(p.ready, "the Ready condition is read");

    // Status churn lockstep does not read: nothing.
    cp.patch_status(
        &["pod", &p1, "-n", NS],
        &json!({"status": {"podIP": "10.0.0.7", "conditions": [
            {"type": "Ready", "status": "True", "lastProbeTime": "2025-01-01T00:00:00Z"},
            {"type": "SlurmNodeDrained", "status": "True", "reason": "Admin", "message": "maintenance"},
        ]}}),
    );
    let got = w.quiet(Duration::from_millis(1_500)).await;
    assert!(
        got.is_empty(),
        "unread pod status changes made events: {got:?}"
    );

    // A real eviction: the API server sets DisruptionTarget, then deletes
    // (gracefully: without a kubelet the pod stays, deleting).
    let pods: Api<Pod> =
        Api::namespaced(kube::Client::try_from(cp.kube_config().await).unwrap(), NS);
    pods.evict(&p1, &EvictParams::default())
        .await
        .expect("eviction");
    let p = w
        .pod(&p1, "evicted", |p| p.disruption_target && p.deleting)
        .await;
    assert_eq!(p.phase, PodPhase::Running);

    // A plain delete: deleting without DisruptionTarget.
    cp.create(&pod_obj(&p2, &run, Some(&node)));
    w.pod(&p2, "second pod", |p| !p.deleting).await;
    cp.kubectl(&["delete", "pod", &p2, "-n", NS, "--wait=false"]);
    let p = w.pod(&p2, "deleting", |p| p.deleting).await;
    assert!(!p.disruption_target);

    for p in [&p1, &p2] {
        cp.kubectl(&[
            "delete",
            "pod",
            p,
            "-n",
            NS,
            "--grace-period=0",
            "--force",
            "--wait=false",
        ]);
        w.next(
            "pod gone",
            |e| matches!(e, Event::KubePodGone { name, namespace, .. } if name == p && namespace == NS),
        )
        .await;
    }
    assert!(
        !w.seen.iter().any(|e| e.summary().contains(&stranger)),
        "pod outside the selector was observed"
    );
    cp.kubectl(&[
        "delete",
        "pod",
        &stranger,
        "-n",
        NS,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    cp.kubectl(&["delete", "node", &node]);
}

/// A changed spec (the policy in force changed) restarts only the watches
/// it changes: a new pod selector lists the pods it selects and leaves gone
/// those it no longer selects, while the node watch goes on undisturbed; a
/// spec without a pod selector leaves every pod gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_spec_restarts_only_the_watches_it_changes() {
    let cp = shared();
    let run = unique("respec");
    let moved = format!("{run}-b");
    let (node, p1, p2) = (unique("rnode"), unique("pod"), unique("pod"));
    cp.create(&node_obj(&node, &run, "z1"));
    cp.create(&pod_obj(&p1, &run, Some(&node)));
    let mut other = pod_obj(&p2, &run, Some(&node));
    other["metadata"]["labels"][TEST_LABEL] = json!(moved);
    cp.create(&other);
    let first = spec(&run);
    let (specs, rx) = watch::channel(first.clone());
    let mut w = Watch::following(cp.kube_config().await, rx);
    // Both first listings, in whatever order they come.
    let deadline = tokio::time::Instant::now() + WAIT;
    let listed = |seen: &[Event], domain: Domain| {
        seen.iter()
            .any(|e| matches!(e, Event::SyncDone { domain: d } if *d == domain))
    };
    while !(listed(&w.seen, Domain::KubePods) && listed(&w.seen, Domain::KubeNodes)) {
        assert!(w.recv(deadline).await.is_some(), "{}", w.history());
    }
    assert!(
        w.seen
            .iter()
            .any(|e| matches!(e, Event::KubePod(p) if p.name == p1)),
        "{}",
        w.history()
    );
    w.quiet(Duration::from_secs(1)).await;

    let show = |events: &[Event]| -> Vec<String> { events.iter().map(Event::summary).collect() };
    let from = w.seen.len();
    let mut second = first.clone();
    second.pod_selector = Some(format!("{TEST_LABEL}={moved}"));
    specs.send(second.clone()).unwrap();
    w.synced(Domain::KubePods).await;
    w.quiet(Duration::from_secs(1)).await;
    let after = &w.seen[from..];
    assert!(
        matches!(
            after.first(),
            Some(Event::SyncStarted {
                domain: Domain::KubePods
            })
        ),
        "{:#?}",
        show(after)
    );
    assert!(
        after
            .iter()
            .any(|e| matches!(e, Event::KubePod(p) if p.name == p2)),
        "{:#?}",
        show(after)
    );
    assert!(
        after
            .iter()
            .any(|e| matches!(e, Event::KubePodGone { name, .. } if *name == p1)),
        "{:#?}",
        show(after)
    );
    assert!(
        !after
            .iter()
            .any(|e| matches!(e, Event::KubePod(p) if p.name == p1)
                || matches!(
                    e,
                    Event::SyncStarted {
                        domain: Domain::KubeNodes
                    } | Event::KubeNode(_)
                )),
        "the node watch went on: {:#?}",
        show(after)
    );

    // The same spec again changes nothing.
    specs.send(second.clone()).unwrap();
    assert_eq!(
        show(&w.quiet(Duration::from_secs(1)).await),
        Vec::<String>::new()
    );

    // No pod selector: no pods watched, the ones seen are gone.
    let mut third = second;
    third.pod_selector = None;
    specs.send(third).unwrap();
    w.next(
        "the pod gone with its watch",
        |e| matches!(e, Event::KubePodGone { name, .. } if *name == p2),
    )
    .await;

    for p in [&p1, &p2] {
        cp.kubectl(&["delete", "pod", p, "-n", NS, "--wait=false"]);
    }
    cp.kubectl(&["delete", "node", &node]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateful_set_appears_as_scale_target() {
    let cp = shared();
    let run = unique("sts");
    let name = unique("compute");
    let mut w = Watch::start(cp.kube_config().await, spec(&run));
    w.synced(Domain::KubeScaleTargets).await;
    let target = ScaleTargetRef {
        group: "apps".to_owned(),
        kind: "StatefulSet".to_owned(),
        namespace: NS.to_owned(),
        name: name.clone(),
    };
    cp.create(&stateful_set_obj(&name, &run, 2));
    let want = KubeScaleTarget {
        target: target.clone(),
        replicas: 2,
        ready_replicas: 0,
        update_revision: None,
        version: 0,
    };
    w.next(
        "created",
        |e| matches!(e, Event::KubeScaleTarget(t) if t.same_but_version(&want) && t.version != 0),
    )
    .await;

    cp.patch_status(
        &["statefulset", &name, "-n", NS],
        &json!({"status": {"replicas": 2, "readyReplicas": 1, "updateRevision": format!("{name}-abc")}}),
    );
    let want = KubeScaleTarget {
        target: target.clone(),
        replicas: 2,
        ready_replicas: 1,
        update_revision: Some(format!("{name}-abc")),
        version: 0,
    };
    w.next(
        "status",
        |e| matches!(e, Event::KubeScaleTarget(t) if t.same_but_version(&want) && t.version != 0),
    )
    .await;

    cp.kubectl(&["delete", "statefulset", &name, "-n", NS]);
    w.next(
        "gone",
        |e| matches!(e, Event::KubeScaleTargetGone { target: t, .. } if *t == target),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_listing_is_framed_by_sync_markers() {
    let cp = shared();
    let run = unique("sync");
    let (a, b) = (unique("node"), unique("node"));
    cp.create(&node_obj(&a, &run, "z1"));
    cp.create(&node_obj(&b, &run, "z1"));
    let mut w = Watch::start(cp.kube_config().await, spec(&run));
    w.synced(Domain::KubeNodes).await;
    let at = |pred: &dyn Fn(&Event) -> bool| w.seen.iter().position(pred).expect("seen");
    let started = at(&|e| {
        matches!(
            e,
            Event::SyncStarted {
                domain: Domain::KubeNodes
            }
        )
    });
    let done = at(&|e| {
        matches!(
            e,
            Event::SyncDone {
                domain: Domain::KubeNodes
            }
        )
    });
    let na = at(&|e| matches!(e, Event::KubeNode(n) if n.name == a));
    let nb = at(&|e| matches!(e, Event::KubeNode(n) if n.name == b));
    let visible = at(&|e| matches!(e, Event::ConnectorStatus { visible: true, .. }));
    assert!(
        visible < started && started < na && started < nb && na < done && nb < done,
        "{}",
        w.history()
    );
    for n in [&a, &b] {
        cp.kubectl(&["delete", "node", n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watch_is_reported_and_resumes_without_loss() {
    let cp = shared();
    let run = unique("cut");
    let (a, b) = (unique("node"), unique("node"));
    cp.create(&node_obj(&a, &run, "z1"));
    cp.create(&node_obj(&b, &run, "z1"));
    let proxy = Proxy::start(cp.api_addr).await;
    let mut w = Watch::start(proxy.config(cp.kube_config().await), spec(&run));
    w.visible(true).await;
    w.synced(Domain::KubeNodes).await;

    proxy.cut();
    let e = w.visible(false).await;
    assert!(e.summary().contains("cannot reach"), "{}", e.summary());
    // Changes while lockstep cannot see.
    cp.kubectl(&["cordon", &a]);
    cp.kubectl(&["delete", "node", &b]);
    proxy.restore();
    w.visible(true).await;
    w.converge("a cordoned, b gone", |nodes| {
        nodes.get(&a).is_some_and(|n| n.unschedulable) && !nodes.contains_key(&b)
    })
    .await;
    assert!(
        w.seen
            .iter()
            .any(|e| matches!(e, Event::KubeNodeGone { name, .. } if *name == b)),
        "the delete is in the log as a delete:\n{}",
        w.history()
    );
    cp.kubectl(&["delete", "node", &a]);
}

/// Stops kube-apiserver in the middle of a watch, with changes just before
/// the stop and just after the start; the folded log must end up as the
/// cluster is, with every delete in it.
async fn apiserver_restart_loses_nothing(apiserver_args: &str) {
    let _serial = DISRUPT_LOCK.lock().await;
    let mut cp = restart_apiserver(apiserver_args);
    let run = unique("restart");
    let names: Vec<String> = (0..5).map(|_| unique("node")).collect();
    let [a, b, c, d, e] = [0, 1, 2, 3, 4].map(|i| names[i].clone());
    for n in [&a, &b, &c, &d] {
        cp.create(&node_obj(n, &run, "z1"));
    }
    let mut w = Watch::start(cp.kube_config().await, spec(&run));
    w.synced(Domain::KubeNodes).await;
    w.converge("all four listed", |nodes| nodes.len() == 4)
        .await;

    // Just before the stop: the watcher may or may not get these in time.
    cp.kubectl(&["cordon", &a]);
    cp.kubectl(&["delete", "node", &b]);
    cp.stop_apiserver();
    w.visible(false).await;

    cp.up(apiserver_args);
    w.visible(true).await;

    // Just after the start.
    cp.kubectl(&["delete", "node", &c]);
    cp.kubectl(&["label", "node", &d, &format!("{ZONE}=z2"), "--overwrite"]);
    cp.create(&node_obj(&e, &run, "z3"));

    w.converge("a cordoned, b and c gone, d in z2, e new", |nodes| {
        nodes.keys().cloned().collect::<Vec<_>>() == {
            let mut v = vec![a.clone(), d.clone(), e.clone()];
            v.sort();
            v
        } && nodes[&a].unschedulable
            && nodes[&d].labels.get(ZONE).map(String::as_str) == Some("z2")
            && nodes[&e].labels.get(ZONE).map(String::as_str) == Some("z3")
    })
    .await;
    for gone in [&b, &c] {
        assert!(
            w.seen
                .iter()
                .any(|ev| matches!(ev, Event::KubeNodeGone { name, .. } if name == gone)),
            "delete of {gone} is in the log:\n{}",
            w.history()
        );
    }
    // Quiet afterwards: no duplicates trickling in.
    let extra = w.quiet(Duration::from_millis(1_000)).await;
    assert!(
        extra
            .iter()
            .all(|e| matches!(e, Event::ConnectorStatus { .. })),
        "{extra:?}"
    );
    for n in [&a, &d, &e] {
        cp.kubectl(&["delete", "node", n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart_with_watch_cache_loses_nothing() {
    apiserver_restart_loses_nothing("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart_without_watch_cache_loses_nothing() {
    apiserver_restart_loses_nothing("--watch-cache=false").await;
}

/// A watch that resumes from a compacted resourceVersion gets a real
/// `410 Gone`; the relist must report the objects deleted meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relist_after_410_gone_reports_deletes() {
    let _serial = DISRUPT_LOCK.lock().await;
    // Watches served from etcd, not the watch cache, so that compaction
    // makes old resourceVersions expire at once.
    let cp = restart_apiserver("--watch-cache=false");
    let run = unique("gone");
    let (x, y, z) = (unique("node"), unique("node"), unique("node"));
    for n in [&x, &y, &z] {
        cp.create(&node_obj(n, &run, "z1"));
    }
    let proxy = Proxy::start(cp.api_addr).await;
    let mut w = Watch::start(proxy.config(cp.kube_config().await), spec(&run));
    w.synced(Domain::KubeNodes).await;
    w.converge("three nodes", |nodes| nodes.len() == 3).await;
    let listings_before = w
        .seen
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::SyncStarted {
                    domain: Domain::KubeNodes
                }
            )
        })
        .count();

    proxy.cut();
    w.visible(false).await;
    cp.kubectl(&["delete", "node", &y]);
    cp.kubectl(&["cordon", &x]);
    // One more write, so the compaction revision is past the delete's.
    let bump = unique("bump");
    cp.kubectl(&["create", "configmap", &bump, "-n", NS]);
    cp.compact_etcd(cp.etcd_revision());
    proxy.restore();

    let start = w.seen.len();
    w.synced(Domain::KubeNodes).await;
    let relist = &w.seen[start..];
    let pos = |pred: &dyn Fn(&Event) -> bool| relist.iter().position(pred);
    let started = pos(&|e| {
        matches!(
            e,
            Event::SyncStarted {
                domain: Domain::KubeNodes
            }
        )
    })
    .unwrap_or_else(|| panic!("no relist:\n{}", w.history()));
    let gone = pos(&|e| matches!(e, Event::KubeNodeGone { name, .. } if *name == y))
        .unwrap_or_else(|| panic!("no Gone for {y}:\n{}", w.history()));
    let done = pos(&|e| {
        matches!(
            e,
            Event::SyncDone {
                domain: Domain::KubeNodes
            }
        )
    })
    .unwrap();
    assert!(started < gone && gone < done, "{}", w.history());
    assert!(
        relist
            .iter()
            .any(|e| matches!(e, Event::KubeNode(n) if n.name == x && n.unschedulable)),
        "{}",
        w.history()
    );
    let listings_after = w
        .seen
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::SyncStarted {
                    domain: Domain::KubeNodes
                }
            )
        })
        .count();
    assert_eq!(listings_after, listings_before + 1, "exactly one relist");
    assert_eq!(mirror_nodes(&w.seen).into_keys().collect::<Vec<_>>(), {
        let mut v = vec![x.clone(), z.clone()];
        v.sort();
        v
    });
    for n in [&x, &z] {
        cp.kubectl(&["delete", "node", n]);
    }
    cp.kubectl(&["delete", "configmap", &bump, "-n", NS]);
}

/// kube-runtime's watcher retries a watch from the same resourceVersion
/// after a server error, and a watch served from etcd whose next event is a
/// delete with its previous version compacted away fails with 500 ("etcd
/// event received with PrevKv=nil") every time: without a way out, the
/// delete would never be seen. The observer starts such a watcher over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_stuck_on_server_errors_lists_again() {
    let _serial = DISRUPT_LOCK.lock().await;
    let cp = restart_apiserver("--watch-cache=false");
    // The scenario needs the delete to be etcd's very next revision after
    // the last event the watcher saw; another write (the API server renews
    // its lease every 10 s) can slip in between: then try again.
    for attempt in 1..=5 {
        let run = unique("stuck");
        let (x, y) = (unique("node"), unique("node"));
        for n in [&x, &y] {
            cp.create(&node_obj(n, &run, "z1"));
        }
        let proxy = Proxy::start(cp.api_addr).await;
        let mut w = Watch::start(proxy.config(cp.kube_config().await), spec(&run));
        w.synced(Domain::KubeNodes).await;
        w.converge("two nodes", |nodes| nodes.len() == 2).await;
        cp.kubectl(&["cordon", &x]);
        w.node(&x, "cordoned", |n| n.unschedulable).await;
        let seen_rv: u64 = cp.get(&["node", &x])["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .expect("resourceVersion");
        proxy.cut();
        cp.kubectl(&["delete", "node", &y]);
        let delete_rev = cp.etcd_revision();
        if delete_rev != seen_rv + 1 {
            eprintln!("attempt {attempt}: another write between {seen_rv} and the delete ({delete_rev}); again");
            proxy.restore();
            cp.kubectl(&["delete", "node", &x]);
            continue;
        }
        cp.compact_etcd(delete_rev);
        // The server really answers that watch with a 500, every time.
        let raw = cp.kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes?watch=1&resourceVersion={seen_rv}&labelSelector={TEST_LABEL}%3D{run}&timeoutSeconds=2"),
        ]);
        assert!(
            raw.contains(r#""code":500"#) && raw.contains("PrevKv=nil"),
            "{raw}"
        );

        let start = w.seen.len();
        proxy.restore();
        w.next(
            "gone after listing again",
            |e| matches!(e, Event::KubeNodeGone { name, .. } if *name == y),
        )
        .await;
        assert!(
            w.seen[start..].iter().any(|e| matches!(
                e,
                Event::SyncStarted {
                    domain: Domain::KubeNodes
                }
            )),
            "{}",
            w.history()
        );
        assert_eq!(
            mirror_nodes(&w.seen).into_keys().collect::<Vec<_>>(),
            vec![x.clone()]
        );
        cp.kubectl(&["delete", "node", &x]);
        return;
    }
    panic!("could not arrange a delete right after the watcher's last event in 5 attempts");
}
