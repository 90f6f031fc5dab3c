//! `lockstep run` configuration (TOML).
//!
//! Every field has a default; unknown fields are an error, so a typo is
//! caught at start, not silently ignored. The policy lives in its own JSON
//! file (the same document `lockstep policy default` prints), because it also
//! travels in the log as `PolicyChanged`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the embedded log and the store live.
    pub data_dir: PathBuf,
    /// The policy file (JSON). Unset: the default policy. Changes to the file
    /// take effect without restart: they enter the log as `PolicyChanged`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_file: Option<PathBuf>,
    /// The event log.
    pub log: LogConfig,
    /// The apply loop.
    pub service: ServiceConfig,
    /// Metrics, health and logs.
    pub telemetry: TelemetryConfig,
    /// The Kubernetes connector. Unset: lockstep does not talk to Kubernetes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesConfig>,
    /// The Slurm connector. Unset: lockstep does not talk to Slurm.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmConfig>,
    /// Leader election among replicas. Unset: this instance always leads
    /// (run one replica only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_election: Option<LeaderElectionConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("lockstep-data"),
            policy_file: None,
            log: LogConfig::default(),
            service: ServiceConfig::default(),
            telemetry: TelemetryConfig::default(),
            kubernetes: None,
            slurm: None,
            leader_election: None,
        }
    }
}

/// The Slurm connector: slurmrestd, or scontrol where there is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmConfig {
    /// slurmrestd base URL (`http://host:port`). Unset: scontrol only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rest_url: Option<String>,
    /// The user the JWT was issued for (`X-SLURM-USER-NAME`).
    pub rest_user: String,
    /// File holding the JWT (`scontrol token` output); re-read when rotated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwt_file: Option<PathBuf>,
    /// `SLURM_CONF` for scontrol. Unset: inherited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_conf: Option<PathBuf>,
    /// Time between the starts of two polls while Slurm answers (at least
    /// half of it between the end of one and the start of the next). The
    /// default, 350 ms, keeps
    /// Slurm -> Kubernetes under 500 ms at p99 on Slurm 24.11+ while an
    /// unchanged poll of 10,000 nodes costs slurmctld under 1% of a core
    /// (~3.2 ms a poll; 22.05 spends ~5.5 ms, 1.6%: raise it there for
    /// clusters that large). docs/src/benchmarks.md, "Slurm versions".
    pub poll_interval_ms: u64,
    /// The same for jobs and partitions, which are polled apart from the
    /// nodes. Unset: `poll_interval_ms`. A long queue that changes all the
    /// time is listed whole at every such poll (slurmrestd takes about
    /// 5.5 s and most of a core for 9,000 jobs): a longer interval spares
    /// slurmrestd, and jobs reach lockstep later (scale-out waits on them);
    /// what the nodes show does not wait. docs/src/operations/sizing.md.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jobs_poll_interval_ms: Option<u64>,
    /// Every this many polls, a full listing (objects not listed are gone):
    /// about every 10 min at the default interval.
    pub resync_every_polls: u32,
    /// With `rest_url`: list nodes through scontrol (`slurm_conf`) at every
    /// poll and where the actuator reads many nodes at once (a node pool's
    /// drains), jobs and partitions and every write through slurmrestd. For
    /// 10,000 nodes and more, where a poll that finds a change waits 2-4 s
    /// for slurmrestd's JSON of every node, against about 0.05 s through
    /// scontrol. The polls go to one long-lived scontrol, which asks
    /// slurmctld only for a listing newer than its last: while no node
    /// changes, slurmctld answers "no change" (at 10,000 nodes, its time on
    /// lockstep's requests 0.9% of the wall time against 2.5% with a new
    /// scontrol per poll). docs/src/operations/sizing.md.
    pub nodes_through_scontrol: bool,
    /// Watch Slurm into the log.
    pub observe: bool,
    /// Carry out the Slurm actions the reducer issues.
    pub actuate: bool,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        Self {
            rest_url: None,
            rest_user: "root".to_owned(),
            jwt_file: None,
            slurm_conf: None,
            poll_interval_ms: 350,
            jobs_poll_interval_ms: None,
            resync_every_polls: 1_700,
            nodes_through_scontrol: false,
            observe: true,
            actuate: true,
        }
    }
}

/// The Kubernetes connector.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// Kubeconfig file. Unset: `$KUBECONFIG`, `~/.kube/config`, or the
    /// in-cluster service account.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// Watch Nodes, the slurmd Pods and scale targets into the log.
    pub observe: bool,
    /// Carry out the Kubernetes actions the reducer issues.
    pub actuate: bool,
    /// More node labels (or `annotation:<key>`) to observe, beyond those the
    /// policy reads.
    pub node_labels: Vec<String>,
    /// Kubernetes actions carried out at the same time, at most.
    pub actions_in_flight_max: usize,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            observe: true,
            actuate: true,
            node_labels: Vec::new(),
            actions_in_flight_max: 16,
        }
    }
}

/// Leader election on a `coordination.k8s.io/v1` Lease: only the leader
/// observes, dispatches and carries out actions; the others fold the log
/// and take over when the leader's Lease expires. The Kubernetes client is
/// the `[kubernetes]` section's (or the in-cluster service account).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaderElectionConfig {
    /// Namespace of the Lease. Unset: `$POD_NAMESPACE`, else `default`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's identity. Unset: `$POD_NAME` (else the host name),
    /// the process id and the start time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// How long a Lease that is not renewed stays held: the longest a
    /// follower waits after the leader dies.
    pub lease_duration_ms: u64,
    /// The leader steps down (and exits) when it could not renew for this
    /// long; shorter than the lease duration.
    pub renew_deadline_ms: u64,
    /// Pause between attempts to take or renew the Lease.
    pub retry_period_ms: u64,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            lease_name: "lockstep".to_owned(),
            identity: None,
            lease_duration_ms: 15_000,
            renew_deadline_ms: 10_000,
            retry_period_ms: 2_000,
        }
    }
}

impl LeaderElectionConfig {
    /// The namespace, with its fallbacks.
    pub fn namespace(&self) -> String {
        self.namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "default".to_owned())
    }

    /// The identity, with its fallbacks.
    pub fn identity(&self) -> String {
        if let Some(id) = &self.identity {
            return id.clone();
        }
        let host = std::env::var("POD_NAME")
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .unwrap_or_else(|| "lockstep".to_owned());
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        format!("{host}_{}_{started:x}", std::process::id())
    }
}

/// The event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// NATS server URL (JetStream), or a comma-separated list of the
    /// servers of a JetStream cluster (the client moves to another when one
    /// fails). Unset: the embedded log in `<data_dir>/log`, which needs
    /// nothing else on a single machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats_url: Option<String>,
    /// Servers that keep a copy of each stream (1, 3 or 5; at most the
    /// cluster's size). lockstep creates the streams with it, and changes an
    /// existing stream to it. 3 survives the loss of one server.
    pub replicas: usize,
    /// How long JetStream remembers message ids for deduplication.
    pub duplicate_window_s: u64,
    /// Records older than this are discarded: by JetStream, or by the
    /// embedded log itself (as often as a snapshot is kept, and never past
    /// its oldest snapshot). 0: kept for ever.
    pub max_age_s: u64,
    /// Size bound of each JetStream stream.
    pub max_bytes: i64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            nats_url: None,
            replicas: 1,
            duplicate_window_s: 120,
            max_age_s: 30 * 24 * 3600,
            max_bytes: 8 << 30,
        }
    }
}

/// The apply loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// Records applied per batch (one commit per batch).
    pub batch_max: usize,
    /// How long a read waits for new records before the loop looks around.
    pub read_wait_ms: u64,
    /// A `Tick` is appended when the log has been quiet this long, so that
    /// log time (grace periods, retries) moves.
    pub tick_interval_ms: u64,
    /// How often the policy file is checked for changes.
    pub policy_poll_ms: u64,
    /// A checkpoint is written after this many records ... A restart after
    /// a crash restores the last checkpoint and re-applies what came after
    /// it, at most this many records: the default, 50,000, keeps that under
    /// 2 s at 10 M events on a slow machine (docs/src/benchmarks.md), at the
    /// price of a checkpoint write (0.6-0.9 s at 50,000 nodes) every 50,000
    /// records.
    pub checkpoint_every_records: u64,
    /// ... or this much time, whichever comes first.
    pub checkpoint_every_ms: u64,
    /// With NATS, the leader keeps its checkpoint beside the log as a
    /// snapshot (a JetStream object store bucket replicated like the
    /// streams) at the first checkpoint after this much time, or after the
    /// records since the last one take a quarter of `[log] max_bytes`: a
    /// replica that starts with an empty store, or whose checkpoint the
    /// log's retention has passed, starts from the newest. Less than half of
    /// `[log] max_age_s`, so that the log always holds a snapshot's
    /// successors.
    pub snapshot_every_ms: u64,
    /// Snapshots kept beside the log; older ones are deleted.
    pub snapshots_kept: usize,
    /// The store's retention horizon, in log time: the action ledger, the
    /// `undispatched` index and the audit index drop what is older, as
    /// often as a snapshot is kept. Unset: `[log] max_age_s`, so that the
    /// store keeps what the log keeps. 0: kept for ever.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_s: Option<u64>,
    /// Retry delay bound when the log is unreachable.
    pub retry_backoff_max_ms: u64,
    /// Whether the kernel may back lockstep's memory with transparent huge
    /// pages. Off (the default), `lockstep run` opts its process out
    /// (`prctl(PR_SET_THP_DISABLE)`), whatever the node's
    /// `/sys/kernel/mm/transparent_hugepage` setting: the allocator asks for
    /// huge pages, and a 2 MiB page is resident as a whole once any byte of it
    /// is touched, which at 50,000 nodes put about 50 MiB more in the pod's
    /// memory. On, the node's setting applies: the reducer applies about a
    /// quarter faster, which the service, waiting on the log and the store,
    /// hardly notices. docs/src/benchmarks.md.
    pub transparent_huge_pages: bool,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            batch_max: 1024,
            read_wait_ms: 200,
            tick_interval_ms: 1000,
            policy_poll_ms: 1000,
            checkpoint_every_records: 50_000,
            checkpoint_every_ms: 30_000,
            snapshot_every_ms: 3_600_000,
            snapshots_kept: 3,
            retention_s: None,
            retry_backoff_max_ms: 5_000,
            transparent_huge_pages: false,
        }
    }
}

/// Metrics, health and logs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Address of the HTTP endpoint: `/metrics` (Prometheus), `/livez`,
    /// `/readyz`, `/status`. Unset: no endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Log lines as `text` or `json`. The filter comes from `RUST_LOG`
    /// (default `info`).
    pub log_format: LogFormat,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
            log_format: LogFormat::Text,
        }
    }
}

/// See [`TelemetryConfig::log_format`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

impl Config {
    /// Reads a TOML file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        let doc: toml::Table =
            toml::from_str(&text).with_context(|| format!("in config {}", path.display()))?;
        require_tables(&doc, &Self::every_section(), "")
            .with_context(|| format!("in config {}", path.display()))?;
        let mut cfg: Config =
            toml::from_str(&text).with_context(|| format!("in config {}", path.display()))?;
        // Relative paths are relative to the config file.
        let base = path.parent().unwrap_or(Path::new("."));
        if cfg.data_dir.is_relative() {
            cfg.data_dir = base.join(&cfg.data_dir);
        }
        if let Some(p) = &mut cfg.policy_file {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        for p in cfg
            .slurm
            .iter_mut()
            .flat_map(|s| [s.jwt_file.as_mut(), s.slurm_conf.as_mut()])
            .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        if let Some(p) = cfg.kubernetes.as_mut().and_then(|k| k.kubeconfig.as_mut()) {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        if let Some(le) = &cfg.leader_election {
            if cfg.log.nats_url.is_none() {
                anyhow::bail!(
                    "in config {}: leader_election needs a shared log ([log] nats_url): with the embedded log each replica would fold only its own",
                    path.display()
                );
            }
            if le.lease_name.is_empty() {
                anyhow::bail!(
                    "in config {}: leader_election.lease_name must not be empty",
                    path.display()
                );
            }
            if !(le.retry_period_ms < le.renew_deadline_ms
                && le.renew_deadline_ms < le.lease_duration_ms)
            {
                anyhow::bail!(
                    "in config {}: leader_election needs retry_period_ms < renew_deadline_ms < lease_duration_ms (now {} / {} / {})",
                    path.display(),
                    le.retry_period_ms,
                    le.renew_deadline_ms,
                    le.lease_duration_ms
                );
            }
        }
        if ![1, 3, 5].contains(&cfg.log.replicas) {
            anyhow::bail!(
                "in config {}: log.replicas must be 1, 3 or 5 (a raft group of an even size tolerates no more failures than one server fewer), not {}",
                path.display(),
                cfg.log.replicas
            );
        }
        let max_age_ms = cfg.log.max_age_s.saturating_mul(1000);
        if max_age_ms > 0 && cfg.service.snapshot_every_ms.saturating_mul(2) >= max_age_ms {
            anyhow::bail!(
                "in config {}: service.snapshot_every_ms ({} ms) must be less than half of log.max_age_s ({} s): else the log's retention may discard every record after the newest snapshot, and a replica that starts then cannot catch up",
                path.display(),
                cfg.service.snapshot_every_ms,
                cfg.log.max_age_s
            );
        }
        if let Some(keep) = cfg.service.retention_s.filter(|&s| s > 0) {
            if keep.saturating_mul(1000) < cfg.service.snapshot_every_ms.saturating_mul(2) {
                anyhow::bail!(
                    "in config {}: service.retention_s ({keep} s) must be at least twice service.snapshot_every_ms ({} ms): the store keeps at least the history since the oldest snapshot it may start from",
                    path.display(),
                    cfg.service.snapshot_every_ms
                );
            }
        }
        if cfg.service.snapshots_kept == 0 {
            anyhow::bail!(
                "in config {}: service.snapshots_kept must be at least 1",
                path.display()
            );
        }
        if cfg.service.batch_max == 0 {
            anyhow::bail!(
                "in config {}: service.batch_max must be at least 1",
                path.display()
            );
        }
        Ok(cfg)
    }

    /// The default configuration with every optional section present: the
    /// shape [`require_tables`] checks a file against.
    fn every_section() -> toml::Table {
        let full = Config {
            kubernetes: Some(KubernetesConfig::default()),
            slurm: Some(SlurmConfig::default()),
            leader_election: Some(LeaderElectionConfig::default()),
            ..Config::default()
        };
        toml::Table::try_from(full).expect("the configuration is TOML")
    }

    /// The store's retention horizon in ms (`[service] retention_s`, else
    /// `[log] max_age_s`); `None`: kept for ever.
    pub fn retention_ms(&self) -> Option<u64> {
        let s = self.service.retention_s.unwrap_or(self.log.max_age_s);
        (s > 0).then(|| s.saturating_mul(1000))
    }

    /// Stream limits for JetStream.
    pub fn stream_limits(&self) -> lockstep_store::StreamLimits {
        lockstep_store::StreamLimits {
            duplicate_window: Duration::from_secs(self.log.duplicate_window_s),
            max_age: Duration::from_secs(self.log.max_age_s),
            max_bytes: self.log.max_bytes,
            replicas: self.log.replicas,
        }
    }
}

/// Every section of the configuration must be a table: serde's derived
/// deserializers also take an array, its items as the fields in order
/// (`log = ["nats://x", 120]`).
fn require_tables(doc: &toml::Table, shape: &toml::Table, prefix: &str) -> Result<()> {
    for (key, want) in shape {
        let (Some(want), Some(got)) = (want.as_table(), doc.get(key)) else {
            continue;
        };
        let field = format!("{prefix}{key}");
        match got.as_table() {
            Some(got) => require_tables(got, want, &format!("{field}."))?,
            None => anyhow::bail!(
                "{field}: expected a table of named fields, found {}",
                got.type_str()
            ),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_config_round_trips_and_an_empty_file_is_the_default() {
        let text = toml::to_string(&Config::default()).unwrap();
        assert_eq!(toml::from_str::<Config>(&text).unwrap(), Config::default());
        assert_eq!(toml::from_str::<Config>("").unwrap(), Config::default());
    }

    #[test]
    fn the_shipped_deployment_configuration_is_valid() {
        let manifest = include_str!("../deploy/kubernetes/lockstep.yaml");
        let block = |key: &str| -> String {
            let start = manifest.find(&format!("  {key}: |\n")).expect(key);
            manifest[start..]
                .lines()
                .skip(1)
                .take_while(|l| l.starts_with("    ") || l.is_empty())
                .map(|l| l.get(4..).unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let cfg: Config = toml::from_str(&block("lockstep.toml")).unwrap();
        assert!(cfg.leader_election.is_some() && cfg.slurm.is_some() && cfg.kubernetes.is_some());
        let policy: lockstep_schemas::Policy = serde_json::from_str(&block("policy.json")).unwrap();
        policy.validate().unwrap();
    }

    #[test]
    fn a_misspelt_field_is_an_error() {
        let err = toml::from_str::<Config>("[log]\nnats = \"nats://x\"\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `nats`"), "{err}");
    }
}
