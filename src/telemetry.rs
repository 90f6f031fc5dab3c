//! Telemetry: one typed event per thing that happens, whose `emit()` writes
//! both the log line and the metric (vector's instrumentation spec). Metric
//! names are `lockstep_<name>_<unit>`; labels come from small fixed sets,
//! never a node name.
//!
//! Also the HTTP endpoint: `/metrics` (Prometheus), `/livez`, `/readyz`,
//! `/status`, and `/why/NODE` (the audit chain of the Slurm nodes of a
//! Kubernetes node, or of one Slurm node, answered by the apply loop, which
//! owns the engine, from the engine and the store's audit index).
//!
//! Metrics (all `lockstep_`; counters end in `_total`, units last):
//!
//! - Slurm as lockstep observes it, from the engine's model (no extra Slurm
//!   load), every [`STATS_INTERVAL_MS`]: `slurm_nodes{partition,state}`,
//!   `slurm_pending_jobs{partition}`, `slurm_pending_nodes{partition}`
//!   (nodes wanted by pending jobs that more nodes can help: what an
//!   autoscaler scales a NodeSet on), `nodes{phase}`, `drains{owner,rule}`,
//!   `health_held_nodes{rule}`, `actions_in_flight{kind}`,
//!   `draining_oldest_seconds`, `connector_visible{connector}`,
//!   `applied_log_time_seconds`.
//! - Sync: `observation_age_seconds{source}` (observed -> applied),
//!   `action_publish_latency_seconds{kind}` (causing observation ->
//!   published), `action_outcome_latency_seconds{kind}` (published ->
//!   outcome), `reaction_latency_seconds{kind}` (observation -> outcome),
//!   `action_retries_total{kind}`, `rule_firings_total{rule,output}`,
//!   `connector_errors_total{connector,class}`, `log_lag_records`, `leader`.
//!
//! Label values come from fixed sets (states, phases, rules, kinds,
//! sources) or the site's partitions, at most [`PARTITIONS_SHOWN_MAX`] of
//! them; never a node name.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

use anyhow::{Context, Result};
use lockstep_connectors::clock::now_ms;
use lockstep_engine::{Engine, Output, Stats};
use lockstep_schemas::{
    ActionKind, Event, EventRecord, IssuedAction, OutcomeResult, Source, Target,
};
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::PrometheusHandle;
use tracing::{debug, error, info, warn};

use crate::config::LogFormat;

/// Sets up `tracing` (filter from `RUST_LOG`, default `info`) on stderr,
/// in colour only on a terminal (and never with `NO_COLOR` set): a log file
/// or a container's log stays plain text.
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Histogram buckets of every `_seconds` histogram: 1 ms to 10 min, so that
/// a p99 of a 20 ms reaction and of a 5 min stall both read.
const SECONDS_BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

/// Installs the Prometheus recorder (histograms with buckets, so that
/// Prometheus computes percentiles across replicas).
pub fn install_metrics() -> Result<PrometheusHandle> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".to_owned()),
            &SECONDS_BUCKETS,
        )
        .context("setting histogram buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    describe();
    SyncMetrics::initialize();
    Ok(handle)
}

/// The help text of every metric (what `/metrics` says in `# HELP`).
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    for (name, help) in [
        ("lockstep_events_applied_total", "Log records applied."),
        ("lockstep_transitions_total", "Phase transitions of Slurm nodes."),
        ("lockstep_actions_issued_total", "Actions the reducer issued, by kind."),
        ("lockstep_actions_dispatched_total", "Actions this replica published first and carries out."),
        ("lockstep_actions_already_published_total", "Actions another replica (or an earlier life of this one) had published: not carried out again."),
        ("lockstep_action_outcomes_total", "Action outcomes applied, by kind and result."),
        ("lockstep_action_retries_total", "Actions issued again (attempt > 1) after a failure, a timeout or no effect, by kind."),
        ("lockstep_rule_firings_total", "Transitions and actions, by the policy rule that decided them."),
        ("lockstep_connector_errors_total", "Errors by connector (slurm, kubernetes, log) and class: sight lost, actions refused (retryable or not), event log open/read/append/publish failures."),
        ("lockstep_log_reconnects_total", "Event log operations that failed and are retried."),
        ("lockstep_retention_dropped_total", "What the retention horizon dropped: ledger entries, audit transitions and (embedded log) log records."),
    ] {
        describe_counter!(name, help);
    }
    for (name, help) in [
        ("lockstep_applied_seq", "Last applied log sequence."),
        ("lockstep_leader", "1 while this replica leads: it observes and acts."),
        ("lockstep_log_lag_records", "Records in the event log not applied yet."),
        ("lockstep_snapshot_seq", "The sequence of the last snapshot this replica kept beside the event log (0: none since it started)."),
        ("lockstep_log_broken", "1 while this replica stopped because the event log does not continue what it applied, by reason (recreated, went_back, rewritten, hole, uncovered)."),
        ("lockstep_slurm_nodes", "Slurm nodes by partition and state (as sinfo sums it up), from lockstep's model."),
        ("lockstep_slurm_pending_jobs", "Pending Slurm jobs by partition."),
        ("lockstep_slurm_pending_nodes", "Nodes wanted by pending jobs that more nodes can help, by partition: what scaling follows."),
        ("lockstep_nodes", "Slurm nodes by lockstep phase."),
        ("lockstep_drains", "Drains in force by owner (lockstep, other) and the rule that keeps them."),
        ("lockstep_health_held_nodes", "Nodes held by health damping: the drain rate bound, flap hold, resume delay."),
        ("lockstep_actions_in_flight", "Actions sent and not answered yet, by kind."),
        ("lockstep_connector_visible", "1 while lockstep sees the connector's system (slurm, kubernetes)."),
    ] {
        describe_gauge!(name, help);
    }
    describe_gauge!(
        "lockstep_checkpoint_bytes",
        Unit::Bytes,
        "Size of the last checkpoint."
    );
    describe_gauge!(
        "lockstep_draining_oldest_seconds",
        Unit::Seconds,
        "Log time the oldest node in phase draining has waited for Slurm to show its drain (0: none)."
    );
    describe_gauge!(
        "lockstep_applied_log_time_seconds",
        Unit::Seconds,
        "The reducer's clock: the log time applied so far (Unix seconds)."
    );
    for (name, help) in [
        ("lockstep_apply_batch_seconds", "Time applying a batch."),
        (
            "lockstep_commit_seconds",
            "Time committing a batch (transaction and flush).",
        ),
        ("lockstep_checkpoint_seconds", "Time taking a checkpoint."),
        (
            "lockstep_observation_age_seconds",
            "Age of an observation when applied (observer clock to apply), by source.",
        ),
        (
            "lockstep_action_publish_latency_seconds",
            "Causing observation to action published, by kind.",
        ),
        (
            "lockstep_action_outcome_latency_seconds",
            "Action published to its outcome, by kind.",
        ),
        (
            "lockstep_reaction_latency_seconds",
            "Causing observation to the action's outcome, by kind.",
        ),
    ] {
        describe_histogram!(name, Unit::Seconds, help);
    }
}

/// What `/readyz` and `/status` report; shared with the apply loop.
#[derive(Debug, Default)]
pub struct Health {
    /// The loop has caught up with the log at least once.
    pub ready: AtomicBool,
    /// Last applied sequence.
    pub applied_seq: AtomicU64,
    /// Last known head of the log.
    pub head_seq: AtomicU64,
    /// Sequence of the last checkpoint.
    pub checkpoint_seq: AtomicU64,
    /// This instance leads: it observes, dispatches and carries out actions.
    pub leader: AtomicBool,
    /// Why the loop cannot start yet (the event log does not answer), for
    /// `/readyz`; `None` once it has the log.
    pub waiting: std::sync::Mutex<Option<String>>,
    /// The model in numbers, for `/status` (phases, actions in flight,
    /// visibility), refreshed with the metrics.
    pub summary: std::sync::Mutex<serde_json::Value>,
    /// Why the loop stopped for good: the log does not continue what was
    /// applied (`/readyz`, `/status`).
    pub broken: std::sync::Mutex<Option<String>>,
}

impl Health {
    /// What `/readyz` says while not ready.
    fn not_ready_reason(&self) -> String {
        if let Some(why) = &*self.broken.lock().expect("health lock poisoned") {
            return format!("stopped: {why}; lockstep acts on nothing until it is recovered (docs: operations, backups)\n");
        }
        match &*self.waiting.lock().expect("health lock poisoned") {
            Some(why) => format!("{why}\n"),
            None => "catching up with the log\n".to_owned(),
        }
    }
}

/// One record took the engine long to apply.
pub struct SlowRecord {
    /// Its sequence.
    pub seq: u64,
    /// Its append time (the engine's clock).
    pub time_ms: u64,
    /// Its kind of event ([`lockstep_schemas::Event::kind`]).
    pub event: &'static str,
    /// Actions it issued.
    pub actions: usize,
    /// Time applying it.
    pub took: Duration,
}

impl SlowRecord {
    /// Logs it.
    pub fn emit(&self) {
        debug!(
            seq = self.seq,
            time_ms = self.time_ms,
            event = self.event,
            actions = self.actions,
            took_ms = self.took.as_millis() as u64,
            "slow record"
        );
    }
}

/// A batch was applied and committed.
pub struct BatchCommitted<'a> {
    /// Records in the batch.
    pub records: usize,
    /// Last sequence applied.
    pub last_seq: u64,
    /// What the batch produced.
    pub output: &'a Output,
    /// Time applying.
    pub apply: Duration,
    /// Time committing (transaction and flush).
    pub commit: Duration,
}

impl BatchCommitted<'_> {
    /// Logs and counts it.
    pub fn emit(&self) {
        debug!(
            records = self.records,
            last_seq = self.last_seq,
            transitions = self.output.transitions.len(),
            actions = self.output.actions.len(),
            apply_ms = self.apply.as_millis() as u64,
            commit_ms = self.commit.as_millis() as u64,
            "batch committed"
        );
        counter!("lockstep_events_applied_total").increment(self.records as u64);
        counter!("lockstep_transitions_total").increment(self.output.transitions.len() as u64);
        for a in &self.output.actions {
            counter!("lockstep_actions_issued_total", "kind" => a.action.kind().name())
                .increment(1);
        }
        histogram!("lockstep_apply_batch_seconds").record(self.apply.as_secs_f64());
        histogram!("lockstep_commit_seconds").record(self.commit.as_secs_f64());
        gauge!("lockstep_applied_seq").set(self.last_seq as f64);
    }
}

/// An action outcome was read from the log.
pub struct OutcomeApplied<'a> {
    /// The action's kind.
    pub kind: &'static str,
    /// `succeeded`, `already_done`, `failed_retryable`, `failed`.
    pub result: &'a str,
}

impl OutcomeApplied<'_> {
    /// Counts it.
    pub fn emit(&self) {
        counter!("lockstep_action_outcomes_total", "kind" => self.kind, "result" => self.result.to_owned()).increment(1);
    }
}

/// Actions were handed to the action stream.
pub struct ActionsDispatched {
    /// How many.
    pub count: usize,
}

impl ActionsDispatched {
    /// Logs and counts it.
    pub fn emit(&self) {
        if self.count > 0 {
            info!(count = self.count, "actions dispatched");
        }
        counter!("lockstep_actions_dispatched_total").increment(self.count as u64);
    }
}

/// Actions another instance (or an earlier life of this one) had already
/// published: this instance does not carry them out.
pub struct ActionsAlreadyPublished<'a> {
    /// Their ids.
    pub ids: &'a [lockstep_schemas::ActionId],
}

impl ActionsAlreadyPublished<'_> {
    /// Logs and counts it.
    pub fn emit(&self) {
        if self.ids.is_empty() {
            return;
        }
        info!(
            count = self.ids.len(),
            first = %self.ids[0].0,
            "actions already on the action stream; not carried out again (a lost one is retried by the reducer after its timeout)"
        );
        counter!("lockstep_actions_already_published_total").increment(self.ids.len() as u64);
    }
}

/// This instance started or stopped leading.
pub fn record_leader(leader: bool) {
    gauge!("lockstep_leader").set(if leader { 1.0 } else { 0.0 });
}

/// Outcome results, as `lockstep_action_outcomes_total{result}` names them.
pub const OUTCOME_RESULTS: [&str; 5] = [
    "succeeded",
    "already_done",
    "declined",
    "failed_retryable",
    "failed",
];

/// The label of an outcome's result.
pub const fn outcome_result(r: &OutcomeResult) -> &'static str {
    match r {
        OutcomeResult::Succeeded => "succeeded",
        OutcomeResult::AlreadyDone => "already_done",
        OutcomeResult::Declined { .. } => "declined",
        OutcomeResult::Failed {
            retryable: true, ..
        } => "failed_retryable",
        OutcomeResult::Failed { .. } => "failed",
    }
}

/// How often the model is counted into gauges.
pub const STATS_INTERVAL_MS: u64 = 1_000;
/// Partitions named in labels; the others are summed under `(other)`.
pub const PARTITIONS_SHOWN_MAX: usize = 64;
/// Actions whose publication time is kept until their outcome; the oldest
/// go first (their outcome then has no latency sample).
pub const TIMED_ACTIONS_MAX: usize = 65_536;
/// A rule name longer than this is not one the engine gave (a label must
/// stay small): it is counted as `other`.
const RULE_LABEL_BYTES_MAX: usize = 48;

/// When an action this instance published was caused and published.
#[derive(Debug, Clone, Copy)]
struct Timing {
    kind: ActionKind,
    observed_ms: u64,
    published_ms: u64,
}

/// The sync metrics that need memory between batches: publication times
/// of actions in flight, and which gauge series were set last time (so a
/// partition or state that disappears goes to 0 rather than stay stale).
#[derive(Debug, Default)]
pub struct SyncMetrics {
    timings: HashMap<String, Timing>,
    timing_order: VecDeque<String>,
    last_stats: Option<Instant>,
    counting: Option<Counting>,
    gauges_set: Vec<(&'static str, Vec<(&'static str, String)>)>,
}

/// A count of the model under way, a part at a time.
#[derive(Debug)]
struct Counting {
    parts: usize,
    next: usize,
    so_far: Stats,
}

fn seconds_between(from_ms: u64, to_ms: u64) -> f64 {
    to_ms.saturating_sub(from_ms) as f64 / 1000.0
}

fn rule_label(rule: &str) -> String {
    let ok = !rule.is_empty()
        && rule.len() <= RULE_LABEL_BYTES_MAX
        && rule
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_' || b == b'.');
    if ok {
        rule.to_owned()
    } else {
        "other".to_owned()
    }
}

/// One gauge sample: metric name, labels, value.
type GaugeSample = (&'static str, Vec<(&'static str, String)>, f64);

impl SyncMetrics {
    /// Creates the counters an alert reads at 0, so that their series exist
    /// before the first failure.
    pub fn initialize() {
        for kind in ActionKind::ALL {
            for result in OUTCOME_RESULTS {
                counter!("lockstep_action_outcomes_total", "kind" => kind.name(), "result" => result)
                    .increment(0);
            }
            counter!("lockstep_action_retries_total", "kind" => kind.name()).increment(0);
        }
        for connector in ["slurm", "kubernetes"] {
            for class in ["unavailable", "action_retryable", "action_permanent"] {
                counter!("lockstep_connector_errors_total", "connector" => connector, "class" => class)
                    .increment(0);
            }
        }
        for class in ["open", "read", "append", "publish"] {
            counter!("lockstep_connector_errors_total", "connector" => "log", "class" => class)
                .increment(0);
        }
        gauge!("lockstep_log_lag_records").set(0.0);
        for reason in ["recreated", "went_back", "rewritten", "hole", "uncovered"] {
            gauge!("lockstep_log_broken", "reason" => reason).set(0.0);
        }
    }

    /// After a batch was applied and committed. `live`: this instance has
    /// caught up with the log (ages and errors of a catch-up are history,
    /// not news, and are not measured).
    pub fn applied(&mut self, batch: &[EventRecord], out: &Output, live: bool) {
        let now = now_ms();
        for rec in batch {
            let env = &rec.envelope;
            match &env.event {
                Event::ActionOutcome(o) => {
                    if let Some(t) = self.timings.remove(&o.action_id.0) {
                        let kind = t.kind.name();
                        histogram!("lockstep_action_outcome_latency_seconds", "kind" => kind)
                            .record(seconds_between(t.published_ms, env.observed_ms));
                        histogram!("lockstep_reaction_latency_seconds", "kind" => kind)
                            .record(seconds_between(t.observed_ms, env.observed_ms));
                    }
                    if live {
                        if let OutcomeResult::Failed { retryable, .. } = &o.result {
                            let class = if *retryable {
                                "action_retryable"
                            } else {
                                "action_permanent"
                            };
                            counter!("lockstep_connector_errors_total", "connector" => o.kind.connector().name(), "class" => class)
                                .increment(1);
                        }
                    }
                }
                Event::ConnectorStatus {
                    connector,
                    visible: false,
                    ..
                } if live => {
                    let connector = match connector {
                        lockstep_schemas::Connector::Slurm => "slurm",
                        lockstep_schemas::Connector::Kubernetes => "kubernetes",
                    };
                    counter!("lockstep_connector_errors_total", "connector" => connector, "class" => "unavailable")
                        .increment(1);
                }
                _ => {}
            }
            if live && matches!(env.source, Source::Slurm | Source::Kubernetes) {
                histogram!("lockstep_observation_age_seconds", "source" => env.source.name())
                    .record(seconds_between(env.observed_ms, now));
            }
        }
        for t in &out.transitions {
            counter!("lockstep_rule_firings_total", "rule" => t.rule.name(), "output" => "transition")
                .increment(1);
        }
        for a in &out.actions {
            counter!("lockstep_rule_firings_total", "rule" => rule_label(&a.rule), "output" => "action")
                .increment(1);
            if a.attempt > 1 {
                counter!("lockstep_action_retries_total", "kind" => a.action.kind().name())
                    .increment(1);
            }
        }
    }

    /// Actions of `batch` this instance has just published: measures
    /// causing observation -> publication and keeps the times until the
    /// outcome.
    pub fn published(&mut self, batch: &[EventRecord], actions: &[IssuedAction]) {
        let now = now_ms();
        for a in actions {
            // The record whose application issued it: its observer's time.
            let Ok(i) = batch.binary_search_by_key(&a.seq, |r| r.seq) else {
                continue;
            };
            let observed_ms = batch[i].envelope.observed_ms;
            let kind = a.action.kind();
            histogram!("lockstep_action_publish_latency_seconds", "kind" => kind.name())
                .record(seconds_between(observed_ms, now));
            if self.timing_order.len() >= TIMED_ACTIONS_MAX {
                if let Some(old) = self.timing_order.pop_front() {
                    self.timings.remove(&old);
                }
            }
            self.timing_order.push_back(a.id.0.clone());
            self.timings.insert(
                a.id.0.clone(),
                Timing {
                    kind,
                    observed_ms,
                    published_ms: now,
                },
            );
        }
    }

    /// Whether the model is due to be counted again.
    pub fn stats_due(&self) -> bool {
        self.last_stats
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(STATS_INTERVAL_MS))
    }

    /// Begins a count of the model (unless one is under way); see
    /// [`Self::count_stats`].
    pub fn begin_stats(&mut self, engine: &Engine) {
        self.last_stats = Some(Instant::now());
        if self.counting.is_none() {
            self.counting = Some(Counting {
                parts: engine.stats_parts(),
                next: 0,
                so_far: Stats::default(),
            });
        }
    }

    /// Goes on with the count under way, if any, and once it is whole
    /// publishes it into gauges and `/status`. A large model is counted in
    /// parts ([`Engine::stats_parts`]: 16 at 50,000 nodes, where the whole
    /// count takes 30 ms and more), one a pass of the apply loop while
    /// records arrive, so that counting never holds up applying for long;
    /// with `idle` (the pass read nothing), the rest at once.
    pub fn count_stats(&mut self, engine: &Engine, health: &Health, idle: bool) {
        let Some(c) = &mut self.counting else {
            return;
        };
        loop {
            c.so_far.merge(engine.stats_part(c.next, c.parts));
            c.next += 1;
            if c.next == c.parts {
                break;
            }
            if !idle {
                return;
            }
        }
        let counted = self.counting.take().expect("a count under way");
        self.publish_stats(counted.so_far, health);
    }

    /// Publishes a count of the model into gauges and `/status`.
    fn publish_stats(&mut self, stats: Stats, health: &Health) {
        let mut set: Vec<GaugeSample> = Vec::new();

        // The site's partitions, bounded: the first by name, the rest summed.
        let mut partitions: Vec<&str> = stats
            .slurm_nodes
            .keys()
            .map(|(p, _)| p.as_str())
            .chain(stats.pending_jobs.keys().map(String::as_str))
            .chain(stats.pending_nodes.keys().map(String::as_str))
            .collect();
        partitions.sort_unstable();
        partitions.dedup();
        let shown: std::collections::HashSet<&str> = partitions
            .iter()
            .take(PARTITIONS_SHOWN_MAX)
            .copied()
            .collect();
        let partition = |p: &str| -> String {
            if p.is_empty() {
                "(none)".to_owned()
            } else if shown.contains(p) {
                p.to_owned()
            } else {
                "(other)".to_owned()
            }
        };
        let mut nodes: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
        for ((p, state), n) in &stats.slurm_nodes {
            *nodes.entry((partition(p), state)).or_default() += n;
        }
        for ((p, state), n) in nodes {
            set.push((
                "lockstep_slurm_nodes",
                vec![("partition", p), ("state", state.to_owned())],
                n as f64,
            ));
        }
        for (name, map) in [
            ("lockstep_slurm_pending_jobs", &stats.pending_jobs),
            ("lockstep_slurm_pending_nodes", &stats.pending_nodes),
        ] {
            let mut by: BTreeMap<String, u64> = BTreeMap::new();
            for (p, n) in map {
                *by.entry(partition(p)).or_default() += n;
            }
            for (p, n) in by {
                set.push((name, vec![("partition", p)], n as f64));
            }
        }
        for (phase, n) in &stats.phases {
            set.push((
                "lockstep_nodes",
                vec![("phase", (*phase).to_owned())],
                *n as f64,
            ));
        }
        for ((owner, rule), n) in &stats.drains {
            set.push((
                "lockstep_drains",
                vec![("owner", (*owner).to_owned()), ("rule", (*rule).to_owned())],
                *n as f64,
            ));
        }
        for (rule, n) in &stats.health_held {
            set.push((
                "lockstep_health_held_nodes",
                vec![("rule", (*rule).to_owned())],
                *n as f64,
            ));
        }
        for kind in ActionKind::ALL {
            let n = stats.in_flight.get(kind.name()).copied().unwrap_or(0);
            set.push((
                "lockstep_actions_in_flight",
                vec![("kind", kind.name().to_owned())],
                n as f64,
            ));
        }
        for (connector, visible) in [
            ("slurm", stats.slurm_visible),
            ("kubernetes", stats.kube_visible),
        ] {
            set.push((
                "lockstep_connector_visible",
                vec![("connector", connector.to_owned())],
                f64::from(u8::from(visible)),
            ));
        }
        set.push((
            "lockstep_draining_oldest_seconds",
            vec![],
            stats.draining_oldest_ms as f64 / 1000.0,
        ));
        set.push((
            "lockstep_applied_log_time_seconds",
            vec![],
            stats.now_ms as f64 / 1000.0,
        ));

        let now: Vec<_> = set.iter().map(|(n, l, _)| (*n, l.clone())).collect();
        for gone in self.gauges_set.iter().filter(|g| !now.contains(g)) {
            gauge!(gone.0, labels(&gone.1)).set(0.0);
        }
        for (name, l, v) in &set {
            gauge!(*name, labels(l)).set(*v);
        }
        self.gauges_set = now;

        let in_flight: u64 = stats.in_flight.values().sum();
        *health.summary.lock().expect("health lock poisoned") = serde_json::json!({
            "phases": stats.phases,
            "actions_in_flight": in_flight,
            "slurm_visible": stats.slurm_visible,
            "kube_visible": stats.kube_visible,
            "log_time_ms": stats.now_ms,
        });
    }
}

fn labels(l: &[(&'static str, String)]) -> Vec<metrics::Label> {
    l.iter()
        .map(|(k, v)| metrics::Label::new(*k, v.clone()))
        .collect()
}

/// A question for the apply loop, which owns the engine: the audit chain of
/// a Kubernetes node's Slurm nodes, or of one Slurm node (`/why/NAME`).
#[derive(Debug)]
pub struct Query {
    /// A Kubernetes node or a Slurm node name.
    pub name: String,
    /// Where the answer goes.
    pub reply: tokio::sync::oneshot::Sender<serde_json::Value>,
}

/// Queries waiting for the loop, at most; more are answered 503.
pub const QUERIES_WAITING_MAX: usize = 16;
/// Slurm nodes one answer covers, at most.
pub const WHY_NODES_MAX: usize = 256;
/// Transitions per Slurm node in an answer: the last ones.
pub const WHY_TRANSITIONS_MAX: usize = 50;

/// Answers the queries waiting (called by the loop between batches).
pub fn answer_queries(
    queries: &mut tokio::sync::mpsc::Receiver<Query>,
    engine: &Engine,
    store: &lockstep_store::Store,
) {
    while let Ok(q) = queries.try_recv() {
        let _ = q.reply.send(why(engine, store, &q.name));
    }
}

/// Whether an action target belongs to a Slurm node, its pod or its
/// Kubernetes node (or that node's maintenance reservation, named with
/// `reservation_prefix`).
fn targets(
    target: &Target,
    node: &str,
    pod: Option<&str>,
    kube: Option<&str>,
    reservation_prefix: &str,
) -> bool {
    match target {
        Target::SlurmNodeState { node: n }
        | Target::SlurmNodeFeatures { node: n }
        | Target::SlurmNodeTopology { node: n } => n == node,
        Target::PodCondition {
            namespace, pod: p, ..
        }
        | Target::PodLabel {
            namespace, pod: p, ..
        }
        | Target::PodEviction { namespace, pod: p }
        | Target::Pod { namespace, pod: p } => pod == Some(format!("{namespace}/{p}").as_str()),
        Target::NodeTaint { node: n, .. }
        | Target::NodeCondition { node: n, .. }
        | Target::NodeLabel { node: n, .. } => kube == Some(n.as_str()),
        Target::SlurmReservation { name } => {
            kube.is_some() && name.strip_prefix(reservation_prefix) == kube
        }
        Target::Scale { .. } => false,
    }
}

/// The answer of `/why/NAME`: each Slurm node that is `name` or runs on the
/// Kubernetes node `name`, with its phase, placement, actions in flight and
/// last transitions from the audit index.
pub fn why(engine: &Engine, store: &lockstep_store::Store, name: &str) -> serde_json::Value {
    let pending = engine.pending();
    let mut nodes = Vec::new();
    for (node, phase) in engine.phases() {
        let kube = engine.placement(&node);
        if node != name && kube.as_deref() != Some(name) {
            continue;
        }
        if nodes.len() == WHY_NODES_MAX {
            break;
        }
        let pod = engine.pod_key_of(&node);
        let in_flight: Vec<&str> = pending
            .iter()
            .filter(|(t, _)| {
                targets(
                    t,
                    &node,
                    pod.as_deref(),
                    kube.as_deref(),
                    &engine.policy().maintenance.reservation_prefix,
                )
            })
            .map(|(_, id)| id.0.as_str())
            .collect();
        let (transitions, error) = match store.transitions(&node) {
            Ok(mut t) => {
                let skip = t.len().saturating_sub(WHY_TRANSITIONS_MAX);
                (t.drain(skip..).collect::<Vec<_>>(), None)
            }
            Err(e) => (Vec::new(), Some(format!("{e:#}"))),
        };
        nodes.push(serde_json::json!({
            "slurm_node": node,
            "kube_node": kube,
            "pod": pod,
            "phase": phase.name(),
            "jobs": engine.jobs_on(&node),
            "in_flight": in_flight,
            "transitions": transitions,
            "audit_error": error,
        }));
    }
    serde_json::json!({
        "query": name,
        "applied_seq": engine.last_seq(),
        "log_time_ms": engine.now_ms(),
        "slurm_nodes": nodes,
    })
}

/// A checkpoint was written.
pub struct CheckpointWritten {
    /// Its sequence.
    pub seq: u64,
    /// Its size on disk.
    pub bytes: u64,
    /// Time writing it, snapshot and sync included.
    pub took: Duration,
}

impl CheckpointWritten {
    /// Logs and measures it.
    pub fn emit(&self) {
        info!(
            seq = self.seq,
            bytes = self.bytes,
            took_ms = self.took.as_millis() as u64,
            "checkpoint written"
        );
        gauge!("lockstep_checkpoint_bytes").set(self.bytes as f64);
        histogram!("lockstep_checkpoint_seconds").record(self.took.as_secs_f64());
    }
}

/// Reading or writing the log failed; the loop retries.
pub struct LogUnavailable<'a> {
    /// What failed.
    pub what: &'static str,
    /// The error.
    pub error: &'a dyn std::fmt::Display,
    /// Next try in.
    pub retry_in: Duration,
}

impl LogUnavailable<'_> {
    /// Logs and counts it.
    pub fn emit(&self) {
        warn!(what = self.what, error = %self.error, retry_in_ms = self.retry_in.as_millis() as u64, "event log unavailable; retrying");
        counter!("lockstep_log_reconnects_total").increment(1);
        let class = match self.what {
            "open" => "open",
            "read" => "read",
            "append" => "append",
            _ => "publish",
        };
        counter!("lockstep_connector_errors_total", "connector" => "log", "class" => class)
            .increment(1);
    }
}

/// The log does not continue what was applied: the loop stopped.
pub struct LogBroken<'a> {
    /// The metric's label ([`crate::service`]'s reasons: recreated,
    /// went_back, rewritten, hole, uncovered).
    pub reason: &'static str,
    /// What was found.
    pub detail: &'a dyn std::fmt::Display,
}

impl LogBroken<'_> {
    /// Logs it, sets the gauge, and makes `/readyz` and `/status` say it.
    pub fn emit(&self, health: &Health) {
        error!(
            reason = self.reason,
            "{}; lockstep stopped: it applies no more records and acts on nothing until it is recovered (docs: operations, backups)",
            self.detail
        );
        gauge!("lockstep_log_broken", "reason" => self.reason).set(1.0);
        health.ready.store(false, Ordering::Relaxed);
        *health.broken.lock().expect("health lock poisoned") = Some(self.detail.to_string());
    }
}

/// The leader kept a snapshot beside the log.
pub struct SnapshotKept<'a> {
    /// The last sequence its state applied.
    pub seq: u64,
    /// The state's hash.
    pub state_hash: &'a str,
    /// Hashing and uploading it.
    pub took: Duration,
}

impl SnapshotKept<'_> {
    /// Logs it and sets the gauge.
    pub fn emit(&self) {
        info!(
            seq = self.seq,
            state_hash = self.state_hash,
            took_ms = self.took.as_millis() as u64,
            "snapshot kept beside the event log"
        );
        gauge!("lockstep_snapshot_seq").set(self.seq as f64);
    }
}

/// The retention horizon passed over old history.
pub struct RetentionApplied {
    /// What happened before it was dropped (log time, ms).
    pub before_ms: u64,
    /// Ledger entries dropped.
    pub ledger: u64,
    /// Audit transitions dropped.
    pub transitions: u64,
    /// Embedded log records discarded.
    pub records: u64,
    /// The store's size on disk after it.
    pub store_bytes: u64,
    /// How long it took (off the apply loop).
    pub took: Duration,
}

impl RetentionApplied {
    /// Logs it and counts it.
    pub fn emit(&self) {
        info!(
            before = %crate::render::time(self.before_ms),
            ledger = self.ledger,
            transitions = self.transitions,
            records = self.records,
            store_bytes = self.store_bytes,
            took_ms = self.took.as_millis() as u64,
            "dropped the history before the retention horizon"
        );
        for (what, n) in [
            ("ledger", self.ledger),
            ("transitions", self.transitions),
            ("records", self.records),
        ] {
            counter!("lockstep_retention_dropped_total", "what" => what).increment(n);
        }
    }
}

/// The log's head moved.
pub fn record_lag(head: u64, applied: u64) {
    gauge!("lockstep_log_lag_records").set(head.saturating_sub(applied) as f64);
}

/// Serves `/metrics`, `/livez`, `/readyz`, `/status` and `/why/NAME`
/// until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    health: Arc<Health>,
    queries: tokio::sync::mpsc::Sender<Query>,
) -> Result<()> {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::{Response, StatusCode};

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the telemetry endpoint on {addr}"))?;
    info!(%addr, "serving /metrics /livez /readyz /status");
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "telemetry accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        let health = health.clone();
        let queries = queries.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let metrics = metrics.clone();
                    let health = health.clone();
                    let queries = queries.clone();
                    async move {
                        let path = req.uri().path();
                        if let Some(name) = path.strip_prefix("/why/") {
                            let (status, body) = ask_why(&queries, name).await;
                            let mut resp = Response::new(Full::new(Bytes::from(body)));
                            *resp.status_mut() = status;
                            resp.headers_mut().insert(
                                hyper::header::CONTENT_TYPE,
                                hyper::header::HeaderValue::from_static("application/json"),
                            );
                            return Ok::<_, std::convert::Infallible>(resp);
                        }
                        let (status, body) = match path {
                            "/metrics" => (StatusCode::OK, metrics.render()),
                            "/livez" => (StatusCode::OK, "ok\n".to_owned()),
                            "/readyz" if health.ready.load(Ordering::Relaxed) => {
                                (StatusCode::OK, "ok\n".to_owned())
                            }
                            "/readyz" => {
                                (StatusCode::SERVICE_UNAVAILABLE, health.not_ready_reason())
                            }
                            "/status" => (StatusCode::OK, status_json(&health)),
                            _ => (StatusCode::NOT_FOUND, "not found\n".to_owned()),
                        };
                        let mut resp = Response::new(Full::new(Bytes::from(body)));
                        *resp.status_mut() = status;
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

/// The `/status` document.
fn status_json(health: &Health) -> String {
    let mut doc = serde_json::json!({
        "ready": health.ready.load(Ordering::Relaxed),
        "leader": health.leader.load(Ordering::Relaxed),
        "applied_seq": health.applied_seq.load(Ordering::Relaxed),
        "head_seq": health.head_seq.load(Ordering::Relaxed),
        "checkpoint_seq": health.checkpoint_seq.load(Ordering::Relaxed),
    });
    if let Some(why) = &*health.broken.lock().expect("health lock poisoned") {
        doc["stopped"] = serde_json::Value::String(why.clone());
    }
    if let (Some(doc), serde_json::Value::Object(more)) = (
        doc.as_object_mut(),
        &*health.summary.lock().expect("health lock poisoned"),
    ) {
        doc.extend(more.clone());
    }
    format!("{doc}\n")
}

/// How long `/why` waits for the loop (a batch being committed).
const WHY_WAIT: Duration = Duration::from_secs(10);
/// The longest node name `/why` takes (a DNS name).
const NODE_NAME_BYTES_MAX: usize = 253;

/// Asks the apply loop about `name`; (status, JSON body).
async fn ask_why(
    queries: &tokio::sync::mpsc::Sender<Query>,
    name: &str,
) -> (hyper::StatusCode, String) {
    use hyper::StatusCode;
    let valid = !name.is_empty()
        && name.len() <= NODE_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b));
    if !valid {
        return (
            StatusCode::BAD_REQUEST,
            "{\"error\":\"a node name is letters, digits, '-', '.', '_' or ':'\"}\n".to_owned(),
        );
    }
    let (reply, answer) = tokio::sync::oneshot::channel();
    let q = Query {
        name: name.to_owned(),
        reply,
    };
    if queries.try_send(q).is_err() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "{\"error\":\"too many questions waiting; ask again\"}\n".to_owned(),
        );
    }
    match tokio::time::timeout(WHY_WAIT, answer).await {
        Ok(Ok(v)) => (StatusCode::OK, format!("{v}\n")),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            "{\"error\":\"the apply loop did not answer in time (starting, or a long batch)\"}\n"
                .to_owned(),
        ),
    }
}
