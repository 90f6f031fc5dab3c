//! Watch ingestion benchmark of the Kubernetes observer against a real
//! kube-apiserver (`deploy/local/kube/up.sh`).
//!
//! ```sh
//! deploy/local/kube/up.sh
//! cargo run --release -p lockstep-benches \
//!     --example kube_watch_bench -- [--nodes 5000] [--pods 20000] [--concurrency 32] \
//!     [--streaming-lists] [--keep] [--kubeconfig PATH]
//! ```
//!
//! 1. Creates the nodes and pods (labelled `lockstep-bench=<run>`, pods
//!    bound round-robin to the nodes), at most `--concurrency` requests in
//!    flight.
//! 2. Runs the observer in a fresh child process (so its resident memory is
//!    not the creator's), and measures: time to the initial sync (both
//!    `SyncDone`s), events per second into the channel, resident memory
//!    before and after; then a heartbeat on every node (must give no
//!    event), then a label change on every node (one event each: update
//!    ingestion rate).
//! 3. Deletes everything it created (unless `--keep`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use lockstep_connectors::kube::{load_config, Observation, ObserveSpec, Observer, ObserverConfig};
use lockstep_schemas::{Domain, Event, Policy};
use serde_json::json;

const LABEL: &str = "lockstep-bench";
const NS: &str = "default";

/// Watch ingestion of the Kubernetes observer against a real
/// kube-apiserver (see the module docs).
#[derive(clap::Parser)]
#[command(name = "kube_watch_bench")]
struct Args {
    /// Nodes to create.
    #[arg(long, default_value_t = 5_000)]
    nodes: usize,
    /// Pods to create, bound round-robin to the nodes.
    #[arg(long, default_value_t = 20_000)]
    pods: usize,
    /// Most create requests in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// The observer uses streaming lists (`sendInitialEvents`, Kubernetes
    /// 1.27+) instead of paginated lists.
    #[arg(long)]
    streaming_lists: bool,
    /// Leave the nodes and pods it created.
    #[arg(long)]
    keep: bool,
    /// The API server's admin kubeconfig.
    #[arg(long, default_value = "/tmp/lockstep-local/kube/kubeconfig")]
    kubeconfig: PathBuf,
    /// Set in the child: watch this run.
    #[arg(long, hide = true)]
    watch_run: Option<String>,
}

fn args() -> Args {
    <Args as clap::Parser>::parse()
}

/// (VmRSS, VmHWM) in MiB.
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

async fn client(a: &Args) -> Client {
    let config = load_config(Some(&a.kubeconfig))
        .await
        .unwrap_or_else(|e| panic!("{e}; start the control plane first: deploy/local/kube/up.sh"));
    Client::try_from(config).expect("client")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    match a.watch_run.clone() {
        Some(run) => watch(&a, &run).await,
        None => drive(&a).await,
    }
}

async fn drive(a: &Args) {
    let c = client(a).await;
    let run = format!("b{}", std::process::id());
    let nodes: Api<Node> = Api::all(c.clone());
    let pods: Api<Pod> = Api::namespaced(c.clone(), NS);
    let pp = PostParams::default();

    let t0 = Instant::now();
    let failures = stream::iter(0..a.nodes)
        .map(|i| {
            let (nodes, pp, run) = (&nodes, &pp, &run);
            async move {
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": format!("{run}-n{i:05}"),
                                 "labels": {LABEL: run, "topology.kubernetes.io/zone": format!("z{}", i % 8)}},
                }))
                .expect("node json");
                nodes.create(pp, &node).await.is_err()
            }
        })
        .buffer_unordered(a.concurrency)
        .filter(|failed| std::future::ready(*failed))
        .count()
        .await;
    let node_s = t0.elapsed().as_secs_f64();
    assert_eq!(failures, 0, "node creates failed");

    let t0 = Instant::now();
    let failures = stream::iter(0..a.pods)
        .map(|i| {
            let (pods, pp, run) = (&pods, &pp, &run);
            let node = format!("{run}-n{:05}", i % a.nodes.max(1));
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("{run}-p{i:05}"), "namespace": NS,
                                 "labels": {LABEL: run, "controller-revision-hash": "r1"}},
                    "spec": {"nodeName": node,
                             "containers": [{"name": "slurmd", "image": "slurmd:bench"}]},
                }))
                .expect("pod json");
                pods.create(pp, &pod).await.is_err()
            }
        })
        .buffer_unordered(a.concurrency)
        .filter(|failed| std::future::ready(*failed))
        .count()
        .await;
    let pod_s = t0.elapsed().as_secs_f64();
    assert_eq!(failures, 0, "pod creates failed");
    println!(
        "created {} nodes in {node_s:.1} s ({:.0}/s), {} pods in {pod_s:.1} s ({:.0}/s), concurrency {}",
        a.nodes,
        a.nodes as f64 / node_s,
        a.pods,
        a.pods as f64 / pod_s,
        a.concurrency
    );

    // The observer in a fresh process.
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("exe"));
    cmd.args(["--watch-run", &run, "--kubeconfig"])
        .arg(&a.kubeconfig)
        .args([
            "--nodes",
            &a.nodes.to_string(),
            "--pods",
            &a.pods.to_string(),
        ])
        .args(["--concurrency", &a.concurrency.to_string()]);
    if a.streaming_lists {
        cmd.arg("--streaming-lists");
    }
    let status = cmd.status().expect("child runs");

    if !a.keep {
        let t0 = Instant::now();
        delete_all(&pods, &run, a.concurrency).await;
        delete_all(&nodes, &run, a.concurrency).await;
        println!("deleted everything in {:.1} s", t0.elapsed().as_secs_f64());
    }
    assert!(status.success(), "watch process failed: {status}");
}

async fn watch(a: &Args, run: &str) {
    let config = load_config(Some(&a.kubeconfig)).await.expect("kubeconfig");
    let selector = format!("{LABEL}={run}");
    let mut policy = Policy::default();
    policy.mapping.pod_selector = selector.clone();
    let mut spec = ObserveSpec::from_policy(&policy, &["topology.kubernetes.io/zone"]);
    spec.node_selector = Some(selector.clone());
    spec.namespace = Some(NS.to_owned());
    spec.scale_kinds.clear();
    let observer = Observer::new(
        config.clone(),
        spec,
        ObserverConfig {
            streaming_lists: a.streaming_lists,
            ..ObserverConfig::default()
        },
    )
    .expect("observer");
    let (rss0, _) = rss_mib();
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let t0 = Instant::now();
    let task = tokio::spawn(observer.run(tx));

    let mut events = 0u64;
    let mut first_event: Option<Duration> = None;
    let (mut nodes_done, mut pods_done) = (None, None);
    while nodes_done.is_none() || pods_done.is_none() {
        let Observation { event: e, .. } = rx.recv().await.expect("observer runs");
        events += 1;
        first_event.get_or_insert_with(|| t0.elapsed());
        match e {
            Event::SyncDone {
                domain: Domain::KubeNodes,
            } => nodes_done = Some(t0.elapsed()),
            Event::SyncDone {
                domain: Domain::KubePods,
            } => pods_done = Some(t0.elapsed()),
            _ => {}
        }
    }
    let sync = t0.elapsed();
    let (rss1, hwm1) = rss_mib();
    println!(
        "initial sync ({}): {events} events in {:.2} s = {:.0} events/s; nodes synced at {:.2} s, pods at {:.2} s; first event after {:.0} ms",
        if a.streaming_lists { "streaming lists" } else { "paginated lists, 500/page" },
        sync.as_secs_f64(),
        events as f64 / sync.as_secs_f64(),
        nodes_done.unwrap().as_secs_f64(),
        pods_done.unwrap().as_secs_f64(),
        first_event.unwrap().as_secs_f64() * 1000.0,
    );
    println!(
        "observer process resident memory: {rss0:.1} MiB before, {rss1:.1} MiB after sync (+{:.1} MiB), peak {hwm1:.1} MiB",
        rss1 - rss0
    );

    let c = Client::try_from(config).expect("client");
    let nodes: Api<Node> = Api::all(c.clone());
    let names: Vec<String> = (0..a.nodes).map(|i| format!("{run}-n{i:05}")).collect();

    // Heartbeats: a kubelet's status update on every node; lockstep reads
    // nothing of it, so no event. A final real change marks the end.
    let t0 = Instant::now();
    let pp = PatchParams::default();
    let beat = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
        "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}});
    patch_all(&nodes, &names, a.concurrency, true, &beat, &pp).await;
    let beat2 = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
        "lastHeartbeatTime": "2025-01-01T00:00:10Z", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}});
    // The first round made Ready=True (a change: one event per node); the
    // second only moves the heartbeat.
    let mut ready_events = 0usize;
    while ready_events < a.nodes {
        if let Observation {
            event: Event::KubeNode(n),
            ..
        } = rx.recv().await.expect("observer runs")
        {
            if n.ready == lockstep_schemas::ConditionStatus::True {
                ready_events += 1;
            }
        }
    }
    let t1 = Instant::now();
    patch_all(&nodes, &names, a.concurrency, true, &beat2, &pp).await;
    let marker = &names[0];
    nodes
        .patch(
            marker,
            &pp,
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("cordon marker");
    let mut extra = 0usize;
    loop {
        match rx.recv().await.expect("observer runs").event {
            Event::KubeNode(n) if n.name == *marker && n.unschedulable => break,
            _ => extra += 1,
        }
    }
    println!(
        "heartbeats: Ready=True on {} nodes observed in {:.2} s; then a heartbeat-only update on every node gave {extra} events (want 0), {:.2} s",
        a.nodes,
        t1.duration_since(t0).as_secs_f64(),
        t1.elapsed().as_secs_f64()
    );

    // Update ingestion: a zone label change on every node.
    let t0 = Instant::now();
    let relabel = json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "moved"}}});
    let patching = patch_all(&nodes, &names, a.concurrency, false, &relabel, &pp);
    let counting = async {
        let mut seen = 0usize;
        while seen < a.nodes {
            if let Observation {
                event: Event::KubeNode(n),
                ..
            } = rx.recv().await.expect("observer runs")
            {
                if n.labels
                    .get("topology.kubernetes.io/zone")
                    .map(String::as_str)
                    == Some("moved")
                {
                    seen += 1;
                }
            }
        }
    };
    let (patch_s, ()) = futures::join!(patching, counting);
    let total = t0.elapsed().as_secs_f64();
    println!(
        "updates: {} label changes patched in {patch_s:.2} s, all observed after {total:.2} s ({:.0} events/s end to end)",
        a.nodes,
        a.nodes as f64 / total
    );
    let (rss2, hwm2) = rss_mib();
    println!("observer process resident memory at the end: {rss2:.1} MiB, peak {hwm2:.1} MiB");
    task.abort();
}

/// Deletes every object of the run, one request each (a deletecollection
/// of 20,000 pods runs into the API server's 60 s request timeout).
async fn delete_all<K>(api: &Api<K>, run: &str, concurrency: usize)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let lp = ListParams::default().labels(&format!("{LABEL}={run}"));
    let names: Vec<String> = api
        .list_metadata(&lp)
        .await
        .expect("list for cleanup")
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    stream::iter(names)
        .map(|n| {
            let dp = &dp;
            async move {
                if let Err(e) = api.delete(&n, dp).await {
                    eprintln!("cleanup: delete {n}: {e}");
                }
            }
        })
        .buffer_unordered(concurrency)
        .collect::<()>()
        .await;
}

/// Patches every named node (or its status), bounded concurrency; returns
/// the seconds it took.
async fn patch_all(
    nodes: &Api<Node>,
    names: &[String],
    concurrency: usize,
    status: bool,
    patch: &serde_json::Value,
    pp: &PatchParams,
) -> f64 {
    let t0 = Instant::now();
    stream::iter(names)
        .map(|n| async move {
            let p = Patch::Merge(patch);
            let r = if status {
                nodes.patch_status(n, pp, &p).await
            } else {
                nodes.patch(n, pp, &p).await
            };
            r.unwrap_or_else(|e| panic!("patch {n}: {e}"));
        })
        .buffer_unordered(concurrency)
        .collect::<()>()
        .await;
    t0.elapsed().as_secs_f64()
}
