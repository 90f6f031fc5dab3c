//! The real node's figures: cordon trials, their percentiles and split,
//! lockstep's memory, appended to the figures file.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use lockstep_schemas::{Event, EventRecord};
use serde_json::{json, Value};

use crate::common::node::{Bed, LOCKSTEP_NS, NODE_NAME, ROOT};
use crate::scenario::MINUTE;

/// A figure for the report: printed and appended to the figures file.
pub fn figure(line: &str) {
    eprintln!("FIGURE {line}");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(PathBuf::from(ROOT).join("logs/figures.txt"))
    {
        let _ = writeln!(f, "{line}");
    }
}

pub fn percentiles(mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pct = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
    format!(
        "n={} min {:.0} ms, p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        v.len(),
        ms(v[0]),
        ms(pct(0.50)),
        ms(pct(0.90)),
        ms(pct(0.99)),
        ms(v[v.len() - 1])
    )
}

/// The working set and the RSS of each container of lockstep's pods, from
/// the kubelet's summary API (the working set is what `kubectl top` and the
/// eviction manager use: the cgroup's usage minus inactive file pages, so it
/// also counts the page cache of sled's files that was used lately).
pub fn lockstep_memory(b: &Bed) -> Vec<(String, String, u64, u64)> {
    let raw = b.kubectl(
        &[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{NODE_NAME}/proxy/stats/summary"),
        ],
        None,
    );
    let summary: Value = serde_json::from_str(&raw).unwrap();
    let mut out = Vec::new();
    for pod in summary["pods"].as_array().into_iter().flatten() {
        if pod["podRef"]["namespace"] != LOCKSTEP_NS {
            continue;
        }
        for c in pod["containers"].as_array().into_iter().flatten() {
            out.push((
                pod["podRef"]["name"].as_str().unwrap_or("").to_owned(),
                c["name"].as_str().unwrap_or("").to_owned(),
                c["memory"]["workingSetBytes"].as_u64().unwrap_or(0),
                c["memory"]["rssBytes"].as_u64().unwrap_or(0),
            ));
        }
    }
    out
}

/// Cordon / uncordon through the API, timed from the PATCH.
pub fn set_unschedulable(b: &Bed, on: bool) {
    b.kubectl(
        &[
            "patch",
            "node",
            NODE_NAME,
            "--type=merge",
            "-p",
            &json!({"spec": {"unschedulable": on}}).to_string(),
        ],
        None,
    );
}

/// `trials` cordons of the node, each followed by an uncordon: the time
/// from just before the PATCH to DRAIN (with lockstep's reason) of every
/// Slurm node in `nodes`, and to the first of them, as slurmrestd shows it;
/// and when each PATCH was sent (ms since the epoch, for `latency_split`).
pub fn cordon_trials(
    b: &Bed,
    nodes: &[&str],
    trials: usize,
) -> (Vec<Duration>, Vec<Duration>, Vec<u64>) {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams};
    use lockstep_connectors::slurm::{RestClient, RestConfig, TokenSource};
    use lockstep_schemas::SlurmNodeFlag;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let config = lockstep_connectors::kube::load_config(Some(&b.kubeconfig))
            .await
            .unwrap();
        let api: Api<Node> = Api::all(kube::Client::try_from(config).unwrap());
        let rest = RestClient::new(RestConfig::new(
            b.slurm["SLURMRESTD_URL"].clone(),
            b.slurm.get("SLURM_JWT_USER").map_or("root", String::as_str),
            TokenSource::File(b.slurm["SLURM_JWT_FILE"].clone().into()),
        ))
        .unwrap();
        let drained = |n: &str| {
            let (rest, n) = (rest.clone(), n.to_owned());
            async move {
                rest.node(&n).await.ok().flatten().is_some_and(|n| {
                    n.flags.contains(&SlurmNodeFlag::Drain)
                        && n.reason
                            .as_deref()
                            .is_some_and(|r| r.starts_with("lockstep:"))
                })
            }
        };
        let set = |on: bool| {
            let api = api.clone();
            async move {
                api.patch(
                    NODE_NAME,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"unschedulable": on}})),
                )
                .await
                .unwrap();
            }
        };
        let (mut all, mut first, mut sent) = (Vec::new(), Vec::new(), Vec::new());
        for trial in 0..trials {
            // A settled state first: lockstep holds the resume of the last
            // trial in flight until a Slurm poll (200 ms here) confirms it,
            // and a new drain of the same node waits for it (one action in
            // flight per target). A real cordon does not come 200 ms after
            // an uncordon; back-to-back trials would measure that wait.
            tokio::time::sleep(Duration::from_secs(1)).await;
            sent.push(epoch_ms());
            let t = Instant::now();
            set(true).await;
            let mut seen_first = None;
            loop {
                let mut count = 0;
                for n in nodes {
                    if drained(n).await {
                        count += 1;
                    }
                }
                if count > 0 && seen_first.is_none() {
                    seen_first = Some(t.elapsed());
                }
                if count == nodes.len() {
                    break;
                }
                assert!(
                    t.elapsed() < MINUTE,
                    "trial {trial}: not all drained within a minute"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            all.push(t.elapsed());
            first.push(seen_first.unwrap());
            set(false).await;
            let t = Instant::now();
            for n in nodes {
                while drained(n).await {
                    assert!(
                        t.elapsed() < MINUTE,
                        "trial {trial}: {n} not resumed within a minute"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        (all, first, sent)
    })
}

pub fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Where the time of a cordon goes, from the log (append times and the
/// observers' own times are this host's clock, as is `sent`): PATCH sent ->
/// seen by lockstep's Kubernetes observer -> appended to the log -> the last
/// drain's outcome appended (the reducer, the action, scontrol in the pod).
pub fn latency_split(records: &[EventRecord], sent: &[u64]) -> String {
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let (mut observed, mut appended, mut drained) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &t) in sent.iter().enumerate() {
        let end = sent.get(i + 1).copied().unwrap_or(u64::MAX);
        let Some(cordon) = records.iter().find(|r| {
            r.time_ms >= t
                && r.time_ms < end
                && matches!(&r.envelope.event, Event::KubeNode(n) if n.name == NODE_NAME && n.unschedulable)
        }) else {
            continue;
        };
        let last_drain = records
            .iter()
            .filter(|r| r.seq > cordon.seq && r.time_ms < end)
            .filter(|r| matches!(&r.envelope.event, Event::ActionOutcome(o) if o.kind.name() == "slurm_drain"))
            .map(|r| r.time_ms)
            .max();
        observed.push(cordon.envelope.observed_ms.saturating_sub(t));
        appended.push(cordon.time_ms.saturating_sub(cordon.envelope.observed_ms));
        if let Some(d) = last_drain {
            drained.push(d.saturating_sub(cordon.time_ms));
        }
    }
    format!(
        "medians over {} trials: PATCH -> observed {} ms, observed -> in the log {} ms, in the log -> last drain done {} ms",
        observed.len(),
        median(observed),
        median(appended),
        median(drained)
    )
}
