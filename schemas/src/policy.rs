//! The policy: everything that decides what the reducer wants.
//!
//! A policy enters the log as a `PolicyChanged` event, so a change takes
//! effect without restart, is audited, and replays deterministically. Every
//! field has a default; an empty document is the default policy. Unknown
//! fields are rejected so a typo is an error, not a silently ignored setting.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    /// Planned maintenance of Kubernetes nodes: a Slurm maintenance
    /// reservation ahead of the window, a drain during it, node lifecycle
    /// conditions that show the drain's progress.
    #[serde(skip_serializing_if = "MaintenancePolicy::is_default")]
    pub maintenance: MaintenancePolicy,
    /// Slurm's drains and downs shown on the Kubernetes Node itself: the
    /// node lifecycle conditions for lockstep's drains, a condition for
    /// drains by others, an annotation naming the node's Slurm nodes.
    #[serde(skip_serializing_if = "NodeSignalsPolicy::is_default")]
    pub node_signals: NodeSignalsPolicy,
}

/// Maintenance policy (`engine/src/maintenance.rs` has its rule table).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MaintenancePolicy {
    /// Act on announced maintenance (the `MaintenancePlanned` and
    /// `MaintenanceInProgress` node conditions, the
    /// `lockstep.dev/maintenance-window` annotation). Off by default, so a
    /// log recorded before this policy existed replays as it was decided.
    /// Reservations are made with scontrol: turn it on where lockstep has
    /// scontrol (`[slurm] slurm_conf`, the chart's `slurm.scontrol`).
    pub enabled: bool,
    /// Names of lockstep's reservations start with this, followed by the
    /// Kubernetes node name. Reservations of other names are never touched.
    pub reservation_prefix: String,
    /// `Users=` of the reservation: who may still run jobs inside it.
    pub reservation_users: String,
    /// Set the node lifecycle conditions `DrainInProgress` and `Drained` on
    /// a Kubernetes node whose Slurm nodes lockstep drains.
    pub node_conditions: bool,
}

impl Default for MaintenancePolicy {
    fn default() -> Self {
        Self {
            enabled: false,
            reservation_prefix: "lockstep_maint_".to_owned(),
            reservation_users: "root".to_owned(),
            node_conditions: true,
        }
    }
}

/// Slurm drains as node-level signals (`engine/src/shown.rs` rows 7 and 8,
/// `engine/src/maintenance.rs` rows 4-6). Everything is off by default:
/// turning one on writes to every Kubernetes node it concerns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NodeSignalsPolicy {
    /// Set the node lifecycle conditions `DrainInProgress` and `Drained` on a
    /// Kubernetes node while lockstep has every Slurm node on it drained or
    /// down, whatever the cause (a cordon, an eviction, health). With
    /// `maintenance.enabled`, `maintenance.node_conditions` does the same.
    pub drain_conditions: bool,
    /// Node condition type that is True on a Kubernetes node while one of
    /// its Slurm nodes is drained or down by somebody else (an admin, a
    /// health check, Slurm itself), naming them and their reasons; False
    /// once none is. Empty: not shown. E.g. `SlurmNodeDrained`.
    pub foreign_drain_condition: String,
    /// Annotation on each Kubernetes node naming the Slurm nodes on it
    /// (sorted, comma-separated), removed when none is. Empty: not set.
    /// E.g. `lockstep.dev/slurm-nodes`.
    pub slurm_nodes_annotation: String,
}

impl NodeSignalsPolicy {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl Policy {
    /// Whether lockstep shows the progress of its drains on Kubernetes nodes
    /// (`DrainInProgress`, `Drained`): under maintenance, or for every drain.
    pub fn drain_conditions_on(&self) -> bool {
        (self.maintenance.enabled && self.maintenance.node_conditions)
            || self.node_signals.drain_conditions
    }
}

impl MaintenancePolicy {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
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
    /// The Slurm user lockstep's drains are set by (the user its Slurm
    /// actuator runs `scontrol` or slurmrestd as). When set, and Slurm
    /// reports who set a node's reason (`reason_set_by_user`), that decides
    /// whether a drain is lockstep's, whatever its reason says: a drain
    /// lockstep made under an earlier `reason_prefix` stays its own, and one
    /// somebody else wrote with lockstep's prefix is not. Unset, or not
    /// reported: the reason prefix decides (the current one, or one lockstep
    /// used under an earlier policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_user: Option<String>,
    /// Answer the EvictionRequest API (Kubernetes `lifecycle.k8s.io/v1alpha1`,
    /// feature gate `EvictionRequestAPI`) as this eviction responder: slurmd
    /// pods that list it in `spec.evictionResponders` are evicted through
    /// Slurm. An Eviction of such a pod drains its Slurm node at once;
    /// lockstep reports progress on it while it is the active responder, and
    /// completes once the node is drained and runs no job, so that the
    /// eviction goes ahead; an eviction withdrawn lifts the drain. A
    /// prefixed name outside `k8s.io`, e.g. `lockstep.dev/slurm-drain`.
    /// Empty: off.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub eviction_responder: String,
    /// Name the Kubernetes node or pod a drain is for in its Slurm reason
    /// (`lockstep: kubernetes node k8s-17 cordoned`). Off, the reason says
    /// what happened without naming it (`lockstep: kubernetes node
    /// cordoned`): drains for one cause then share a reason, and lockstep
    /// writes those that wait together to Slurm in one request (scontrol, or
    /// slurmrestd v0.0.42 and later, take several nodes in one update)
    /// instead of one request per node, as when a node pool is cordoned at
    /// once. The audit trail and `kubectl lockstep why` name them either way.
    /// A change applies to drains written from then on; Slurm keeps the
    /// reasons of drains already made, but for a node whose Kubernetes node
    /// was deleted (that drain always says its cause, and is rewritten).
    #[serde(skip_serializing_if = "is_true")]
    #[schemars(extend("default" = true))]
    pub reason_names_nodes: bool,
    /// Reason prefixes of drains that their owner lifts by itself, without
    /// anybody's say: Slinky's slurm-operator undrains its own (`slurm-operator:
    /// `) once the pod is Ready on a Kubernetes node that is not cordoned.
    /// Such a drain keeps a node out like any other, but while the pod's
    /// Kubernetes node is not cordoned scaling does not count it as
    /// DRAINED: lockstep neither deletes a pod nor lowers a count past it,
    /// since a job could start between its lifting and the pod's removal.
    /// It waits until the drain is lifted and drains the node itself. On a
    /// cordoned node it counts (Slinky keeps it for the cordon). Empty:
    /// every drain counts. A prefix may not be blank nor overlap
    /// `reason_prefix`.
    #[serde(skip_serializing_if = "is_default_self_lifting")]
    #[schemars(extend("default" = ["slurm-operator: "]))]
    pub self_lifting_prefixes: Vec<String>,
}

/// The default of [`DrainPolicy::self_lifting_prefixes`]: Slinky's.
pub const SLINKY_REASON_PREFIX: &str = "slurm-operator: ";

fn is_default_self_lifting(v: &[String]) -> bool {
    v.len() == 1 && v[0] == SLINKY_REASON_PREFIX
}

impl DrainPolicy {
    /// Whether a drain with this reason is one its owner lifts by itself
    /// ([`Self::self_lifting_prefixes`]).
    pub fn self_lifting(&self, reason: Option<&str>) -> bool {
        reason.is_some_and(|r| {
            self.self_lifting_prefixes
                .iter()
                .any(|p| !p.is_empty() && r.starts_with(p.as_str()))
        })
    }
}

impl Default for DrainPolicy {
    fn default() -> Self {
        Self {
            reason_prefix: "lockstep:".to_owned(),
            on_cordon: true,
            on_pod_disruption: true,
            foreign_drain_condition: "SlurmNodeDrained".to_owned(),
            foreign_drain_taint: None,
            slurm_user: None,
            eviction_responder: String::new(),
            reason_names_nodes: true,
            self_lifting_prefixes: vec![SLINKY_REASON_PREFIX.to_owned()],
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
    /// Slurm -> Kubernetes: how long Slurm must report a node DOWN,
    /// NOT_RESPONDING or FAIL before lockstep shows it (the pod condition
    /// `slurm_health_condition`, the taint `unhealthy_taint`). Shorter blips
    /// (a slurmctld restart, a network hiccup between slurmctld and its
    /// nodes) show nothing. Like `not_ready_grace_s` in the other direction.
    /// (Left out when written at its default, as are the next two: a policy
    /// written by this version reads the same in it, and stays readable
    /// where the field is not known yet.)
    #[serde(skip_serializing_if = "is_default_slurm_unhealthy_grace_s")]
    pub slurm_unhealthy_grace_s: u64,
    /// Slurm -> Kubernetes, cluster-wide bound: at most this many nodes newly
    /// shown unhealthy per minute of log time; more wait their turn, so an
    /// outage seen by slurmctld alone does not rewrite every pod and node of
    /// the cluster at once. Like `drains_per_minute_max` in the other
    /// direction. 0 counts as 1.
    #[serde(skip_serializing_if = "is_default_slurm_unhealthy_per_minute_max")]
    pub slurm_unhealthy_per_minute_max: u32,
    /// Slurm -> Kubernetes: once Slurm reports a node healthy again, how long
    /// it must stay so before lockstep clears what it shows (hysteresis, like
    /// `resume_after_s`). A node shown unhealthy more than `flaps_max` times
    /// within `flap_window_s` stays shown for `flap_hold_s` after the last
    /// time, as flap damping does in the other direction.
    #[serde(skip_serializing_if = "is_default_slurm_healthy_after_s")]
    pub slurm_healthy_after_s: u64,
    /// Health-gated return to service: a node condition type that must be
    /// True on a Kubernetes node that came back as a different machine (its
    /// Node deleted and registered again, or a new UID, `providerID` or, with
    /// `return_after_reboot`, `bootID`) before lockstep lifts the drains it
    /// set on its Slurm nodes; the drain's cause clearing is not enough. On
    /// the same Node object after a reboot, the condition must be seen not
    /// True after it first (a True left from before proves nothing). Empty:
    /// off. E.g. `HealthCheckPassed`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub return_condition: String,
    /// With `return_condition`: a new `bootID` (a reboot, a reinstall on the
    /// same Node object) counts as a different machine.
    #[serde(skip_serializing_if = "is_true")]
    #[schemars(extend("default" = true))]
    pub return_after_reboot: bool,
    /// GPU and other DRA device faults: a device taint (on a device of a
    /// ResourceSlice, or from a DeviceTaintRule; effect NoSchedule or
    /// NoExecute) takes the Slurm nodes on the device's Kubernetes node out,
    /// and a device the kubelet reports Unhealthy in a pod's
    /// `allocatedResourcesStatus` takes that pod's Slurm node out, the device
    /// named in the reason; damped like every health cause, lifted when the
    /// taint is gone or the device healthy again.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub device_faults: bool,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
fn is_true(v: &bool) -> bool {
    *v
}

const fn default_slurm_unhealthy_grace_s() -> u64 {
    60
}

const fn default_slurm_unhealthy_per_minute_max() -> u32 {
    10
}

const fn default_slurm_healthy_after_s() -> u64 {
    30
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
fn is_default_slurm_unhealthy_grace_s(v: &u64) -> bool {
    *v == default_slurm_unhealthy_grace_s()
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
fn is_default_slurm_unhealthy_per_minute_max(v: &u32) -> bool {
    *v == default_slurm_unhealthy_per_minute_max()
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
fn is_default_slurm_healthy_after_s(v: &u64) -> bool {
    *v == default_slurm_healthy_after_s()
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
            slurm_unhealthy_grace_s: default_slurm_unhealthy_grace_s(),
            slurm_unhealthy_per_minute_max: default_slurm_unhealthy_per_minute_max(),
            slurm_healthy_after_s: default_slurm_healthy_after_s(),
            return_condition: String::new(),
            return_after_reboot: true,
            device_faults: false,
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
    /// How the controller of each kind of scale target removes pods when
    /// `replicas` drops, keyed by kind (`NodeSet`) or by API group and kind
    /// (`slinky.slurm.net/NodeSet`; this form wins). Scale-in follows it:
    /// lowering `replicas` makes the controller remove pods, and lockstep
    /// never lets that remove a pod whose Slurm node runs a job. Kinds not
    /// named here: `StatefulSet` is `highest_ordinal`, `ReplicaSet` and
    /// `Deployment` (group `apps`) are `deletion_cost`; any other kind is
    /// only ever scaled up until its rule is named here.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub removal: BTreeMap<String, Removal>,
}

/// How a controller removes pods when its replica count drops, and so how
/// lockstep scales its target in. In every case victims are drained first
/// and `replicas` is lowered only when each pod it will make the controller
/// remove has a Slurm node that is DRAINED (DRAIN, not ALLOCATED, MIXED or
/// COMPLETING) and holds no job; when lockstep cannot tell (Slurm not
/// visible, a pod or Slurm node not known) it does not scale in.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Removal {
    /// The controller removes the highest ordinals (pods `<name>-<ordinal>`)
    /// first, and recreates any lower one that is deleted (StatefulSet).
    /// lockstep picks only the top ordinals, each idle long enough, as
    /// victims (a busy one stops the scale-in below it), drains them, and
    /// lowers `replicas` past an ordinal only once it and every ordinal above
    /// it are DRAINED, or their pods are being deleted already and their
    /// Slurm nodes hold no job and take none (DOWN or not answering). It
    /// deletes no pod itself.
    HighestOrdinal,
    /// The controller removes, among assigned, Running and Ready pods, the
    /// ones with the lowest `controller.kubernetes.io/pod-deletion-cost`
    /// first (ReplicaSet, Deployment). lockstep picks idle pods, drains
    /// them, gives each DRAINED victim the lowest cost (-2147483648), and
    /// lowers `replicas` by their number only while every other pod of the
    /// target is Running, Ready, not being deleted and costs more, so the
    /// controller has no other choice.
    DeletionCost,
    /// The controller removes exactly the pods that are gone when `replicas`
    /// drops and does not recreate a pod deleted before that (a StatefulSet
    /// does recreate it: never use this for one). lockstep picks idle pods,
    /// drains them, deletes each once DRAINED (with its UID as a
    /// precondition), then lowers `replicas` by the pods gone, and only while
    /// no more pods exist than the new count.
    DeletePod,
    /// The controller drains the Slurm node of each pod it removes and
    /// deletes the pod only once the node is DRAINED (the Slinky NodeSet
    /// controller documents this). lockstep drains and deletes nothing; it
    /// lowers `replicas` by at most the number of pods idle long enough.
    ControllerDrains,
}

impl ScalingPolicy {
    /// The removal rule of a scale target's kind (see [`ScalingPolicy::removal`]);
    /// `None`: the kind is not known and not configured, so it is never
    /// scaled in.
    pub fn removal_of(&self, target: &ScaleTargetRef) -> Option<Removal> {
        let qualified = format!("{}/{}", target.group, target.kind);
        if let Some(r) = self
            .removal
            .get(&qualified)
            .or_else(|| self.removal.get(&target.kind))
        {
            return Some(*r);
        }
        match (target.group.as_str(), target.kind.as_str()) {
            ("apps", "StatefulSet") => Some(Removal::HighestOrdinal),
            ("apps", "ReplicaSet" | "Deployment") => Some(Removal::DeletionCost),
            _ => None,
        }
    }
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
            removal: BTreeMap::new(),
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

/// Errors from reading a policy document. Each names the field at fault by
/// its path in the document, e.g. `scaling.targets[0].idle_before_scale_down_s`.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The document is not a valid policy (syntax, unknown field, bad value).
    #[error("invalid policy: {0}")]
    Invalid(#[source] serde_json::Error),
    /// The document, or a section of it, is not a map of named fields
    /// (serde would otherwise take a list's items as the fields in order).
    #[error("invalid policy: {field}: expected a map of named fields, found {found}")]
    NotAMap {
        /// Where: the field path, or `(document)` for the whole document.
        field: String,
        /// What was found instead.
        found: &'static str,
    },
    /// A value is out of range.
    #[error("invalid policy: {field}: {reason}")]
    Range {
        /// The field path.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Errors from reading a policy file: which file, and what is wrong with it
/// (the cause, as the error's source). Not retryable as such: a file that
/// does not read or parse stays so until someone changes it.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    /// The file cannot be read (missing, unreadable, not UTF-8).
    #[error("reading policy file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why it does not read.
        #[source]
        source: std::io::Error,
    },
    /// The file reads but is not a valid policy.
    #[error("in policy file {}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with the document.
        #[source]
        source: PolicyError,
    },
}

impl PolicyFileError {
    /// The file at fault.
    pub fn path(&self) -> &Path {
        match self {
            Self::Read { path, .. } | Self::Invalid { path, .. } => path,
        }
    }
}

/// The longest duration any `*_s` field may hold: 100 years, in seconds.
/// Log time is ms since the Unix epoch in a u64; a duration up to this bound,
/// in ms, added to any log time of the next thousands of years, cannot
/// overflow, so "never" is spelt as a large value that means it, not one
/// that wraps to "in 10 s".
pub const DURATION_S_MAX: u64 = 100 * 36_525 * 864; // 100 * 365.25 days

/// The largest value of any count (replicas, attempts, rates, bounds).
pub const COUNT_MAX: u64 = 1_000_000;

impl Policy {
    /// Parses a JSON policy document and checks its values.
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        // A document that is valid JSON must have a map wherever the policy
        // has a section. (Invalid JSON gets serde's positioned message below.)
        if let Ok(doc) = serde_json::from_str::<serde_json::Value>(text) {
            let schema = serde_json::to_value(schemars::schema_for!(Policy))
                .expect("the policy schema is JSON");
            require_maps(&doc, &schema, &schema, &FieldPath::root())?;
        }
        let policy: Policy = serde_json::from_str(text).map_err(PolicyError::Invalid)?;
        policy.validate()?;
        Ok(policy)
    }

    /// Reads a policy file (JSON) and checks its values: what every reader
    /// of a policy file (the CLI, `lockstep run`) goes through.
    pub fn from_file(path: &Path) -> Result<Self, PolicyFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_file_text(path, &text)
    }

    /// The policy in `text`, the content of the policy file at `path` (which
    /// the error names), for a reader that already holds the text: the
    /// service reads the file once per change, to compare it with the last
    /// content it saw, and parses that.
    pub fn from_file_text(path: &Path, text: &str) -> Result<Self, PolicyFileError> {
        Self::from_json(text).map_err(|source| PolicyFileError::Invalid {
            path: path.to_owned(),
            source,
        })
    }

    /// Checks values serde cannot. Every policy that is loaded (a policy
    /// file, the policy `lockstep run` starts with, each `PolicyChanged` the
    /// service appends) passes through here; policies already in a log are
    /// not checked again, so old logs replay as they were.
    ///
    /// Every integer field is bounded by its name, so a field added later is
    /// covered too: `*_s` by [`DURATION_S_MAX`], `*_ms` by the same in ms,
    /// every other integer (a count) by [`COUNT_MAX`].
    pub fn validate(&self) -> Result<(), PolicyError> {
        let doc = serde_json::to_value(self).expect("a policy is JSON");
        check_bounds(&doc, &FieldPath::root())?;
        let range = |field: &str, reason: &str| {
            Err(PolicyError::Range {
                field: field.to_owned(),
                reason: reason.to_owned(),
            })
        };
        if self.drain.reason_prefix.trim().is_empty() {
            return range(
                "drain.reason_prefix",
                "must not be empty: it is how lockstep knows its own drains",
            );
        }
        for (i, prefix) in self.drain.self_lifting_prefixes.iter().enumerate() {
            let own = self.drain.reason_prefix.as_str();
            if prefix.trim().is_empty() {
                return Err(PolicyError::Range {
                    field: format!("drain.self_lifting_prefixes[{i}]"),
                    reason: "must not be empty: it would match every drain".to_owned(),
                });
            }
            if prefix.starts_with(own) || own.starts_with(prefix.as_str()) {
                return Err(PolicyError::Range {
                    field: format!("drain.self_lifting_prefixes[{i}]"),
                    reason: format!(
                        "{prefix:?} overlaps drain.reason_prefix {own:?}: lockstep's own drains are not lifted by anybody else"
                    ),
                });
            }
        }
        if self.actions.attempts_max == 0 {
            return range("actions.attempts_max", "must be at least 1");
        }
        if self.actions.timeout_s == 0 {
            return range("actions.timeout_s", "must be at least 1");
        }
        if self.actions.retry_backoff_initial_s > self.actions.retry_backoff_max_s {
            return range(
                "actions.retry_backoff_initial_s",
                "must not exceed actions.retry_backoff_max_s",
            );
        }
        if self.health.drains_per_minute_max == 0 {
            return range("health.drains_per_minute_max", "must be at least 1");
        }
        for (i, rule) in self.scaling.targets.iter().enumerate() {
            if rule.min_replicas > rule.max_replicas {
                return Err(PolicyError::Range {
                    field: format!("scaling.targets[{i}].min_replicas"),
                    reason: format!(
                        "{} exceeds max_replicas {} (target {})",
                        rule.min_replicas, rule.max_replicas, rule.target
                    ),
                });
            }
            if rule.max_unavailable == 0 {
                return Err(PolicyError::Range {
                    field: format!("scaling.targets[{i}].max_unavailable"),
                    reason: format!("must be at least 1 (target {})", rule.target),
                });
            }
        }
        if self.topology.unit_label.is_some()
            && !crate::policy::valid_topology_token(&self.topology.topology_name)
        {
            return range(
                "topology.topology_name",
                "must be a non-empty name of letters, digits, '-', '_' or '.'",
            );
        }
        if self.mapping.mode == MappingMode::Pod && self.mapping.pod_selector.trim().is_empty() {
            return range("mapping.pod_selector", "must not be empty in pod mode");
        }
        if !crate::policy::valid_topology_token(&self.maintenance.reservation_prefix) {
            return range(
                "maintenance.reservation_prefix",
                "must be a non-empty name of letters, digits, '-', '_' or '.': it is how lockstep knows its own reservations",
            );
        }
        if self.maintenance.reservation_users.is_empty()
            || !self
                .maintenance
                .reservation_users
                .split(',')
                .all(valid_topology_token)
        {
            return range(
                "maintenance.reservation_users",
                "must be a comma-separated list of Slurm user names",
            );
        }
        let responder = self.drain.eviction_responder.as_str();
        if !responder.is_empty() {
            let domain = responder.split_once('/').map(|(d, _)| d);
            let reserved = domain.is_some_and(|d| {
                ["k8s.io", "kubernetes.io"]
                    .iter()
                    .any(|r| d == *r || d.ends_with(&format!(".{r}")))
            });
            if domain.is_none() || reserved || !valid_qualified_name(responder) {
                return range(
                    "drain.eviction_responder",
                    "must be a prefixed name (DOMAIN/NAME) outside k8s.io and kubernetes.io, as Kubernetes requires of eviction responders",
                );
            }
        }
        let rc = self.health.return_condition.as_str();
        if !rc.is_empty() {
            if !valid_qualified_name(rc) {
                return range(
                    "health.return_condition",
                    "must be a condition type: a name of letters, digits, '-', '_' or '.', with an optional DNS prefix and '/'",
                );
            }
            if self.health.node_conditions.iter().any(|c| c == rc) {
                return range(
                    "health.return_condition",
                    "must not be one of health.node_conditions: those drain while True, this one lets a node return while True",
                );
            }
        }
        let signals = &self.node_signals;
        let fdc = signals.foreign_drain_condition.as_str();
        if !fdc.is_empty() {
            if !valid_qualified_name(fdc) {
                return range(
                    "node_signals.foreign_drain_condition",
                    "must be a condition type: a name of letters, digits, '-', '_' or '.', with an optional DNS prefix and '/'",
                );
            }
            if self.health.node_conditions.iter().any(|c| c == fdc)
                || [crate::event::DRAIN_IN_PROGRESS, crate::event::DRAINED].contains(&fdc)
            {
                return range(
                    "node_signals.foreign_drain_condition",
                    "must not be a condition lockstep reads as a health cause or sets for its own drains: lockstep would act on what it shows",
                );
            }
        }
        let annotation = signals.slurm_nodes_annotation.as_str();
        if !annotation.is_empty() && !valid_qualified_name(annotation) {
            return range(
                "node_signals.slurm_nodes_annotation",
                "must be an annotation key: a name of letters, digits, '-', '_' or '.', with an optional DNS prefix and '/'",
            );
        }
        Ok(())
    }
}

/// A Kubernetes qualified name (label and annotation keys, condition types):
/// an optional DNS subdomain prefix and `/`, then 1-63 characters of letters,
/// digits, `-`, `_` and `.`, beginning and ending with a letter or digit.
fn valid_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let alnum_ends = |t: &str| {
        t.starts_with(|c: char| c.is_ascii_alphanumeric())
            && t.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    let name_ok = (1..=63).contains(&name.len())
        && alnum_ends(name)
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    let prefix_ok = prefix.is_none_or(|p| {
        (1..=253).contains(&p.len())
            && p.split('.').all(|l| {
                (1..=63).contains(&l.len())
                    && alnum_ends(l)
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    name_ok && prefix_ok
}

/// A field's path in a policy document, for messages.
struct FieldPath(String);

impl FieldPath {
    fn root() -> Self {
        Self(String::new())
    }

    fn key(&self, key: &str) -> Self {
        if self.0.is_empty() {
            Self(key.to_owned())
        } else {
            Self(format!("{}.{key}", self.0))
        }
    }

    fn index(&self, i: usize) -> Self {
        Self(format!("{}[{i}]", self.0))
    }

    fn name(&self) -> String {
        if self.0.is_empty() {
            "(document)".to_owned()
        } else {
            self.0.clone()
        }
    }

    /// The last key: what the field is called.
    fn last_key(&self) -> &str {
        let tail = self.0.rsplit('.').next().unwrap_or("");
        tail.split('[').next().unwrap_or(tail)
    }
}

/// Wherever the policy's JSON Schema says a value is an object (a section, a
/// scale rule, a taint), the document must have a map: serde's derived
/// deserializers also take a list, its items as the fields in order.
fn require_maps(
    value: &serde_json::Value,
    schema: &serde_json::Value,
    root: &serde_json::Value,
    path: &FieldPath,
) -> Result<(), PolicyError> {
    use serde_json::Value;
    let schema = resolve(schema, root);
    let alternatives = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array);
    if let Some(alternatives) = alternatives {
        if value.is_null() {
            return Ok(());
        }
        // The alternatives whose type admits the value decide; if none
        // does and one of them is a map, the value should have been one.
        let mut wants_map = false;
        let mut first_err = None;
        for alt in alternatives {
            let alt = resolve(alt, root);
            let types = schema_types(alt);
            wants_map |= types.contains(&"object");
            if !types.is_empty() && !types.iter().any(|t| admits(t, value)) {
                continue;
            }
            match require_maps(value, alt, root, path) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        return match first_err {
            Some(e) => Err(e),
            None if wants_map => Err(PolicyError::NotAMap {
                field: path.name(),
                found: json_kind(value),
            }),
            None => Ok(()),
        };
    }
    let types = schema_types(schema);
    if types.contains(&"object") {
        if value.is_null() && types.contains(&"null") {
            return Ok(());
        }
        let Some(map) = value.as_object() else {
            return Err(PolicyError::NotAMap {
                field: path.name(),
                found: json_kind(value),
            });
        };
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (key, sub) in props {
                if let Some(v) = map.get(key) {
                    require_maps(v, sub, root, &path.key(key))?;
                }
            }
        }
    } else if types.contains(&"array") {
        if let (Some(items), Some(list)) = (schema.get("items"), value.as_array()) {
            for (i, v) in list.iter().enumerate() {
                require_maps(v, items, root, &path.index(i))?;
            }
        }
    }
    Ok(())
}

/// The JSON types a schema allows; empty: any.
fn schema_types(schema: &serde_json::Value) -> Vec<&str> {
    match schema.get("type") {
        Some(serde_json::Value::String(t)) => vec![t.as_str()],
        Some(serde_json::Value::Array(ts)) => {
            ts.iter().filter_map(serde_json::Value::as_str).collect()
        }
        _ => Vec::new(),
    }
}

/// Whether JSON Schema type `ty` admits `value`.
fn admits(ty: &str, value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (ty, value) {
        ("null", Value::Null)
        | ("boolean", Value::Bool(_))
        | ("number", Value::Number(_))
        | ("string", Value::String(_))
        | ("array", Value::Array(_))
        | ("object", Value::Object(_)) => true,
        ("integer", Value::Number(n)) => n.is_u64() || n.is_i64(),
        _ => false,
    }
}

/// Follows `$ref`s into the schema's `$defs`.
fn resolve<'a>(
    mut schema: &'a serde_json::Value,
    root: &'a serde_json::Value,
) -> &'a serde_json::Value {
    // Bounded: a schema's references never go this deep.
    for _ in 0..16 {
        let Some(name) = schema
            .get("$ref")
            .and_then(serde_json::Value::as_str)
            .and_then(|r| r.strip_prefix("#/$defs/"))
        else {
            break;
        };
        match root.get("$defs").and_then(|d| d.get(name)) {
            Some(def) => schema = def,
            None => break,
        }
    }
    schema
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a map",
    }
}

/// Bounds every integer of the policy by its field's name (see
/// [`Policy::validate`]).
fn check_bounds(value: &serde_json::Value, path: &FieldPath) -> Result<(), PolicyError> {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                check_bounds(v, &path.key(key))?;
            }
        }
        Value::Array(list) => {
            for (i, v) in list.iter().enumerate() {
                check_bounds(v, &path.index(i))?;
            }
        }
        Value::Number(n) => {
            let key = path.last_key();
            let (max, unit) = if key.ends_with("_s") {
                (DURATION_S_MAX, " s (100 years)")
            } else if key.ends_with("_ms") {
                (DURATION_S_MAX * 1000, " ms (100 years)")
            } else {
                (COUNT_MAX, "")
            };
            let fits = match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(v), _, _) => v <= max,
                (None, Some(v), _) => v.unsigned_abs() <= max,
                (None, None, Some(f)) => f.is_finite() && f.abs() <= max as f64,
                (None, None, None) => false,
            };
            if !fits {
                return Err(PolicyError::Range {
                    field: path.name(),
                    reason: format!("{n} is more than the largest allowed value, {max}{unit}"),
                });
            }
        }
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
    Ok(())
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

    fn refused(doc: &str) -> String {
        match Policy::from_json(doc) {
            Ok(p) => panic!("{doc} was accepted: {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// Node signals: what lockstep would read back as a cause, or cannot
    /// write to Kubernetes, is refused by field.
    #[test]
    fn node_signals_are_checked() {
        let cases = [
            (
                r#"{"health": {"node_conditions": ["SlurmNodeDrained"]}, "node_signals": {"foreign_drain_condition": "SlurmNodeDrained"}}"#,
                "node_signals.foreign_drain_condition",
            ),
            (
                r#"{"node_signals": {"foreign_drain_condition": "Drained"}}"#,
                "node_signals.foreign_drain_condition",
            ),
            (
                r#"{"node_signals": {"foreign_drain_condition": "slurm drained"}}"#,
                "node_signals.foreign_drain_condition",
            ),
            (
                r#"{"node_signals": {"slurm_nodes_annotation": "Lockstep.dev/slurm-nodes"}}"#,
                "node_signals.slurm_nodes_annotation",
            ),
            (
                r#"{"node_signals": {"slurm_nodes_annotation": "lockstep.dev/"}}"#,
                "node_signals.slurm_nodes_annotation",
            ),
        ];
        for (doc, field) in cases {
            let err = refused(doc);
            assert!(
                err.starts_with(&format!("invalid policy: {field}: ")),
                "{doc}: {err}"
            );
        }
        for doc in [
            r#"{"drain": {"eviction_responder": "slurm-drain"}}"#,
            r#"{"drain": {"eviction_responder": "lockstep.k8s.io/slurm-drain"}}"#,
        ] {
            let err = refused(doc);
            assert!(
                err.starts_with("invalid policy: drain.eviction_responder: "),
                "{doc}: {err}"
            );
        }
        Policy::from_json(r#"{"drain": {"eviction_responder": "lockstep.dev/slurm-drain"}}"#)
            .unwrap();
        for doc in [
            r#"{"health": {"node_conditions": ["Ok"], "return_condition": "Ok"}}"#,
            r#"{"health": {"return_condition": "ok ok"}}"#,
        ] {
            let err = refused(doc);
            assert!(
                err.starts_with("invalid policy: health.return_condition: "),
                "{doc}: {err}"
            );
        }
        let ok = Policy::from_json(
            r#"{"node_signals": {"drain_conditions": true, "foreign_drain_condition": "SlurmNodeDrained", "slurm_nodes_annotation": "lockstep.dev/slurm-nodes"}}"#,
        )
        .unwrap();
        assert!(ok.drain_conditions_on());
        assert!(!Policy::default().drain_conditions_on());
        // Off, the section is left out of the policy as written to the log:
        // a log of a policy without it reads the same.
        let written = serde_json::to_string(&Policy::default()).unwrap();
        assert!(!written.contains("node_signals"), "{written}");
    }

    const RULE: &str = r#"{"target": {"group": "apps", "kind": "StatefulSet", "namespace": "slurm", "name": "gpu"}, "partition": "batch", "max_replicas": 4"#;

    #[test]
    fn durations_and_counts_that_do_not_fit_are_refused_by_field() {
        let rule = |extra: &str| format!(r#"{{"scaling": {{"targets": [{RULE}, {extra}}}]}}}}"#);
        // (document, the field path the error names)
        let cases = [
            (
                rule(r#""idle_before_scale_down_s": 18446744073709551615"#),
                "scaling.targets[0].idle_before_scale_down_s",
            ),
            (
                rule(r#""scale_up_cooldown_s": 3155760001"#),
                "scaling.targets[0].scale_up_cooldown_s",
            ),
            (
                rule(r#""max_unavailable": 4294967295"#),
                "scaling.targets[0].max_unavailable",
            ),
            (
                r#"{"health": {"not_ready_grace_s": 18446744073709551615}}"#.to_owned(),
                "health.not_ready_grace_s",
            ),
            (
                r#"{"health": {"flap_hold_s": 9223372036854775807}}"#.to_owned(),
                "health.flap_hold_s",
            ),
            (
                r#"{"actions": {"timeout_s": 18446744073709551615}}"#.to_owned(),
                "actions.timeout_s",
            ),
            (
                r#"{"scaling": {"evaluate_every_s": 18446744073709551615}}"#.to_owned(),
                "scaling.evaluate_every_s",
            ),
            (
                r#"{"health": {"flaps_max": 4294967295}}"#.to_owned(),
                "health.flaps_max",
            ),
            (
                r#"{"actions": {"attempts_max": 1000001}}"#.to_owned(),
                "actions.attempts_max",
            ),
        ];
        for (doc, field) in cases {
            let err = refused(&doc);
            assert!(
                err.starts_with(&format!("invalid policy: {field}: ")),
                "{doc}: {err}"
            );
            assert!(err.contains("largest allowed value"), "{doc}: {err}");
        }
        // The bounds themselves are fine: "never" is 100 years.
        let ok = rule(&format!(
            r#""idle_before_scale_down_s": {DURATION_S_MAX}, "scale_down_cooldown_s": {DURATION_S_MAX}"#
        ));
        Policy::from_json(&ok).unwrap();
        Policy::from_json(&format!(
            r#"{{"health": {{"flap_hold_s": {DURATION_S_MAX}, "flaps_max": {COUNT_MAX}}}}}"#
        ))
        .unwrap();
        // In ms, 100 years added to any log time of this millennium fits.
        assert!((DURATION_S_MAX * 1000)
            .checked_add(32_503_680_000_000)
            .is_some());
    }

    #[test]
    fn every_section_must_be_a_map_not_a_list() {
        // (document, the field path the error names, what it found)
        let cases = [
            (r#"[{}, {}, {}]"#.to_owned(), "(document)", "a list"),
            (r#""drain""#.to_owned(), "(document)", "a string"),
            (
                r#"{"health": [60, [], "down"]}"#.to_owned(),
                "health",
                "a list",
            ),
            (
                r#"{"drain": {"foreign_drain_taint": ["k", "v", "NoSchedule"]}}"#.to_owned(),
                "drain.foreign_drain_taint",
                "a list",
            ),
            (
                format!(r#"{{"scaling": {{"targets": [{RULE}}}, ["x", "batch", 0, 4]]}}}}"#),
                "scaling.targets[1]",
                "a list",
            ),
            (
                r#"{"scaling": {"targets": [{"target": ["apps", "StatefulSet", "slurm", "gpu"], "partition": "b", "max_replicas": 1}]}}"#.to_owned(),
                "scaling.targets[0].target",
                "a list",
            ),
            (
                r#"{"topology": {"features": [["zone", "zone-"]]}}"#.to_owned(),
                "topology.features[0]",
                "a list",
            ),
        ];
        for (doc, field, found) in cases {
            let err = refused(&doc);
            assert_eq!(
                err,
                format!("invalid policy: {field}: expected a map of named fields, found {found}"),
                "{doc}"
            );
        }
        // Optional sections may be null; lists of plain values stay lists.
        let p = Policy::from_json(
            r#"{"drain": {"foreign_drain_taint": null}, "health": {"node_conditions": ["GpuXid"], "unhealthy_taint": null}}"#,
        )
        .unwrap();
        assert_eq!(p.health.node_conditions, ["GpuXid"]);
        assert_eq!(p.health.unhealthy_taint, None);
    }

    #[test]
    fn other_checks_name_their_field() {
        // (document, the start of the error)
        for (doc, says) in [
            (
                r#"{"drain": {"reason_prefix": " "}}"#,
                "invalid policy: drain.reason_prefix: must not be empty",
            ),
            (
                r#"{"drain": {"self_lifting_prefixes": ["slurm-operator: ", " "]}}"#,
                "invalid policy: drain.self_lifting_prefixes[1]: must not be empty",
            ),
            (
                r#"{"drain": {"self_lifting_prefixes": ["lockstep: scale"]}}"#,
                "invalid policy: drain.self_lifting_prefixes[0]: \"lockstep: scale\" overlaps drain.reason_prefix",
            ),
            (
                r#"{"actions": {"attempts_max": 0}}"#,
                "invalid policy: actions.attempts_max: must be at least 1",
            ),
            (
                r#"{"actions": {"timeout_s": 0}}"#,
                "invalid policy: actions.timeout_s: must be at least 1",
            ),
            (
                r#"{"mapping": {"pod_selector": ""}}"#,
                "invalid policy: mapping.pod_selector: ",
            ),
        ] {
            let err = refused(doc);
            assert!(err.starts_with(says), "{doc}: {err}");
        }
    }

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

    #[test]
    fn self_lifting_prefixes_default_to_slinkys_and_an_empty_list_reads_back_empty() {
        let d = Policy::default();
        let json = serde_json::to_string(&d).unwrap();
        assert!(!json.contains("self_lifting_prefixes"), "{json}");
        assert!(d
            .drain
            .self_lifting(Some("slurm-operator: Pod is terminating")));
        assert!(!d.drain.self_lifting(Some("lockstep: scale-in")));
        assert!(!d.drain.self_lifting(Some("slurm-operator:no space")));
        assert!(!d.drain.self_lifting(None));
        let mut none = Policy::default();
        none.drain.self_lifting_prefixes.clear();
        let json = serde_json::to_string(&none).unwrap();
        assert!(json.contains("\"self_lifting_prefixes\":[]"), "{json}");
        let back = serde_json::from_str::<Policy>(&json).unwrap();
        assert_eq!(back, none);
        assert!(!back
            .drain
            .self_lifting(Some("slurm-operator: Pod is terminating")));
    }

    #[test]
    fn a_policy_file_error_names_the_file_and_what_is_wrong() {
        use std::error::Error as _;
        let dir = std::env::temp_dir().join(format!("lockstep-policy-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.json");
        let err = Policy::from_file(&missing).unwrap_err();
        assert!(matches!(err, PolicyFileError::Read { .. }), "{err:?}");
        assert_eq!(err.path(), missing);
        assert_eq!(
            err.to_string(),
            format!("reading policy file {}", missing.display())
        );

        let list = dir.join("list.json");
        std::fs::write(&list, "[{}, {}]").unwrap();
        let err = Policy::from_file(&list).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("in policy file {}", list.display())
        );
        assert_eq!(
            err.source().unwrap().to_string(),
            "invalid policy: (document): expected a map of named fields, found a list"
        );

        let good = dir.join("good.json");
        std::fs::write(&good, r#"{"health": {"not_ready_grace_s": 5}}"#).unwrap();
        let text = std::fs::read_to_string(&good).unwrap();
        assert_eq!(
            Policy::from_file(&good).unwrap(),
            Policy::from_file_text(&good, &text).unwrap()
        );
        assert_eq!(
            Policy::from_file(&good).unwrap().health.not_ready_grace_s,
            5
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
