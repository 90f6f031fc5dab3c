//! The policy: everything that decides what the reducer wants.
//!
//! A policy enters the log as a `PolicyChanged` event, so a change takes
//! effect without restart, is audited, and replays deterministically. Every
//! field has a default; an empty document is the default policy. Unknown
//! fields are rejected so a typo is an error, not a silently ignored setting.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::event::{ScaleTargetRef, TaintEffect};

/// The whole policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// How Slurm nodes are joined with Kubernetes pods and nodes.
    pub mapping: Mapping,
    /// Drains that follow cordons, evictions and pod deletions, and how drains
    /// set by others are shown in Kubernetes.
    pub drain: DrainPolicy,
    /// Health in both directions: Kubernetes node health drains Slurm, Slurm
    /// node health shows on pods and nodes.
    pub health: HealthPolicy,
    /// Retries and timeouts of actions in flight.
    pub actions: ActionPolicy,
    /// Slurm features and topology from Kubernetes node labels.
    pub topology: TopologyPolicy,
    /// Replica counts of scale targets from Slurm demand, and safe scale-in.
    pub scaling: ScalingPolicy,
}

/// How the reducer joins a Slurm node with its pod and Kubernetes node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Mapping {
    /// `pod`: each Slurm node runs in a pod (Slinky, SUNK, soperator); the
    /// Kubernetes node is the one the pod is bound to. `host`: slurmd runs on
    /// the host; the Slurm node name is the Kubernetes node name.
    pub mode: MappingMode,
    /// Pod mode: the pod label whose value is the Slurm node name. Unset: the
    /// pod name is the Slurm node name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name_label: Option<String>,
    /// Pod mode: label selector of the pods that run slurmd (used by the
    /// Kubernetes watcher).
    pub pod_selector: String,
}

impl Default for Mapping {
    fn default() -> Self {
        Self {
            mode: MappingMode::Pod,
            node_name_label: None,
            pod_selector: default_pod_selector(),
        }
    }
}

fn default_pod_selector() -> String {
    "app.kubernetes.io/component=slurmd".to_owned()
}

/// See [`Mapping::mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MappingMode {
    /// Slurm node = a pod.
    Pod,
    /// Slurm node name = Kubernetes node name.
    Host,
}

/// Drain policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DrainPolicy {
    /// Reason prefix that marks a drain as lockstep's own. lockstep only ever
    /// resumes drains whose reason starts with it.
    pub reason_prefix: String,
    /// Drain the Slurm nodes on a cordoned Kubernetes node; resume on uncordon.
    pub on_cordon: bool,
    /// Drain the Slurm node of a pod that is evicted (DisruptionTarget) or
    /// being deleted.
    pub on_pod_disruption: bool,
    /// Pod condition type that shows a drain set by someone else (an admin, a
    /// health check). Empty: not shown.
    pub foreign_drain_condition: String,
    /// Optional taint put on the Kubernetes node while one of its Slurm nodes
    /// has a drain set by someone else.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub foreign_drain_taint: Option<TaintSpec>,
}

impl Default for DrainPolicy {
    fn default() -> Self {
        Self {
            reason_prefix: "lockstep:".to_owned(),
            on_cordon: true,
            on_pod_disruption: true,
            foreign_drain_condition: "SlurmNodeDrained".to_owned(),
            foreign_drain_taint: None,
        }
    }
}

/// A taint lockstep sets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaintSpec {
    /// Taint key.
    pub key: String,
    /// Taint value.
    #[serde(default)]
    pub value: String,
    /// Effect.
    #[serde(default = "default_taint_effect")]
    pub effect: TaintEffect,
}

const fn default_taint_effect() -> TaintEffect {
    TaintEffect::NoSchedule
}

/// Health policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HealthPolicy {
    /// How long a Kubernetes node may be NotReady or Unknown before its Slurm
    /// nodes are taken out. Shorter blips do nothing.
    pub not_ready_grace_s: u64,
    /// Kubernetes node conditions that take the Slurm nodes out while True
    /// (GPU XID errors, NVLink, node-problem-detector, ...).
    pub node_conditions: Vec<String>,
    /// What to do to an unhealthy node's Slurm nodes: `drain` lets running
    /// jobs finish, `down` kills them.
    pub action: HealthAction,
    /// Once the cause clears, how long the node must stay healthy before
    /// lockstep resumes it (hysteresis).
    pub resume_after_s: u64,
    /// Flap damping: a node with more than this many health drains within
    /// `flap_window_s` stays drained for `flap_hold_s` after the last one.
    pub flaps_max: u32,
    /// Flap damping window.
    pub flap_window_s: u64,
    /// How long a flapping node is held drained.
    pub flap_hold_s: u64,
    /// Cluster-wide bound: at most this many health drains per minute of log
    /// time; more are deferred, so that a control-plane outage that marks
    /// every node NotReady does not drain the whole cluster at once.
    pub drains_per_minute_max: u32,
    /// Pod condition type that shows Slurm's view of the node's health
    /// (DOWN, NOT_RESPONDING, FAIL). Empty: not shown.
    pub slurm_health_condition: String,
    /// Taint put on a Kubernetes node while one of its Slurm nodes is DOWN,
    /// NOT_RESPONDING or FAIL and lockstep did not cause it. `null`: none.
    /// (Written out even when `null`: its default is a taint, so leaving it
    /// out would turn "no taint" into the default taint when read back, and
    /// a replay would not do what the live service did.)
    pub unhealthy_taint: Option<TaintSpec>,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            not_ready_grace_s: 60,
            node_conditions: Vec::new(),
            action: HealthAction::Drain,
            resume_after_s: 30,
            flaps_max: 3,
            flap_window_s: 3600,
            flap_hold_s: 1800,
            drains_per_minute_max: 50,
            slurm_health_condition: "SlurmNodeHealthy".to_owned(),
            unhealthy_taint: Some(TaintSpec {
                key: "lockstep.io/slurm-unhealthy".to_owned(),
                value: String::new(),
                effect: TaintEffect::NoSchedule,
            }),
        }
    }
}

/// See [`HealthPolicy::action`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthAction {
    /// `state=DRAIN`.
    Drain,
    /// `state=DOWN`.
    Down,
}

/// How actions in flight are retried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ActionPolicy {
    /// An action with no outcome, or whose effect is not observed, after this
    /// long (log time) counts as failed and is retried.
    pub timeout_s: u64,
    /// First retry delay after a failure.
    pub retry_backoff_initial_s: u64,
    /// Upper bound of the retry delay (it doubles per attempt).
    pub retry_backoff_max_s: u64,
    /// Attempts before lockstep gives up on a target until what it wants changes.
    pub attempts_max: u32,
}

impl Default for ActionPolicy {
    fn default() -> Self {
        Self {
            timeout_s: 60,
            retry_backoff_initial_s: 5,
            retry_backoff_max_s: 300,
            attempts_max: 8,
        }
    }
}

/// Topology policy: Kubernetes node labels become Slurm features and a
/// Slurm topology unit for the Slurm nodes on that Kubernetes node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TopologyPolicy {
    /// Labels whose values become Slurm features (`prefix` + value). lockstep
    /// only adds and removes features that start with one of these prefixes;
    /// all other features of a node are left as they are.
    pub features: Vec<LabelFeature>,
    /// The label that names the node's topology unit (a switch, block or
    /// NVLink clique, e.g. `nvidia.com/gpu.clique`). Unset: lockstep does not
    /// manage topology.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit_label: Option<String>,
    /// The Slurm topology the unit belongs to: the node's topology is set to
    /// `<topology_name>:<unit>`.
    pub topology_name: String,
}

impl Default for TopologyPolicy {
    fn default() -> Self {
        Self {
            features: Vec::new(),
            unit_label: None,
            topology_name: "default".to_owned(),
        }
    }
}

/// One label that becomes a Slurm feature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelFeature {
    /// Kubernetes node label key, e.g. `topology.kubernetes.io/zone`.
    pub label: String,
    /// Feature prefix, e.g. `zone-`; the feature is the prefix plus the value.
    pub prefix: String,
}

/// Scaling policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ScalingPolicy {
    /// One entry per scale target lockstep scales.
    pub targets: Vec<ScaleRule>,
    /// Pod label set on pods whose Slurm node runs a job, so that a
    /// PodDisruptionBudget selecting it keeps `kubectl drain` from evicting
    /// them (e.g. `lockstep.io/slurm-busy`). Empty (the default): no busy
    /// labels. Each job start and end on an idle node then costs one pod
    /// update in the API server.
    pub busy_label: String,
    /// Pending reasons (prefixes of Slurm's reason codes) that more nodes
    /// cannot fix: such jobs do not count as demand.
    pub unscalable_pending_reasons: Vec<String>,
    /// How often scale targets are re-evaluated while anything they depend
    /// on changes (log time); changes within this window are taken together.
    pub evaluate_every_s: u64,
}

impl Default for ScalingPolicy {
    fn default() -> Self {
        Self {
            targets: Vec::new(),
            busy_label: String::new(),
            unscalable_pending_reasons: [
                "Dependency",
                "JobHeld",
                "BeginTime",
                "QOS",
                "Assoc",
                "AccountNotAllowed",
                "PartitionDown",
                "PartitionInactive",
                "PartitionTimeLimit",
                "Reservation",
                "InvalidAccount",
                "InvalidQOS",
            ]
            .map(str::to_owned)
            .to_vec(),
            evaluate_every_s: 1,
        }
    }
}

/// How one scale target follows one Slurm partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScaleRule {
    /// The scale target (StatefulSet, Slinky NodeSet, ...).
    pub target: ScaleTargetRef,
    /// The Slurm partition whose jobs drive it.
    pub partition: String,
    /// Lower bound of replicas.
    #[serde(default)]
    pub min_replicas: u32,
    /// Upper bound of replicas.
    pub max_replicas: u32,
    /// Minimum time between two scale-ups.
    #[serde(default = "default_scale_up_cooldown_s")]
    pub scale_up_cooldown_s: u64,
    /// Minimum time between two scale-down decisions.
    #[serde(default = "default_scale_down_cooldown_s")]
    pub scale_down_cooldown_s: u64,
    /// How long a node must be idle before it may be scaled in.
    #[serde(default = "default_idle_before_scale_down_s")]
    pub idle_before_scale_down_s: u64,
    /// Rolling replacement: at most this many pods of an old revision are
    /// replaced (drained, then deleted) at a time.
    #[serde(default = "default_max_unavailable")]
    pub max_unavailable: u32,
}

const fn default_scale_up_cooldown_s() -> u64 {
    30
}

const fn default_scale_down_cooldown_s() -> u64 {
    120
}

const fn default_idle_before_scale_down_s() -> u64 {
    300
}

const fn default_max_unavailable() -> u32 {
    1
}

/// Errors from reading a policy document.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The document is not a valid policy (syntax, unknown field, bad value).
    #[error("invalid policy: {0}")]
    Invalid(#[source] serde_json::Error),
    /// A value is out of range.
    #[error("invalid policy: {0}")]
    Range(String),
}

impl Policy {
    /// Parses a JSON policy document and checks its values.
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        let policy: Policy = serde_json::from_str(text).map_err(PolicyError::Invalid)?;
        policy.validate()?;
        Ok(policy)
    }

    /// Checks values serde cannot.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let range = |what: &str| Err(PolicyError::Range(what.to_owned()));
        if self.drain.reason_prefix.trim().is_empty() {
            return range(
                "drain.reason_prefix must not be empty: it is how lockstep knows its own drains",
            );
        }
        if self.actions.attempts_max == 0 {
            return range("actions.attempts_max must be at least 1");
        }
        if self.actions.timeout_s == 0 {
            return range("actions.timeout_s must be at least 1");
        }
        if self.actions.retry_backoff_initial_s > self.actions.retry_backoff_max_s {
            return range(
                "actions.retry_backoff_initial_s must not exceed actions.retry_backoff_max_s",
            );
        }
        if self.health.drains_per_minute_max == 0 {
            return range("health.drains_per_minute_max must be at least 1");
        }
        for rule in &self.scaling.targets {
            if rule.min_replicas > rule.max_replicas {
                return Err(PolicyError::Range(format!(
                    "scaling target {}: min_replicas {} exceeds max_replicas {}",
                    rule.target, rule.min_replicas, rule.max_replicas
                )));
            }
            if rule.max_unavailable == 0 {
                return Err(PolicyError::Range(format!(
                    "scaling target {}: max_unavailable must be at least 1",
                    rule.target
                )));
            }
        }
        if self.topology.unit_label.is_some()
            && !crate::policy::valid_topology_token(&self.topology.topology_name)
        {
            return range("topology.topology_name must be a non-empty name of letters, digits, '-', '_' or '.'");
        }
        if self.mapping.mode == MappingMode::Pod && self.mapping.pod_selector.trim().is_empty() {
            return range("mapping.pod_selector must not be empty in pod mode");
        }
        Ok(())
    }
}

/// Whether a topology name or unit is safe to hand to Slurm: non-empty, at
/// most 64 characters of letters, digits, `-`, `_` and `.`. Anything else
/// would make slurmd register as INVALID_REG.
pub fn valid_topology_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_without_the_unhealthy_taint_reads_back_the_same() {
        let mut p = Policy::default();
        p.health.unhealthy_taint = None;
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p);
        let mp = rmp_serde::to_vec_named(&p).unwrap();
        assert_eq!(rmp_serde::from_slice::<Policy>(&mp).unwrap(), p);
        // Options whose default is `None` may be left out.
        let d = Policy::default();
        assert_eq!(
            serde_json::from_str::<Policy>(&serde_json::to_string(&d).unwrap()).unwrap(),
            d
        );
    }
}
