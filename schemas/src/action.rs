//! The action vocabulary: what the reducer asks actuators to do.
//!
//! Actions are plain data (a closed enum, no closures). Each has a
//! [`Target`], the one aspect of one object it changes; the reducer keeps at
//! most one action in flight per target.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::event::{ConditionStatus, Connector, PodCondition, ScaleTargetRef, Taint};

/// One change to Slurm or Kubernetes that the reducer wants made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// `scontrol update nodename=N state=DRAIN reason=R`.
    SlurmDrain {
        /// Slurm node.
        node: String,
        /// Reason; lockstep's own drains start with the policy's reason prefix.
        reason: String,
    },
    /// `scontrol update nodename=N state=RESUME`: lifts a drain or down lockstep owns.
    SlurmResume {
        /// Slurm node.
        node: String,
    },
    /// `scontrol update nodename=N state=DOWN reason=R`.
    SlurmDown {
        /// Slurm node.
        node: String,
        /// Reason, with the policy's reason prefix.
        reason: String,
    },
    /// Set a node's active features.
    SlurmSetFeatures {
        /// Slurm node.
        node: String,
        /// The full feature list, sorted.
        features: Vec<String>,
    },
    /// Set a node's topology string.
    SlurmSetTopology {
        /// Slurm node.
        node: String,
        /// Topology, e.g. `default:switch1:block3`.
        topology: String,
    },
    /// Set (create or update) one condition on a pod's status.
    KubeSetPodCondition {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// The condition as it should be.
        condition: PodCondition,
    },
    /// Add a taint to a Kubernetes node (replacing one with the same key).
    KubeTaintNode {
        /// Kubernetes node.
        node: String,
        /// The taint.
        taint: Taint,
    },
    /// Remove the taint with this key from a Kubernetes node.
    KubeUntaintNode {
        /// Kubernetes node.
        node: String,
        /// Taint key.
        key: String,
    },
    /// Set or remove one label on a pod; with a key `annotation:<key>`, one
    /// annotation (the convention of observed pod and node labels), e.g.
    /// `controller.kubernetes.io/pod-deletion-cost` on a scale-in victim.
    KubeLabelPod {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// Label key, or `annotation:<key>`.
        key: String,
        /// Value to set; `None` removes the label.
        value: Option<String>,
    },
    /// Delete a pod, only if its UID is still this one.
    KubeDeletePod {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// UID precondition.
        uid: String,
    },
    /// Set the replica count of a scale target.
    KubeScale {
        /// Which object.
        target: ScaleTargetRef,
        /// Replicas wanted.
        replicas: u32,
    },
    /// Create, or bring up to date, a maintenance reservation
    /// (`Flags=MAINT,IGNORE_JOBS`): the scheduler starts no job on these
    /// nodes that would still run at `start_ms`.
    SlurmReserve {
        /// Reservation name, with the policy's reservation prefix.
        name: String,
        /// Slurm nodes, sorted.
        nodes: Vec<String>,
        /// Start (ms since the epoch); one in the past starts it now.
        start_ms: u64,
        /// End (ms since the epoch); `None`: until it is removed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        end_ms: Option<u64>,
        /// Slurm users who may still run jobs in it (`Users=`).
        users: String,
    },
    /// Delete a reservation lockstep made.
    SlurmUnreserve {
        /// Reservation name.
        name: String,
    },
    /// Set (create or update) one condition on a Kubernetes node's status,
    /// e.g. the node lifecycle conditions `DrainInProgress` and `Drained`.
    KubeSetNodeCondition {
        /// Kubernetes node.
        node: String,
        /// The condition as it should be (the shape pods and nodes share).
        condition: PodCondition,
    },
    /// Report lockstep's progress on an eviction of a pod as its eviction
    /// responder (a server-side apply of its `status.responders` entry:
    /// `heartbeatTime` and `message`, and `completionTime` when `complete`).
    KubeRespondEviction {
        /// Pod namespace (the Eviction's).
        namespace: String,
        /// Pod name.
        pod: String,
        /// The Eviction object.
        eviction: String,
        /// lockstep's responder name.
        responder: String,
        /// What lockstep says of it.
        message: String,
        /// The heartbeat's period number (log time / period): a new one is
        /// a new report.
        beat: u64,
        /// lockstep is done: the eviction may go ahead.
        complete: bool,
    },
    /// Set or remove one label on a Kubernetes node; with a key
    /// `annotation:<key>`, one annotation (as for [`Action::KubeLabelPod`]),
    /// e.g. the annotation naming the node's Slurm nodes.
    KubeLabelNode {
        /// Kubernetes node.
        node: String,
        /// Label key, or `annotation:<key>`.
        key: String,
        /// Value to set; `None` removes it.
        value: Option<String>,
    },
}

/// The kind of an action: a closed set, usable as a metric label.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// [`Action::SlurmDrain`].
    SlurmDrain,
    /// [`Action::SlurmResume`].
    SlurmResume,
    /// [`Action::SlurmDown`].
    SlurmDown,
    /// [`Action::SlurmSetFeatures`].
    SlurmSetFeatures,
    /// [`Action::SlurmSetTopology`].
    SlurmSetTopology,
    /// [`Action::KubeSetPodCondition`].
    KubeSetPodCondition,
    /// [`Action::KubeTaintNode`].
    KubeTaintNode,
    /// [`Action::KubeUntaintNode`].
    KubeUntaintNode,
    /// [`Action::KubeLabelPod`].
    KubeLabelPod,
    /// [`Action::KubeDeletePod`].
    KubeDeletePod,
    /// [`Action::KubeScale`].
    KubeScale,
    /// [`Action::SlurmReserve`].
    SlurmReserve,
    /// [`Action::SlurmUnreserve`].
    SlurmUnreserve,
    /// [`Action::KubeSetNodeCondition`].
    KubeSetNodeCondition,
    /// [`Action::KubeLabelNode`].
    KubeLabelNode,
    /// [`Action::KubeRespondEviction`].
    KubeRespondEviction,
}

impl ActionKind {
    /// Every kind, in declaration order: for what must exist for each kind
    /// before its first action (a metric series an alert reads at 0).
    pub const ALL: [ActionKind; 16] = [
        Self::SlurmDrain,
        Self::SlurmResume,
        Self::SlurmDown,
        Self::SlurmSetFeatures,
        Self::SlurmSetTopology,
        Self::KubeSetPodCondition,
        Self::KubeTaintNode,
        Self::KubeUntaintNode,
        Self::KubeLabelPod,
        Self::KubeDeletePod,
        Self::KubeScale,
        Self::SlurmReserve,
        Self::SlurmUnreserve,
        Self::KubeSetNodeCondition,
        Self::KubeLabelNode,
        Self::KubeRespondEviction,
    ];

    /// A static name, usable as a metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Self::SlurmDrain => "slurm_drain",
            Self::SlurmResume => "slurm_resume",
            Self::SlurmDown => "slurm_down",
            Self::SlurmSetFeatures => "slurm_set_features",
            Self::SlurmSetTopology => "slurm_set_topology",
            Self::KubeSetPodCondition => "kube_set_pod_condition",
            Self::KubeTaintNode => "kube_taint_node",
            Self::KubeUntaintNode => "kube_untaint_node",
            Self::KubeLabelPod => "kube_label_pod",
            Self::KubeDeletePod => "kube_delete_pod",
            Self::KubeScale => "kube_scale",
            Self::SlurmReserve => "slurm_reserve",
            Self::SlurmUnreserve => "slurm_unreserve",
            Self::KubeSetNodeCondition => "kube_set_node_condition",
            Self::KubeLabelNode => "kube_label_node",
            Self::KubeRespondEviction => "kube_respond_eviction",
        }
    }

    /// The side that carries the action out: where the dispatcher routes it
    /// and the `connector` label of its metrics.
    pub const fn connector(self) -> Connector {
        match self {
            Self::SlurmDrain
            | Self::SlurmResume
            | Self::SlurmDown
            | Self::SlurmSetFeatures
            | Self::SlurmSetTopology
            | Self::SlurmReserve
            | Self::SlurmUnreserve => Connector::Slurm,
            Self::KubeSetPodCondition
            | Self::KubeTaintNode
            | Self::KubeUntaintNode
            | Self::KubeLabelPod
            | Self::KubeDeletePod
            | Self::KubeScale
            | Self::KubeSetNodeCondition
            | Self::KubeLabelNode
            | Self::KubeRespondEviction => Connector::Kubernetes,
        }
    }
}

impl std::fmt::Display for ActionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One aspect of one object. At most one action is in flight per target.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// A Slurm node's state (drain, resume, down).
    SlurmNodeState {
        /// Slurm node.
        node: String,
    },
    /// A Slurm node's features.
    SlurmNodeFeatures {
        /// Slurm node.
        node: String,
    },
    /// A Slurm node's topology.
    SlurmNodeTopology {
        /// Slurm node.
        node: String,
    },
    /// One condition type on one pod.
    PodCondition {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// Condition type.
        condition: String,
    },
    /// One label on one pod.
    PodLabel {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// Label key.
        key: String,
    },
    /// A pod's existence.
    Pod {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        pod: String,
    },
    /// One taint key on one Kubernetes node.
    NodeTaint {
        /// Kubernetes node.
        node: String,
        /// Taint key.
        key: String,
    },
    /// A scale target's replica count.
    Scale {
        /// Which object.
        target: ScaleTargetRef,
    },
    /// A Slurm reservation's existence and extent.
    SlurmReservation {
        /// Reservation name.
        name: String,
    },
    /// One condition type on one Kubernetes node.
    NodeCondition {
        /// Kubernetes node.
        node: String,
        /// Condition type.
        condition: String,
    },
    /// lockstep's response to the eviction of one pod.
    PodEviction {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        pod: String,
    },
    /// One label (or `annotation:` key) on one Kubernetes node.
    NodeLabel {
        /// Kubernetes node.
        node: String,
        /// Label key, or `annotation:<key>`.
        key: String,
    },
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::SlurmNodeState { node } => write!(f, "slurm:{node}/state"),
            Self::SlurmNodeFeatures { node } => write!(f, "slurm:{node}/features"),
            Self::SlurmNodeTopology { node } => write!(f, "slurm:{node}/topology"),
            Self::PodCondition {
                namespace,
                pod,
                condition,
            } => write!(f, "pod:{namespace}/{pod}/condition/{condition}"),
            Self::PodLabel {
                namespace,
                pod,
                key,
            } => write!(f, "pod:{namespace}/{pod}/label/{key}"),
            Self::Pod { namespace, pod } => write!(f, "pod:{namespace}/{pod}"),
            Self::NodeTaint { node, key } => write!(f, "node:{node}/taint/{key}"),
            Self::Scale { target } => write!(f, "scale:{target}"),
            Self::SlurmReservation { name } => write!(f, "slurm:reservation/{name}"),
            Self::NodeCondition { node, condition } => {
                write!(f, "node:{node}/condition/{condition}")
            }
            Self::NodeLabel { node, key } => write!(f, "node:{node}/label/{key}"),
            Self::PodEviction { namespace, pod } => write!(f, "pod:{namespace}/{pod}/eviction"),
        }
    }
}

impl Action {
    /// The action's kind.
    pub const fn kind(&self) -> ActionKind {
        match self {
            Self::SlurmDrain { .. } => ActionKind::SlurmDrain,
            Self::SlurmResume { .. } => ActionKind::SlurmResume,
            Self::SlurmDown { .. } => ActionKind::SlurmDown,
            Self::SlurmSetFeatures { .. } => ActionKind::SlurmSetFeatures,
            Self::SlurmSetTopology { .. } => ActionKind::SlurmSetTopology,
            Self::KubeSetPodCondition { .. } => ActionKind::KubeSetPodCondition,
            Self::KubeTaintNode { .. } => ActionKind::KubeTaintNode,
            Self::KubeUntaintNode { .. } => ActionKind::KubeUntaintNode,
            Self::KubeLabelPod { .. } => ActionKind::KubeLabelPod,
            Self::KubeDeletePod { .. } => ActionKind::KubeDeletePod,
            Self::KubeScale { .. } => ActionKind::KubeScale,
            Self::SlurmReserve { .. } => ActionKind::SlurmReserve,
            Self::SlurmUnreserve { .. } => ActionKind::SlurmUnreserve,
            Self::KubeSetNodeCondition { .. } => ActionKind::KubeSetNodeCondition,
            Self::KubeLabelNode { .. } => ActionKind::KubeLabelNode,
            Self::KubeRespondEviction { .. } => ActionKind::KubeRespondEviction,
        }
    }

    /// Whether lockstep reads this action's effect back from what it
    /// observes (and so retries one whose effect does not show). An
    /// eviction report's heartbeat is not read back; the report that
    /// completes it is (the pod's eviction says completed).
    pub const fn effect_observed(&self) -> bool {
        !matches!(
            self,
            Self::KubeRespondEviction {
                complete: false,
                ..
            }
        )
    }

    /// The aspect of the object this action changes.
    pub fn target(&self) -> Target {
        match self {
            Self::SlurmDrain { node, .. }
            | Self::SlurmResume { node }
            | Self::SlurmDown { node, .. } => Target::SlurmNodeState { node: node.clone() },
            Self::SlurmSetFeatures { node, .. } => Target::SlurmNodeFeatures { node: node.clone() },
            Self::SlurmSetTopology { node, .. } => Target::SlurmNodeTopology { node: node.clone() },
            Self::KubeSetPodCondition {
                namespace,
                pod,
                condition,
            } => Target::PodCondition {
                namespace: namespace.clone(),
                pod: pod.clone(),
                condition: condition.type_.clone(),
            },
            Self::KubeTaintNode { node, taint } => Target::NodeTaint {
                node: node.clone(),
                key: taint.key.clone(),
            },
            Self::KubeUntaintNode { node, key } => Target::NodeTaint {
                node: node.clone(),
                key: key.clone(),
            },
            Self::KubeLabelPod {
                namespace,
                pod,
                key,
                ..
            } => Target::PodLabel {
                namespace: namespace.clone(),
                pod: pod.clone(),
                key: key.clone(),
            },
            Self::KubeDeletePod { namespace, pod, .. } => Target::Pod {
                namespace: namespace.clone(),
                pod: pod.clone(),
            },
            Self::KubeScale { target, .. } => Target::Scale {
                target: target.clone(),
            },
            Self::SlurmReserve { name, .. } | Self::SlurmUnreserve { name } => {
                Target::SlurmReservation { name: name.clone() }
            }
            Self::KubeSetNodeCondition { node, condition } => Target::NodeCondition {
                node: node.clone(),
                condition: condition.type_.clone(),
            },
            Self::KubeLabelNode { node, key, .. } => Target::NodeLabel {
                node: node.clone(),
                key: key.clone(),
            },
            Self::KubeRespondEviction { namespace, pod, .. } => Target::PodEviction {
                namespace: namespace.clone(),
                pod: pod.clone(),
            },
        }
    }

    /// A one-line human-readable description.
    pub fn describe(&self) -> String {
        match self {
            Self::SlurmDrain { node, reason } => format!("drain slurm node {node} ({reason})"),
            Self::SlurmResume { node } => format!("resume slurm node {node}"),
            Self::SlurmDown { node, reason } => format!("down slurm node {node} ({reason})"),
            Self::SlurmSetFeatures { node, features } => {
                format!(
                    "set features of slurm node {node} to [{}]",
                    features.join(",")
                )
            }
            Self::SlurmSetTopology { node, topology } => {
                format!("set topology of slurm node {node} to {topology}")
            }
            Self::KubeSetPodCondition {
                namespace,
                pod,
                condition,
            } => describe_condition(condition, &format!("pod {namespace}/{pod}")),
            Self::KubeSetNodeCondition { node, condition } => {
                describe_condition(condition, &format!("kubernetes node {node}"))
            }
            Self::SlurmReserve {
                name,
                nodes,
                start_ms,
                end_ms,
                ..
            } => {
                let end =
                    end_ms.map_or_else(|| "open end".to_owned(), |e| format!("to {}", utc(e)));
                format!(
                    "reserve slurm nodes {} for maintenance as {name} (from {}, {end})",
                    nodes.join(","),
                    utc(*start_ms)
                )
            }
            Self::SlurmUnreserve { name } => format!("remove slurm reservation {name}"),
            Self::KubeTaintNode { node, taint } => format!(
                "taint kubernetes node {node} {}={}:{:?}",
                taint.key, taint.value, taint.effect
            ),
            Self::KubeUntaintNode { node, key } => {
                format!("remove taint {key} from kubernetes node {node}")
            }
            Self::KubeLabelPod {
                namespace,
                pod,
                key,
                value,
            } => describe_label(key, value.as_deref(), &format!("pod {namespace}/{pod}")),
            Self::KubeLabelNode { node, key, value } => {
                describe_label(key, value.as_deref(), &format!("kubernetes node {node}"))
            }
            Self::KubeRespondEviction {
                namespace,
                pod,
                eviction,
                message,
                complete,
                ..
            } => {
                let what = if *complete { "complete" } else { "report on" };
                format!("{what} eviction {eviction} of pod {namespace}/{pod}: {message}")
            }
            Self::KubeDeletePod {
                namespace,
                pod,
                uid,
            } => format!("delete pod {namespace}/{pod} (uid {uid})"),
            Self::KubeScale { target, replicas } => format!("scale {target} to {replicas}"),
        }
    }
}

/// A log time in RFC 3339, UTC, to the second.
fn utc(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `label WHAT k=v`, `annotate WHAT k=v`, `remove label k from WHAT`.
fn describe_label(key: &str, value: Option<&str>, what: &str) -> String {
    let (kind, key) = match key.strip_prefix(crate::event::ANNOTATION_PREFIX) {
        Some(a) => ("annotation", a),
        None => ("label", key),
    };
    match value {
        Some(v) if kind == "label" => format!("label {what} {key}={v}"),
        Some(v) => format!("annotate {what} {key}={v}"),
        None => format!("remove {kind} {key} from {what}"),
    }
}

/// `set condition T=S on WHAT (reason: message)`.
fn describe_condition(condition: &PodCondition, what: &str) -> String {
    let status = match condition.status {
        ConditionStatus::True => "True",
        ConditionStatus::False => "False",
        ConditionStatus::Unknown => "Unknown",
    };
    let mut s = format!("set condition {}={status} on {what}", condition.type_);
    if !condition.reason.is_empty() {
        s.push_str(&format!(" ({}", condition.reason));
        if !condition.message.is_empty() {
            s.push_str(&format!(": {}", condition.message));
        }
        s.push(')');
    }
    s
}

/// An action's id, derived from (causing sequence, kind, target): the same log
/// gives the same ids. Used as `Nats-Msg-Id` when actions are published, so a
/// re-publish is deduplicated.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct ActionId(pub String);

impl ActionId {
    /// The id of the action of `kind` on `target` caused by the record at `seq`.
    pub fn derive(seq: u64, kind: ActionKind, target: &Target) -> Self {
        Self(format!("{seq}.{}.{target}", kind.name()))
    }
}

impl std::fmt::Display for ActionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// An action as the reducer issued it: what, why and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IssuedAction {
    /// Derived id.
    pub id: ActionId,
    /// Sequence of the log record whose application issued it.
    pub seq: u64,
    /// Log time (ms) at which it was issued.
    pub time_ms: u64,
    /// Id of the event that caused it (the origin of the rule's cause).
    pub cause: crate::EventId,
    /// The rule that wanted it.
    pub rule: String,
    /// Which attempt this is (1 for the first).
    pub attempt: u32,
    /// What to do.
    pub action: Action,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_kind_once_with_a_distinct_name() {
        // A kind missing from ALL fails to compile here.
        let index = |k: ActionKind| ActionKind::ALL.iter().position(|x| *x == k);
        for k in ActionKind::ALL {
            let covered = match k {
                ActionKind::SlurmDrain => index(ActionKind::SlurmDrain),
                ActionKind::SlurmResume => index(ActionKind::SlurmResume),
                ActionKind::SlurmDown => index(ActionKind::SlurmDown),
                ActionKind::SlurmSetFeatures => index(ActionKind::SlurmSetFeatures),
                ActionKind::SlurmSetTopology => index(ActionKind::SlurmSetTopology),
                ActionKind::KubeSetPodCondition => index(ActionKind::KubeSetPodCondition),
                ActionKind::KubeTaintNode => index(ActionKind::KubeTaintNode),
                ActionKind::KubeUntaintNode => index(ActionKind::KubeUntaintNode),
                ActionKind::KubeLabelPod => index(ActionKind::KubeLabelPod),
                ActionKind::KubeDeletePod => index(ActionKind::KubeDeletePod),
                ActionKind::KubeScale => index(ActionKind::KubeScale),
                ActionKind::SlurmReserve => index(ActionKind::SlurmReserve),
                ActionKind::SlurmUnreserve => index(ActionKind::SlurmUnreserve),
                ActionKind::KubeSetNodeCondition => index(ActionKind::KubeSetNodeCondition),
                ActionKind::KubeLabelNode => index(ActionKind::KubeLabelNode),
                ActionKind::KubeRespondEviction => index(ActionKind::KubeRespondEviction),
            };
            assert!(covered.is_some());
        }
        let mut names: Vec<&str> = ActionKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ActionKind::ALL.len());
    }

    #[test]
    fn every_kind_goes_to_the_side_it_names() {
        use ActionKind::*;
        // (kind, connector), one kind a line: the name says the side.
        let cases = [
            (SlurmDrain, Connector::Slurm),
            (SlurmResume, Connector::Slurm),
            (SlurmDown, Connector::Slurm),
            (SlurmSetFeatures, Connector::Slurm),
            (SlurmSetTopology, Connector::Slurm),
            (SlurmReserve, Connector::Slurm),
            (SlurmUnreserve, Connector::Slurm),
            (KubeSetPodCondition, Connector::Kubernetes),
            (KubeTaintNode, Connector::Kubernetes),
            (KubeUntaintNode, Connector::Kubernetes),
            (KubeLabelPod, Connector::Kubernetes),
            (KubeDeletePod, Connector::Kubernetes),
            (KubeScale, Connector::Kubernetes),
            (KubeSetNodeCondition, Connector::Kubernetes),
            (KubeLabelNode, Connector::Kubernetes),
            (KubeRespondEviction, Connector::Kubernetes),
        ];
        for kind in ActionKind::ALL {
            assert!(
                cases.iter().any(|(k, _)| *k == kind),
                "{kind} is not in the table"
            );
        }
        for (kind, connector) in cases {
            assert_eq!(kind.connector(), connector, "{kind}");
            let prefix = match connector {
                Connector::Slurm => "slurm_",
                Connector::Kubernetes => "kube_",
            };
            assert!(kind.name().starts_with(prefix), "{kind}");
        }
    }
}
