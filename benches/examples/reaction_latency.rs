//! Reaction latency of the whole loop on the real local stack, for the
//! README: `lockstep run` (release build, leader election on, under its
//! ServiceAccount) between a real Slurm and a real kube-apiserver.
//!
//! - cordon -> DRAIN: the clock starts when the node PATCH is sent to the
//!   API server and stops when slurmrestd shows the Slurm node DRAIN
//!   (polled every 5 ms).
//! - Slurm drain -> pod condition: the clock starts before `scontrol update
//!   state=drain` is spawned and stops when the API server shows the pod's
//!   `SlurmNodeDrained=True` condition (polled every 5 ms).
//!
//! Each trial is undone (uncordon / resume, and both sides seen back)
//! before the next; a drain trial starts after a random pause shorter than
//! the poll interval, so that the trials do not fall into step with the
//! Slurm poller. Run it through `scripts/bench-reaction.sh`, which
//! starts the stack (also a 1,000-node Slurm) and passes the environment:
//!
//! ```sh
//! scripts/bench-reaction.sh            # 200 trials each, 4 and 1,000 nodes
//! ```
//!
//! Arguments: `--help` lists them (trials, nodes, the poll interval, a pool
//! cordoned at once, how lockstep reaches Slurm, its drain reasons).
//! Environment: `SLURM_CONF`, `SLURMRESTD_URL`, `SLURM_JWT_FILE`,
//! `KUBECONFIG` (admin, for the bench), `LOCKSTEP_KUBECONFIG` (lockstep's
//! ServiceAccount).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use lockstep_connectors::slurm::{RestClient, RestConfig, TokenSource};
use lockstep_schemas::SlurmNodeFlag;
use lockstep_testkit::{free_port, temp_dir, NatsCluster, NatsServer};

const NS: &str = "slurm-bench";
const MARK: &str = "lockstep-bench";

/// Reaction latency of the whole loop on the real local stack (run through
/// scripts/bench-reaction.sh, which starts the stack and sets the
/// environment).
#[derive(clap::Parser)]
#[command(name = "reaction_latency")]
struct Args {
    /// Trials of each measurement.
    #[arg(long, default_value_t = 200)]
    trials: usize,
    /// Kubernetes nodes and slurmd pods to create, one per Slurm node (the
    /// Slurm side must have as many).
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// How many of the Slurm nodes have a slurmd; trials rotate over those.
    #[arg(long, default_value_t = 4)]
    slurmd: usize,
    /// The Slurm observer's poll interval.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    poll_ms: u64,
    /// The log on a three-server JetStream cluster, both streams replicated
    /// three times, instead of one nats-server.
    #[arg(long)]
    cluster: bool,
    /// Also cordon the first N nodes at once (a node pool upgraded) and
    /// measure until every one of their Slurm nodes shows DRAIN.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pool: usize,
    /// lockstep reads and writes Slurm through scontrol alone (no
    /// slurmrestd in its configuration).
    #[arg(long, conflicts_with = "nodes_through_scontrol")]
    scontrol: bool,
    /// lockstep lists nodes through scontrol, the rest through slurmrestd
    /// (`[slurm] nodes_through_scontrol`).
    #[arg(long)]
    nodes_through_scontrol: bool,
    /// First watch this many seconds with nothing changing: lockstep's CPU
    /// and slurmctld's time on lockstep's requests while the cluster stands
    /// still (0: none).
    #[arg(long, default_value_t = 0, value_name = "S")]
    quiet_s: u64,
    /// lockstep's drain reasons do not name the Kubernetes node
    /// (`drain.reason_names_nodes = false`), so that the drains of a pool
    /// share a reason and are written together.
    #[arg(long)]
    reasons_without_names: bool,
}

fn args() -> Args {
    let mut a = <Args as clap::Parser>::parse();
    a.slurmd = a.slurmd.min(a.nodes);
    a.pool = a.pool.min(a.nodes);
    a
}

fn env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set (use scripts/bench-reaction.sh)"))
}

/// The lockstep measured: `LOCKSTEP_BENCH_LOCKSTEP` (another build, for a
/// comparison on the same machine), else this build's.
fn lockstep_bin() -> PathBuf {
    std::env::var_os("LOCKSTEP_BENCH_LOCKSTEP").map_or_else(
        || lockstep_benches::sibling_binary("lockstep"),
        PathBuf::from,
    )
}

fn leads(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.write_all(b"GET /status HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"leader\":true")
}

/// A client program of the Slurm under test: up.sh's wrapper (the right
/// version and SLURM_CONF) where env.sh names them, else from PATH.
fn slurm_program(name: &str) -> PathBuf {
    std::env::var_os("LOCKSTEP_SLURM_BIN")
        .map_or_else(|| PathBuf::from(name), |d| Path::new(&d).join(name))
}

fn scontrol(args: &[&str]) {
    let out = Command::new(slurm_program("scontrol"))
        .args(args)
        .env_remove("SLURM_JWT")
        .output()
        .expect("scontrol runs");
    assert!(
        out.status.success(),
        "scontrol {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

fn figures(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pct = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
    println!(
        "{name}: n={} min {:.0} ms, p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        v.len(),
        ms(v[0]),
        ms(pct(0.50)),
        ms(pct(0.90)),
        ms(pct(0.99)),
        ms(v[v.len() - 1]),
    );
}

/// Where to leave the log when a wait times out.
static FAILURE_EXPORT: std::sync::OnceLock<(String, PathBuf)> = std::sync::OnceLock::new();

async fn wait<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t = Instant::now();
    while !f().await {
        if t.elapsed() >= limit {
            if let Some((nats, dir)) = FAILURE_EXPORT.get() {
                let file = dir.join("log-at-failure.jsonl");
                let _ = Command::new(lockstep_bin())
                    .args(["export", "--nats", nats])
                    .arg(&file)
                    .status();
                eprintln!("the log is in {}", file.display());
            }
            panic!("{what}: not within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `kubectl cordon` / `uncordon`.
async fn set_unschedulable(nodes: &Api<Node>, node: &str, on: bool) {
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"unschedulable": on}})),
        )
        .await
        .expect("cordon / uncordon");
}

fn condition_true(pod: &Pod, kind: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == kind && c.status == "True"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let kube_config = lockstep_connectors::kube::load_config(Some(Path::new(&env("KUBECONFIG"))))
        .await
        .expect("admin kubeconfig");
    let client = kube::Client::try_from(kube_config).expect("kube client");
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // The bench reads Slurm as another user than lockstep (root), so that
    // slurmctld's statistics by user tell its time on lockstep's requests
    // from its time on the bench's own polling.
    let reader = temp_dir("reaction-latency-reader").join("jwt");
    std::fs::write(&reader, token_for(READER)).expect("writing the bench's token");
    let rest = RestClient::new(RestConfig::new(
        env("SLURMRESTD_URL"),
        READER,
        TokenSource::File(reader),
    ))
    .expect("slurmrestd client");

    // The Kubernetes side: one node and one slurmd pod per Slurm node.
    eprintln!("creating {} nodes and pods", a.nodes);
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NS}})).unwrap();
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await;
    let lp = ListParams::default().labels(&format!("{MARK}=true"));
    let _ = pods
        .delete_collection(
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
            &lp,
        )
        .await;
    let _ = nodes.delete_collection(&DeleteParams::default(), &lp).await;
    let pool_size = a.pool;
    futures::stream::iter(1..=a.nodes)
        .map(|i| {
            let (nodes, pods) = (nodes.clone(), pods.clone());
            async move {
                let pool = if i <= pool_size { "a" } else { "b" };
                let node: Node = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("bench-k{i}"), "labels": {MARK: "true", "pool": pool}},
                }))
                .unwrap();
                nodes.create(&PostParams::default(), &node).await?;
                // Ready, as a kubelet would report it (no kubelet runs here;
                // a node without Ready is drained after the grace period).
                nodes
                    .patch_status(
                        &format!("bench-k{i}"),
                        &PatchParams::default(),
                        &Patch::Merge(serde_json::json!({"status": {"conditions": [{
                            "type": "Ready", "status": "True", "reason": "KubeletReady",
                        }]}})),
                    )
                    .await?;
                let pod: Pod = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("ls-n{i}"), "namespace": NS,
                        "labels": {"app.kubernetes.io/component": "slurmd", MARK: "true"}},
                    "spec": {"nodeName": format!("bench-k{i}"), "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "slurmd", "image": "slurmd:bench"}]},
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await?;
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("creating nodes and pods");
    for i in 1..=a.slurmd {
        let _ = Command::new(slurm_program("scontrol"))
            .args(["update", &format!("nodename=ls-n{i}"), "state=resume"])
            .env_remove("SLURM_JWT")
            .output();
    }

    // lockstep, as deployed: NATS log, leader election, its ServiceAccount.
    let (_single, _cluster, nats_url, replicas) = if a.cluster {
        let c = NatsCluster::start();
        let url = c.url();
        (None, Some(c), url, 3)
    } else {
        let s = NatsServer::start();
        let url = s.url();
        (Some(s), None, url, 1)
    };
    let dir = temp_dir("reaction-latency");
    let port = free_port();
    let mut policy = serde_json::json!({"health": {"unhealthy_taint": null}});
    if a.reasons_without_names {
        policy["drain"] = serde_json::json!({"reason_names_nodes": false});
    }
    std::fs::write(dir.join("policy.json"), policy.to_string()).unwrap();
    std::fs::write(
        dir.join("lockstep.toml"),
        format!(
            "data_dir = \"data\"\npolicy_file = \"policy.json\"\n\
             [log]\nnats_url = \"{nats}\"\nreplicas = {replicas}\n\
             [telemetry]\nlisten = \"127.0.0.1:{port}\"\n\
             [kubernetes]\nkubeconfig = \"{kc}\"\n\
             [slurm]\n{rest}slurm_conf = \"{conf}\"\npoll_interval_ms = {poll}\n\
             [leader_election]\nnamespace = \"lockstep-system\"\nlease_name = \"bench\"\n",
            nats = nats_url,
            kc = env("LOCKSTEP_KUBECONFIG"),
            rest = if a.scontrol {
                String::new()
            } else {
                format!(
                    "rest_url = \"{}\"\njwt_file = \"{}\"\nnodes_through_scontrol = {}\n",
                    env("SLURMRESTD_URL"),
                    env("SLURM_JWT_FILE"),
                    a.nodes_through_scontrol,
                )
            },
            conf = env("SLURM_CONF"),
            poll = a.poll_ms,
        ),
    )
    .unwrap();
    // This Slurm's client programs first (scontrol of its version).
    let path = match (std::env::var("LOCKSTEP_SLURM_BIN"), std::env::var("PATH")) {
        (Ok(bin), Ok(path)) => format!("{bin}:{path}"),
        (_, path) => path.unwrap_or_default(),
    };
    let child = Command::new(lockstep_bin())
        .args(["run", "--config"])
        .arg(dir.join("lockstep.toml"))
        .env_remove("SLURM_JWT")
        .env("PATH", path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("run.log")).unwrap())
        .spawn()
        .expect("lockstep runs (cargo build --release --bin lockstep)");
    let lockstep_pid = child.id();
    let lockstep = Kill(child);
    let _ = FAILURE_EXPORT.set((nats_url.clone(), dir.clone()));
    eprintln!("lockstep log: {}", dir.join("run.log").display());
    wait("lockstep leads", Duration::from_secs(60), || async {
        leads(port)
    })
    .await;
    // Let the first sync and its actions settle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let slurmctld_pid = slurmctld_pid();
    if a.quiet_s > 0 {
        quiet_window(a.quiet_s, lockstep_pid, slurmctld_pid).await;
    }
    let measured = Usage::now(lockstep_pid, slurmctld_pid);

    let pool_listings = if a.pool > 0 {
        pool_cordon(&a, &nodes, &nats_url).await
    } else {
        0
    };

    let mut cordon = Vec::with_capacity(a.trials);
    eprintln!("{} trials: kubectl cordon -> DRAIN in slurmctld", a.trials);
    for t in 0..a.trials {
        let i = t % a.slurmd + 1;
        let (k, s) = (format!("bench-k{i}"), format!("ls-n{i}"));
        let drained = |want: bool| {
            let (rest, s) = (rest.clone(), s.clone());
            async move {
                rest.node(&s)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|n| n.flags.contains(&SlurmNodeFlag::Drain) == want)
            }
        };
        let started = Instant::now();
        set_unschedulable(&nodes, &k, true).await;
        wait("DRAIN in slurmctld", Duration::from_secs(30), || {
            drained(true)
        })
        .await;
        cordon.push(started.elapsed());
        set_unschedulable(&nodes, &k, false).await;
        wait("resumed in slurmctld", Duration::from_secs(30), || {
            drained(false)
        })
        .await;
    }
    if !cordon.is_empty() {
        figures(
            &format!(
                "cordon -> DRAIN visible in slurmctld ({} nodes, log {})",
                a.nodes,
                if a.cluster { "R3" } else { "R1" }
            ),
            cordon,
        );
    }

    // A random pause before each drain: without it every trial would start
    // right after the poll that saw the previous resume, in lockstep with
    // the poller, and measure a full poll interval each time.
    let mut rng = lockstep_testkit::gen::Rng::new(42);
    let mut jitter = move || Duration::from_millis(rng.below(a.poll_ms.max(1)));
    let mut drain = Vec::with_capacity(a.trials);
    let mut drain_walls = Vec::with_capacity(a.trials);
    let drain_log =
        lockstep_store::EventLog::connect_nats(&nats_url, &lockstep_store::StreamLimits::default())
            .await
            .expect("the log");
    let drain_log_from = drain_log.head().await.expect("head") + 1;
    eprintln!(
        "{} trials: scontrol drain -> pod condition in the API server",
        a.trials
    );
    for t in 0..a.trials {
        let i = t % a.slurmd + 1;
        let s = format!("ls-n{i}");
        let shown = |want: bool| {
            let (pods, s) = (pods.clone(), s.clone());
            async move {
                pods.get(&s)
                    .await
                    .is_ok_and(|p| condition_true(&p, "SlurmNodeDrained") == want)
            }
        };
        tokio::time::sleep(jitter()).await;
        let started = Instant::now();
        let wall = wall_ms();
        scontrol(&[
            "update",
            &format!("nodename={s}"),
            "state=drain",
            "reason=bench: drain",
        ]);
        let updated = wall_ms();
        wait(
            "pod condition SlurmNodeDrained=True",
            Duration::from_secs(30),
            || shown(true),
        )
        .await;
        drain.push(started.elapsed());
        drain_walls.push(DrainTrial {
            node: s.clone(),
            started: wall,
            updated,
            seen: wall_ms(),
        });
        scontrol(&["update", &format!("nodename={s}"), "state=resume"]);
        wait("pod condition cleared", Duration::from_secs(30), || {
            shown(false)
        })
        .await;
    }
    if !drain.is_empty() {
        figures(
            &format!(
                "Slurm drain -> pod condition visible in the API ({} nodes, poll {} ms, log {})",
                a.nodes,
                a.poll_ms,
                if a.cluster { "R3" } else { "R1" }
            ),
            drain,
        );
        drain_breakdown(&drain_log, drain_log_from, &drain_walls).await;
    }

    let used = measured.since(lockstep_pid, slurmctld_pid);
    let wall = used.wall_s;
    println!(
        "over the {wall:.0} s measured: lockstep (with the scontrol it runs) used {:.1} s of CPU ({:.1}% of one core), peak resident {} MiB; slurmctld {:.1} s ({:.1}%)",
        used.lockstep_cpu_s,
        used.lockstep_cpu_s / wall * 100.0,
        peak_rss_kib(lockstep_pid) / 1024,
        used.slurmctld_cpu_s,
        used.slurmctld_cpu_s / wall * 100.0,
    );
    // root: lockstep's requests through slurmrestd and its scontrol calls,
    // and the bench's own scontrol drains and resumes (two per drain trial)
    // and its listings of the pool.
    let (root, reader) = (used.root, used.reader);
    println!(
        "slurmctld's time on requests over the {wall:.0} s: root (lockstep, and the bench's {} scontrol writes and {pool_listings} listings of the pool) {} RPCs, {:.1} s ({:.2}% of the wall time); the bench's reads ({READER}) {} RPCs, {:.1} s ({:.2}%)",
        2 * a.trials,
        root.0,
        root.1,
        root.1 / wall * 100.0,
        reader.0,
        reader.1,
        reader.1 / wall * 100.0,
    );

    // Stop lockstep before the cleanup (deleted pods would drain their
    // Slurm nodes) and before its directory goes.
    drop(lockstep);
    let _ = pods
        .delete_collection(
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
            &lp,
        )
        .await;
    let _ = nodes.delete_collection(&DeleteParams::default(), &lp).await;
    // lockstep's log outlives the run, for a look at where the time went.
    let kept = std::env::temp_dir().join("lockstep-reaction-latency-run.log");
    if std::fs::copy(dir.join("run.log"), &kept).is_ok() {
        eprintln!("lockstep's log: {}", kept.display());
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The Slurm user the bench reads as (lockstep's token is root's).
const READER: &str = "nobody";

/// What lockstep (with the processes it runs) and slurmctld have used so
/// far: CPU seconds, and slurmctld's RPCs and time on root's requests and
/// on [`READER`]'s ([`rpcs_of`]); or, from [`Usage::since`], what they used
/// in between.
struct Usage {
    at: Instant,
    wall_s: f64,
    lockstep_cpu_s: f64,
    slurmctld_cpu_s: f64,
    root: (u64, f64),
    reader: (u64, f64),
}

impl Usage {
    fn now(lockstep_pid: u32, slurmctld_pid: u32) -> Self {
        // One `sdiag` for both users: it is an RPC of root's itself.
        let stats = sdiag();
        Self {
            at: Instant::now(),
            wall_s: 0.0,
            lockstep_cpu_s: cpu_seconds_with_children(lockstep_pid),
            slurmctld_cpu_s: cpu_seconds(slurmctld_pid),
            root: rpcs_of(&stats, "root"),
            reader: rpcs_of(&stats, READER),
        }
    }

    /// What was used since `self` was taken.
    fn since(&self, lockstep_pid: u32, slurmctld_pid: u32) -> Self {
        let now = Self::now(lockstep_pid, slurmctld_pid);
        Self {
            at: self.at,
            wall_s: self.at.elapsed().as_secs_f64(),
            lockstep_cpu_s: now.lockstep_cpu_s - self.lockstep_cpu_s,
            slurmctld_cpu_s: now.slurmctld_cpu_s - self.slurmctld_cpu_s,
            root: (now.root.0 - self.root.0, now.root.1 - self.root.1),
            reader: (now.reader.0 - self.reader.0, now.reader.1 - self.reader.1),
        }
    }
}

/// `secs` with nothing changing: lockstep's CPU, slurmctld's, and
/// slurmctld's time on root's requests, which are lockstep's alone here.
async fn quiet_window(secs: u64, lockstep_pid: u32, slurmctld_pid: u32) {
    eprintln!("{secs} s with nothing changing");
    let start = Usage::now(lockstep_pid, slurmctld_pid);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let used = start.since(lockstep_pid, slurmctld_pid);
    let wall = used.wall_s;
    let (rpcs, on_root) = used.root;
    println!(
        "nothing changing, over {wall:.0} s: lockstep (with the scontrol it runs) used {:.2} s of CPU ({:.2}% of one core); slurmctld {:.2} s ({:.2}%), its time on lockstep's requests {rpcs} RPCs, {on_root:.3} s ({:.2}% of the wall time)",
        used.lockstep_cpu_s,
        used.lockstep_cpu_s / wall * 100.0,
        used.slurmctld_cpu_s,
        used.slurmctld_cpu_s / wall * 100.0,
        on_root / wall * 100.0,
    );
}

/// A slurmrestd token for `user` (`scontrol token`, as root).
fn token_for(user: &str) -> String {
    let out = Command::new(slurm_program("scontrol"))
        .args(["token", &format!("username={user}"), "lifespan=86400"])
        .env_remove("SLURM_JWT")
        .output()
        .expect("scontrol runs");
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim().strip_prefix("SLURM_JWT=") {
        Some(token) if out.status.success() => token.to_owned(),
        _ => panic!(
            "scontrol token username={user}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn sdiag() -> String {
    let out = Command::new(slurm_program("sdiag"))
        .env_remove("SLURM_JWT")
        .output()
        .expect("sdiag runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// From `sdiag`'s output `text`, its statistics by user: the RPCs
/// slurmctld has served for `user`, and the time it spent on them (the
/// handlers' time, lock waits included, so at most its CPU time on them),
/// in seconds.
fn rpcs_of(text: &str, user: &str) -> (u64, f64) {
    let field = |line: &str, name: &str| -> u64 {
        line.split(name)
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map_or(0, |n| n.parse().expect("a number"))
    };
    text.lines()
        .skip_while(|l| !l.contains("statistics by user"))
        .find(|l| l.split_whitespace().next() == Some(user))
        .map_or((0, 0.0), |l| {
            (field(l, "count:"), field(l, "total_time:") as f64 / 1e6)
        })
}

/// `sdiag`'s count of the RPCs of `kind` slurmctld has served, from its
/// output `text`.
fn rpc_count(text: &str, kind: &str) -> u64 {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(kind))
        .and_then(|l| l.split("count:").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .map_or(0, |n| n.parse().expect("a count"))
}

/// The node reads and node writes slurmctld has served (one `sdiag`).
fn node_rpcs() -> (u64, u64) {
    let text = sdiag();
    let count = |kind| rpc_count(&text, kind);
    (
        count("REQUEST_NODE_INFO") + count("REQUEST_NODE_INFO_SINGLE"),
        count("REQUEST_UPDATE_NODE"),
    )
}

/// Now, in ms since the Unix epoch (the log's clock is this machine's).
fn wall_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.expect("after the epoch").as_millis() as u64
}

/// One Slurm drain trial, by the wall clock (ms since the epoch).
struct DrainTrial {
    node: String,
    /// `scontrol update state=drain` spawned.
    started: u64,
    /// It returned: slurmctld has the drain.
    updated: u64,
    /// The bench saw the pod condition.
    seen: u64,
}

/// The log's records from `from` up to its head as it is now.
async fn records_from(
    log: &lockstep_store::EventLog,
    from: u64,
) -> Vec<lockstep_schemas::EventRecord> {
    let head = log.head().await.expect("head");
    let mut all = Vec::new();
    let mut next = from;
    while next <= head {
        let records = log
            .read(next, 4096, Duration::from_secs(1))
            .await
            .expect("read");
        let Some(last) = records.last() else { break };
        next = last.seq + 1;
        all.extend(records);
    }
    all
}

/// Where each drain trial's time went, from lockstep's log: scontrol's
/// update -> the poll that observed the drain (`observed_ms`) -> its
/// append -> the pod condition's outcome appended (the reducer, the
/// action, the PATCH) -> the bench's GET that saw it.
async fn drain_breakdown(log: &lockstep_store::EventLog, from: u64, trials: &[DrainTrial]) {
    use lockstep_schemas::{Action, ConditionStatus, Event};
    // The first observation of each trial's drain: (observed, appended, seq).
    let mut observed: Vec<Option<(u64, u64, u64)>> = vec![None; trials.len()];
    let mut outcome_at = std::collections::HashMap::new();
    for r in records_from(log, from).await {
        match &r.envelope.event {
            Event::SlurmNode(n) if n.flags.contains(&SlurmNodeFlag::Drain) => {
                let k = trials
                    .iter()
                    .position(|t| t.node == n.name && (t.started..=t.seen).contains(&r.time_ms));
                if let Some(k) = k {
                    observed[k].get_or_insert((r.envelope.observed_ms, r.time_ms, r.seq));
                }
            }
            Event::ActionOutcome(o) => {
                outcome_at.entry(o.action_id.clone()).or_insert(r.time_ms);
            }
            _ => {}
        }
    }
    let actions = log.actions().await.expect("actions");
    let mut parts: [Vec<Duration>; 5] = Default::default();
    for (t, seen) in trials.iter().zip(&observed) {
        let Some((obs, appended, seq)) = *seen else {
            continue;
        };
        let condition = actions.iter().find(|i| {
            i.seq >= seq
                && matches!(&i.action, Action::KubeSetPodCondition { pod, condition, .. }
                    if *pod == t.node
                        && condition.type_ == "SlurmNodeDrained"
                        && condition.status == ConditionStatus::True)
        });
        let Some(done) = condition.and_then(|i| outcome_at.get(&i.id)) else {
            continue;
        };
        let ms = |a: u64, b: u64| Duration::from_millis(b.saturating_sub(a));
        parts[0].push(ms(t.started, t.updated));
        parts[1].push(ms(t.updated, obs));
        parts[2].push(ms(obs, appended));
        parts[3].push(ms(appended, *done));
        parts[4].push(ms(*done, t.seen));
    }
    let names = [
        "drain trials: scontrol update spawned -> returned",
        "drain trials: scontrol returned -> the poll that observed the drain",
        "drain trials: observed -> appended to the log",
        "drain trials: appended -> the pod condition's outcome in the log",
        "drain trials: the outcome in the log -> seen by the bench",
    ];
    for (name, v) in names.into_iter().zip(parts) {
        if !v.is_empty() {
            figures(name, v);
        }
    }
}

/// `kubectl cordon -l pool=a` (a Kubernetes upgrade of a node pool): the
/// first `a.pool` nodes cordoned at once, one PATCH each, 16 at a time. The
/// clock of each node starts when its PATCH returned and stops at the first
/// listing of the drained Slurm nodes (`sinfo -N -t drain`, as root, one
/// after the other) that names its Slurm node; then the pool is uncordoned
/// the same way, and watched with `scontrol show node -o` (which says
/// which nodes slurmctld holds DOWN).
/// slurmctld's node writes during it (`sdiag`), and the log: one drain and
/// one outcome per node, nothing for the others.
async fn pool_cordon(a: &Args, nodes: &Api<Node>, nats_url: &str) -> u64 {
    use lockstep_schemas::{Action, Event, OutcomeResult};
    let n = a.pool;
    let index = |slurm: &str| -> Option<usize> {
        let i: usize = slurm.strip_prefix("ls-n")?.parse().ok()?;
        (1..=n).contains(&i).then(|| i - 1)
    };
    // Slurm as it shows the pool: which nodes are drained, and which down.
    // `scontrol show node -o` answers in some 50 ms at 10,000 nodes (on a
    // slurm.conf of ranges); slurmrestd's listing takes seconds and a core.
    let sc =
        lockstep_connectors::slurm::Scontrol::new(lockstep_connectors::slurm::ScontrolConfig {
            program: slurm_program("scontrol"),
            ..Default::default()
        });
    let drained = || async {
        let listed = sc.nodes().await.ok()?;
        Some(
            listed
                .into_iter()
                .filter_map(|s| {
                    Some((
                        index(&s.name)?,
                        s.flags.contains(&SlurmNodeFlag::Drain),
                        s.state == lockstep_schemas::SlurmBaseState::Down,
                    ))
                })
                .collect::<Vec<_>>(),
        )
    };
    // The nodes Slurm shows drained (DRAIN, DRAINING or DRAINED, DOWN or
    // not), by index in the pool. sinfo filters them out of slurmctld's
    // listing itself and prints their names alone: some 5 ms of CPU at
    // 10,000 nodes, where `scontrol show node -o` prints every field of
    // every node (5 MB, 40-90 ms), on the cores the API server needs for
    // the PATCHes being measured.
    let drained_now = || async {
        let out = tokio::process::Command::new(slurm_program("sinfo"))
            .args(["--noheader", "--Node", "--states=drain", "--format=%N"])
            .env_remove("SLURM_JWT")
            .output()
            .await
            .ok()
            .filter(|o| o.status.success())?;
        Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| index(l.trim()))
                .collect::<Vec<_>>(),
        )
    };
    let toggle = |on: bool| async move {
        let started = Instant::now();
        let wall = std::time::SystemTime::now();
        let done: Vec<(usize, Duration)> = futures::stream::iter(0..n)
            .map(|k| async move {
                set_unschedulable(nodes, &format!("bench-k{}", k + 1), on).await;
                (k, started.elapsed())
            })
            .buffer_unordered(16)
            .collect()
            .await;
        let mut at = vec![Duration::ZERO; n];
        for (k, t) in done {
            at[k] = t;
        }
        (started, wall, at)
    };
    let log =
        lockstep_store::EventLog::connect_nats(nats_url, &lockstep_store::StreamLimits::default())
            .await
            .expect("the log");
    let (seq_before, actions_before) = (
        log.head().await.expect("head"),
        log.actions().await.expect("actions").len(),
    );

    eprintln!("cordoning a pool of {n} nodes at once");
    let (reads_before, writes_before) = node_rpcs();
    let (started, started_wall, patched) = toggle(true).await;
    let patched_all = started.elapsed();
    let mut seen: Vec<Option<Duration>> = vec![None; n];
    let mut listings = 0u64;
    let mut listing_ms = Vec::new();
    while seen.iter().any(Option::is_none) {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the pool not drained within 300 s: {} of {n}",
            seen.iter().flatten().count()
        );
        let t = Instant::now();
        if let Some(shown) = drained_now().await {
            listings += 1;
            listing_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let at = started.elapsed();
            for k in shown {
                seen[k].get_or_insert(at);
            }
        }
        // A listing costs slurmctld some 9 ms at 10,000 nodes.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (reads_after, writes_after) = node_rpcs();
    let last = seen.iter().flatten().max().copied().unwrap_or_default();
    let per_node: Vec<Duration> = seen
        .iter()
        .zip(&patched)
        .map(|(s, p)| s.unwrap().saturating_sub(*p))
        .collect();
    listing_ms.sort_by(f64::total_cmp);
    println!(
        "pool of {n} cordoned at once ({} nodes in all, log {}): PATCHes done in {:.0} ms; every Slurm node DRAIN {:.0} ms after the first PATCH; slurmctld served {} node writes and {} node reads meanwhile ({} of them the bench's own listings, median {:.0} ms each)",
        a.nodes,
        if a.cluster { "R3" } else { "R1" },
        patched_all.as_secs_f64() * 1e3,
        last.as_secs_f64() * 1e3,
        writes_after - writes_before,
        reads_after - reads_before,
        listings,
        listing_ms.get(listing_ms.len() / 2).copied().unwrap_or(f64::NAN),
    );
    figures(
        &format!("pool of {n}: its PATCH -> DRAIN shown, per node"),
        per_node,
    );

    // Nothing lost or doubled: one drain per pool node, each with one
    // outcome, and no drain of another node.
    let actions = log.actions().await.expect("actions");
    let mut drains = vec![0usize; n];
    let mut ids = std::collections::BTreeMap::new();
    for issued in &actions[actions_before..] {
        if let Action::SlurmDrain { node, .. } = &issued.action {
            let k = index(node).unwrap_or_else(|| panic!("a drain of {node}, outside the pool"));
            drains[k] += 1;
            ids.insert(issued.id.clone(), k);
        }
    }
    // Where each node's time went, by the log's clock (the same machine's):
    // its PATCH returned -> the cordon in the log (the API server's watch,
    // lockstep's observer, the append) -> the drain's outcome in the log
    // (the reducer, publishing the action, the Slurm actuator's reads and
    // write, the outcome's append).
    let patched_ms: Vec<Option<u64>> = patched
        .iter()
        .map(|p| {
            let at = (started_wall + *p).duration_since(std::time::UNIX_EPOCH);
            Some(at.expect("after the epoch").as_millis() as u64)
        })
        .collect();
    let mut cordon_logged: Vec<Option<u64>> = vec![None; n];
    let mut drain_done: Vec<Option<u64>> = vec![None; n];
    let mut outcomes = std::collections::BTreeMap::new();
    for r in records_from(&log, seq_before + 1).await {
        if let Event::KubeNode(node) = &r.envelope.event {
            let k = node
                .name
                .strip_prefix("bench-k")
                .and_then(|i| i.parse::<usize>().ok())
                .filter(|i| (1..=n).contains(i));
            if let (Some(k), true) = (k, node.unschedulable) {
                cordon_logged[k - 1].get_or_insert(r.time_ms);
            }
        }
        if let Event::ActionOutcome(o) = &r.envelope.event {
            if let Some(&k) = ids.get(&o.action_id) {
                drain_done[k].get_or_insert(r.time_ms);
                *outcomes.entry(o.action_id.clone()).or_insert(0usize) += 1;
                assert!(
                    matches!(o.result, OutcomeResult::Succeeded),
                    "{:?}",
                    o.result
                );
            }
        }
    }
    let span = |from: &[Option<u64>], to: &[Option<u64>]| -> Vec<Duration> {
        let ms = |(a, b): (&Option<u64>, &Option<u64>)| Some((*b)?.saturating_sub((*a)?));
        from.iter()
            .zip(to)
            .filter_map(ms)
            .map(Duration::from_millis)
            .collect()
    };
    figures(
        &format!("pool of {n}: its PATCH returned -> the cordon in lockstep's log, per node"),
        span(&patched_ms, &cordon_logged),
    );
    figures(
        &format!("pool of {n}: the cordon in the log -> the drain's outcome in the log, per node"),
        span(&cordon_logged, &drain_done),
    );
    figures(
        &format!("pool of {n}: its PATCH returned -> the drain's outcome in the log, per node"),
        span(&patched_ms, &drain_done),
    );
    let first_patch = started_wall
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as u64;
    if let Some(last) = drain_done.iter().flatten().max() {
        println!(
            "pool of {n}: the last drain's outcome in the log {} ms after the first PATCH was sent",
            last.saturating_sub(first_patch)
        );
    }
    let doubled = drains.iter().filter(|d| **d > 1).count();
    let lost = drains.iter().filter(|d| **d == 0).count();
    let outcomes_doubled = outcomes.values().filter(|c| **c > 1).count();
    println!(
        "pool of {n}: {} drains issued, {lost} nodes without one, {doubled} with more than one; {} outcomes, {outcomes_doubled} actions with more than one",
        ids.len(),
        outcomes.len(),
    );
    assert_eq!((lost, doubled, outcomes_doubled), (0, 0, 0));
    assert_eq!(outcomes.len(), ids.len(), "an action without its outcome");

    // Most of the bench's Slurm nodes have no slurmd: slurmctld sets them
    // DOWN (not responding) a while after it starts, and a DOWN lockstep did
    // not set is Slurm's to lift, so lockstep leaves their drain for when
    // they answer again. The resume is measured on the others.
    eprintln!("uncordoning the pool");
    let (started, _, _) = toggle(false).await;
    let held = loop {
        if let Some(shown) = drained().await {
            listings += 1;
            if shown.len() == n && shown.iter().all(|(_, d, down)| !d || *down) {
                break shown.iter().filter(|(_, d, _)| *d).count();
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the pool not resumed within 300 s"
        );
        // A listing costs slurmctld some 9 ms at 10,000 nodes.
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "pool of {n} uncordoned at once: every Slurm node resumed {:.0} ms after the first PATCH, but {held} that slurmctld holds DOWN (no slurmd answers for them)",
        started.elapsed().as_secs_f64() * 1e3
    );
    listings
}

/// Fields of `/proc/PID/stat` after the command's closing parenthesis
/// (field 3, the state, first).
fn stat_fields(pid: u32) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Clock ticks in field `i` (numbered as in proc(5)) of `fields`.
fn ticks(fields: &[String], i: usize) -> f64 {
    fields
        .get(i - 3)
        .and_then(|f| f.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// User and system CPU time of process `pid`, in seconds (`/proc/PID/stat`:
/// utime and stime, fields 14 and 15; USER_HZ is 100 on Linux).
fn cpu_seconds(pid: u32) -> f64 {
    let f = stat_fields(pid);
    (ticks(&f, 14) + ticks(&f, 15)) / 100.0
}

/// CPU time of process `pid` and of the processes it started: those that
/// ended and were waited for (cutime and cstime, fields 16 and 17), and
/// its children still running, such as lockstep's long-lived scontrol
/// (with what their own ended children used).
fn cpu_seconds_with_children(pid: u32) -> f64 {
    let f = stat_fields(pid);
    let mut ticks_sum = ticks(&f, 14) + ticks(&f, 15) + ticks(&f, 16) + ticks(&f, 17);
    let parent = pid.to_string();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let c = stat_fields(child);
        // Field 4: the parent's pid.
        if c.get(1) == Some(&parent) {
            ticks_sum += ticks(&c, 14) + ticks(&c, 15) + ticks(&c, 16) + ticks(&c, 17);
        }
    }
    ticks_sum / 100.0
}

/// Peak resident memory of process `pid` (`VmHWM`), KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// slurmctld's pid, from the pid file beside `SLURM_CONF` (up.sh's layout).
fn slurmctld_pid() -> u32 {
    let conf = PathBuf::from(env("SLURM_CONF"));
    let file = conf
        .parent()
        .expect("SLURM_CONF in a state directory")
        .join("run/slurmctld.pid");
    std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
        .trim()
        .parse()
        .expect("a pid")
}
