//! `lockstep run` with a Kubernetes section, against a real kube-apiserver
//! (`deploy/local/kube`) and a real nats-server: what happens in the API
//! server reaches the log, and what the reducer decides reaches the API
//! server.
//!
//! The Slurm side is played by the test: it appends Slurm observations to
//! the log as the Slurm connector would.

use std::time::Duration;

use lockstep_schemas::{
    Action, ConditionStatus, Envelope, Event, KubeNode, SlurmNode, SlurmNodeFlag, Source,
};
mod common;

use common::{read_all, wait_for, Lockstep, Stack};
use lockstep_store::{EventLog, StreamLimits};
use lockstep_testkit::{temp_dir, NatsServer};

#[test]
fn cordons_reach_the_log_and_decisions_reach_the_api_server() {
    let k = Stack::up();
    let run = format!("{}", std::process::id());
    let node = format!("loop-node-{run}");
    let pod = format!("loop-slurmd-{run}");
    node_with_slurmd_pod(&k, &node, &pod);
    let nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let log = log_on(&rt, &nats);
    let dir = temp_dir("kube-loop");
    let mut lockstep = Lockstep::start(
        &dir,
        &format!(
            "[log]\nnats_url = \"{}\"\n[service]\ntick_interval_ms = 500\n[kubernetes]\nkubeconfig = \"{}\"\n",
            nats.url(),
            k.lockstep_kubeconfig.display()
        ),
        &serde_json::json!({}),
    );
    let run_log = || lockstep.log();

    // The Slurm side: the node exists, idle.
    let mut slurm = SlurmNode::idle(pod.clone());
    rt.block_on(log.append(&Envelope::new(
        Source::Test,
        1,
        Event::SlurmNode(slurm.clone()),
    )))
    .unwrap();

    // kubectl cordon reaches the log and the reducer drains the Slurm node:
    // the action appears on the action stream (no Slurm actuator here).
    k.kubectl(&["cordon", &node], None);
    let drain = wait_for(
        "a drain for the cordon on the action stream",
        Duration::from_secs(60),
        || {
            rt.block_on(log.actions()).ok()?.into_iter().find(|a| {
            matches!(&a.action, Action::SlurmDrain { node: n, reason } if *n == pod && reason.contains("cordoned"))
        })
        },
    );
    assert_eq!(drain.rule, "drain.cordon", "{}", run_log());
    k.kubectl(&["uncordon", &node], None);

    // An admin drains the node in Slurm: lockstep shows the foreign drain on
    // the pod, through the real API server.
    slurm.flags = vec![SlurmNodeFlag::Drain];
    slurm.reason = Some("admin: reseat GPU".into());
    slurm.reason_user = Some("root".into());
    rt.block_on(log.append(&Envelope::new(Source::Test, 2, Event::SlurmNode(slurm))))
        .unwrap();
    let condition = wait_for(
        "pod condition SlurmNodeDrained=True",
        Duration::from_secs(60),
        || {
            let p = k.get(&["pod", &pod, "-n", "default"])?;
            p["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "SlurmNodeDrained" && c["status"] == "True")
                .cloned()
        },
    );
    assert_eq!(condition["message"], "admin: reseat GPU", "{}", run_log());

    // Both directions are in the log: the Kubernetes observations and the
    // actuator's outcome.
    let records = rt.block_on(read_all(&log));
    assert!(records.iter().any(|r| r.envelope.source == Source::Kubernetes
        && matches!(&r.envelope.event, Event::KubeNode(n) if n.name == node && n.unschedulable)));
    let outcome = wait_for(
        "the pod condition's outcome in the log",
        Duration::from_secs(30),
        || {
            rt.block_on(read_all(&log)).into_iter().find(|r| {
            r.envelope.source == Source::Actuator
                && matches!(&r.envelope.event, Event::ActionOutcome(o) if o.kind.name() == "kube_set_pod_condition")
        })
        },
    );
    assert!(
        matches!(&outcome.envelope.event, Event::ActionOutcome(o) if o.result == lockstep_schemas::OutcomeResult::Succeeded)
    );

    let status = lockstep.child.stop();
    assert!(status.success(), "{}", lockstep.log());
    remove_node_and_pod(&k, &node, &pod);
    let _ = std::fs::remove_dir_all(dir);
}

/// What lockstep watches in Kubernetes follows the policy in force, through
/// the log as the reducer's policy does: a policy change that names another
/// node label and node condition restarts the node watch in the running
/// process, and from then on their values are observed.
#[test]
fn a_policy_change_restarts_the_watch_it_changes_without_a_restart() {
    let k = Stack::up();
    let run = format!("{}", std::process::id());
    let node = format!("policy-watch-node-{run}");
    const LABEL: &str = "lockstep-test.io/rack";
    const CONDITION: &str = "LockstepTestFault";
    k.apply(&serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": {LABEL: "r1"}},
    }));

    let nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let log = log_on(&rt, &nats);
    let dir = temp_dir("kube-loop-policy-watch");
    let mut lockstep = Lockstep::start(
        &dir,
        &format!(
            "[log]\nnats_url = \"{}\"\n[service]\npolicy_poll_ms = 200\n[kubernetes]\nkubeconfig = \"{}\"\nactuate = false\n",
            nats.url(),
            k.lockstep_kubeconfig.display()
        ),
        &serde_json::json!({}),
    );
    // The node as observed, the last time it was, if it matches `pred`.
    let observed = |pred: &dyn Fn(&KubeNode) -> bool| {
        rt.block_on(read_all(&log))
            .into_iter()
            .rev()
            .find_map(|r| match r.envelope.event {
                Event::KubeNode(n) if n.name == node => Some(n),
                _ => None,
            })
            .filter(|n| pred(n))
    };

    // The policy in force reads neither the label nor the condition.
    let first = wait_for("the node observed", Duration::from_secs(60), || {
        observed(&|_| true)
    });
    assert!(!first.labels.contains_key(LABEL), "{first:?}");
    let pid = lockstep.child.0.as_ref().unwrap().id();

    // The new policy reads both: lockstep appends it to the log, and the
    // node watch restarts under it.
    std::fs::write(
        dir.join("policy.json"),
        serde_json::json!({
            "topology": {"features": [{"label": LABEL, "prefix": "rack-"}]},
            "health": {"node_conditions": [CONDITION]},
        })
        .to_string(),
    )
    .unwrap();
    let relisted = wait_for(
        "the label under the new policy",
        Duration::from_secs(60),
        || observed(&|n| n.labels.get(LABEL).map(String::as_str) == Some("r1")),
    );
    assert_eq!(
        relisted
            .read_labels
            .as_ref()
            .map(|l| l.contains(&LABEL.to_owned())),
        Some(true),
        "{relisted:?}"
    );

    // The running watch is the new one: a new value of the label and the
    // condition it now names are observed as they happen.
    k.kubectl(
        &[
            "label",
            "node",
            &node,
            &format!("{LABEL}=r2"),
            "--overwrite",
        ],
        None,
    );
    wait_for("the label's new value", Duration::from_secs(60), || {
        observed(&|n| n.labels.get(LABEL).map(String::as_str) == Some("r2"))
    });
    let status = serde_json::json!({"status": {"conditions": [{
        "type": CONDITION, "status": "True", "reason": "Test",
        "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z",
    }]}});
    k.kubectl(
        &[
            "patch",
            "node",
            &node,
            "--subresource=status",
            "--type=strategic",
            "-p",
            &status.to_string(),
        ],
        None,
    );
    wait_for(
        "the condition the policy now names",
        Duration::from_secs(60),
        || {
            observed(&|n| {
                n.conditions
                    .iter()
                    .any(|c| c.type_ == CONDITION && c.status == ConditionStatus::True)
            })
        },
    );

    // All in the process that started: no restart.
    assert!(
        lockstep
            .child
            .0
            .as_mut()
            .unwrap()
            .try_wait()
            .unwrap()
            .is_none(),
        "{}",
        lockstep.log()
    );
    assert_eq!(lockstep.child.0.as_ref().unwrap().id(), pid);
    assert!(
        lockstep.log().contains("restarting those watches"),
        "{}",
        lockstep.log()
    );
    let status = lockstep.child.stop();
    assert!(status.success(), "{}", lockstep.log());
    k.kubectl(&["delete", "node", &node], None);
    let _ = std::fs::remove_dir_all(dir);
}

/// A leader cut off from the API server past its renew deadline (an API
/// server that stalls, a network cut) stops acting, stays up as a follower,
/// and leads and acts again once the API server answers, in the same
/// process: nothing restarts it, as nothing would in a Pod before its
/// restart back-off.
#[test]
fn a_leader_that_loses_its_lease_steps_down_and_leads_again_in_the_same_process() {
    let k = Stack::up();
    let run = format!("{}", std::process::id());
    let node = format!("lease-node-{run}");
    let pod = format!("lease-slurmd-{run}");
    let lease = format!("lease-loop-{run}");
    node_with_slurmd_pod(&k, &node, &pod);
    let nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let log = log_on(&rt, &nats);
    // lockstep reaches the API server through a proxy the test can cut.
    let kubeconfig = std::fs::read_to_string(&k.lockstep_kubeconfig).unwrap();
    let api = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .expect("the API server's address in the kubeconfig")
        .to_owned();
    let listen = format!("127.0.0.1:{}", lockstep_testkit::free_port());
    let mut cut = Some(rt.block_on(proxy(&listen, &api)));
    let dir = temp_dir("lease-loop");
    std::fs::create_dir_all(&dir).unwrap();
    let proxied = dir.join("proxied.kubeconfig");
    std::fs::write(
        &proxied,
        kubeconfig.replace(&format!("https://{api}"), &format!("https://{listen}")),
    )
    .unwrap();
    let mut lockstep = Lockstep::start(
        &dir,
        &format!(
            "[log]\nnats_url = \"{}\"\n[service]\ntick_interval_ms = 500\n[kubernetes]\nkubeconfig = \"{}\"\n\
             [leader_election]\nnamespace = \"lockstep-system\"\nlease_name = \"{lease}\"\nidentity = \"a\"\n\
             lease_duration_ms = 4000\nrenew_deadline_ms = 2000\nretry_period_ms = 250\n",
            nats.url(),
            proxied.display()
        ),
        &serde_json::json!({}),
    );
    wait_for("it leads", Duration::from_secs(60), || {
        lockstep.leads().then_some(())
    });
    let slurm = SlurmNode::idle(pod.clone());
    rt.block_on(log.append(&Envelope::new(Source::Test, 1, Event::SlurmNode(slurm))))
        .unwrap();

    // Cut off: it steps down and stays up.
    let task = cut.take().unwrap();
    task.abort();
    let _ = rt.block_on(task);
    wait_for("it steps down", Duration::from_secs(30), || {
        lockstep.log().contains("stepping down").then_some(())
    });
    assert!(!lockstep.leads(), "{}", lockstep.log());
    let child = lockstep.child.0.as_mut().expect("running");
    assert!(
        child.try_wait().unwrap().is_none(),
        "it exited:\n{}",
        lockstep.log()
    );
    // Back: it leads again without a restart, and acts.
    let _back = rt.block_on(proxy(&listen, &api));
    wait_for("it leads again", Duration::from_secs(60), || {
        lockstep.leads().then_some(())
    });
    k.kubectl(&["cordon", &node], None);
    wait_for(
        "a drain for the cordon on the action stream",
        Duration::from_secs(60),
        || {
            rt.block_on(log.actions())
                .ok()?
                .into_iter()
                .find(|a| matches!(&a.action, Action::SlurmDrain { node: n, .. } if *n == pod))
        },
    );
    let status = lockstep.child.stop();
    assert!(status.success(), "{}", lockstep.log());
    remove_node_and_pod(&k, &node, &pod);
    k.kubectl(
        &[
            "delete",
            "lease",
            &lease,
            "-n",
            "lockstep-system",
            "--ignore-not-found",
        ],
        None,
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A TCP proxy from `listen` to the API server at `to`; aborting the task
/// closes its listener and every connection through it.
async fn proxy(listen: &str, to: &str) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
    let to = to.to_owned();
    tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((mut inbound, _)) = listener.accept().await {
            let to = to.clone();
            conns.spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    })
}

/// A Node and a slurmd pod bound to it (in `default`).
fn node_with_slurmd_pod(k: &Stack, node: &str, pod: &str) {
    k.apply(&serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}));
    k.apply(&serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": "default", "labels": {"app.kubernetes.io/component": "slurmd"}},
        "spec": {"nodeName": node, "containers": [{"name": "slurmd", "image": "slurmd:test"}]}
    }));
}

/// Takes them away again.
fn remove_node_and_pod(k: &Stack, node: &str, pod: &str) {
    k.kubectl(
        &[
            "delete",
            "pod",
            pod,
            "-n",
            "default",
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    k.kubectl(&["delete", "node", node], None);
}

/// The log on `nats`, through `rt` (entered by the caller, so that the
/// client it leaves behind is dropped inside it).
fn log_on(rt: &tokio::runtime::Runtime, nats: &NatsServer) -> EventLog {
    rt.block_on(EventLog::connect_nats(
        &nats.url(),
        &StreamLimits::default(),
    ))
    .unwrap()
}
