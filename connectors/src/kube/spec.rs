//! What the Kubernetes observer watches, from the policy: which objects
//! (selectors, namespace, kinds of scale target) and what of each it keeps
//! (labels, conditions, taints).
//!
//! A policy change that changes the spec changes what is watched: the
//! observer restarts the watches whose parameters differ
//! ([`ObserveSpec::changed_watches`]), and their new listing re-emits every
//! object as the new spec reduces it.

use kube::api::ApiResource;
use lockstep_schemas::{Policy, Removal, ScaleTargetRef, ANNOTATION_PREFIX};

use super::wire::{DRAIN_CONDITIONS, LOCKSTEP_TAINT_PREFIX, POD_DELETION_COST};

/// A kind of object with a scale subresource that lockstep watches and scales.
///
/// The field paths are dotted JSON paths into the object, as the kind's
/// scale subresource maps them (a CRD's `scale.specReplicasPath` without the
/// leading `.`).
///
/// A policy names a scale target by API group and kind only
/// ([`ScaleTargetRef`]). The `apps/v1` kinds are always served as they are;
/// any other kind ([`ScaleKind::for_target`], Slinky's NodeSet among them)
/// starts with an empty `version` and `plural`, and the observer and the
/// actuator ask the API server's discovery which version it serves, under
/// which resource name, and whether that has a scale subresource
/// ([`discover`](super::discover)). So a CRD that moves to a new version
/// (NodeSet `v1beta1` today) is followed without a lockstep release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleKind {
    /// API group, empty for the core group.
    pub group: String,
    /// API version, e.g. `v1`; empty until discovered.
    pub version: String,
    /// Kind, e.g. `StatefulSet`.
    pub kind: String,
    /// Resource name (lowercase plural), e.g. `statefulsets`; empty until
    /// discovered.
    pub plural: String,
    /// Path of the desired replica count.
    pub replicas_path: String,
    /// Path of the ready replica count.
    pub ready_replicas_path: String,
    /// Path of the revision new pods get, if the kind has one.
    pub update_revision_path: Option<String>,
}

impl ScaleKind {
    /// `apps/v1` StatefulSet.
    pub fn stateful_set() -> Self {
        Self {
            group: "apps".to_owned(),
            version: "v1".to_owned(),
            kind: "StatefulSet".to_owned(),
            plural: "statefulsets".to_owned(),
            replicas_path: "spec.replicas".to_owned(),
            ready_replicas_path: "status.readyReplicas".to_owned(),
            update_revision_path: Some("status.updateRevision".to_owned()),
        }
    }

    /// `apps/v1` ReplicaSet.
    pub fn replica_set() -> Self {
        Self {
            kind: "ReplicaSet".to_owned(),
            plural: "replicasets".to_owned(),
            update_revision_path: None,
            ..Self::stateful_set()
        }
    }

    /// `apps/v1` Deployment.
    pub fn deployment() -> Self {
        Self {
            kind: "Deployment".to_owned(),
            plural: "deployments".to_owned(),
            update_revision_path: None,
            ..Self::stateful_set()
        }
    }

    /// The kind of `target`: one of the `apps/v1` kinds above, else a kind
    /// to discover ([`ScaleKind::discovered`]).
    pub fn for_target(target: &ScaleTargetRef) -> Self {
        [
            Self::stateful_set(),
            Self::replica_set(),
            Self::deployment(),
        ]
        .into_iter()
        .find(|k| k.matches(target))
        .unwrap_or_else(|| Self::discovered(&target.group, &target.kind))
    }

    /// A kind whose version and resource name the API server's discovery
    /// gives ([`discover`](super::discover)). It is read the way every
    /// scale subresource of Kubernetes' own kinds, and Slinky's NodeSet, maps
    /// it: desired replicas at `spec.replicas`, ready ones at
    /// `status.readyReplicas`. It has no update revision: lockstep replaces
    /// no pod of a kind whose controller rolls out its own updates (a
    /// NodeSet's `status.nodeSetHash` is left to Slinky).
    pub fn discovered(group: &str, kind: &str) -> Self {
        Self {
            group: group.to_owned(),
            version: String::new(),
            kind: kind.to_owned(),
            plural: String::new(),
            update_revision_path: None,
            ..Self::stateful_set()
        }
    }

    /// Whether the version and resource name are still to be discovered.
    pub fn needs_discovery(&self) -> bool {
        self.version.is_empty() || self.plural.is_empty()
    }

    /// The dynamic API resource of this kind. Only meaningful once
    /// discovered (see [`ScaleKind::needs_discovery`]).
    pub fn api_resource(&self) -> ApiResource {
        let api_version = if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        };
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version,
            kind: self.kind.clone(),
            plural: self.plural.clone(),
        }
    }

    /// Whether `target` is of this kind.
    pub fn matches(&self, target: &ScaleTargetRef) -> bool {
        self.group == target.group && self.kind == target.kind
    }
}

/// What the observer watches and what it keeps of each object.
///
/// Built from the policy with [`ObserveSpec::from_policy`]; a policy change
/// that changes the spec needs a new observer (its first listing then
/// re-emits every object under the new spec).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObserveSpec {
    /// Label selector of the nodes to watch; `None` watches all nodes.
    pub node_selector: Option<String>,
    /// Label selector of the pods to watch (`mapping.pod_selector`); `None`
    /// watches no pods (host mode without a selector).
    pub pod_selector: Option<String>,
    /// Namespace of the pods and scale targets to watch; `None`: all.
    pub namespace: Option<String>,
    /// Node condition types to report (`health.node_conditions`, the ones
    /// lockstep sets).
    pub node_conditions: Vec<String>,
    /// Of those, the types whose message is reported too (the ones
    /// lockstep sets with a message that changes).
    pub node_condition_messages: Vec<String>,
    /// Node label keys to report; `annotation:<key>` reports an annotation.
    pub node_labels: Vec<String>,
    /// Taints whose key starts with one of these are reported.
    pub taint_prefixes: Vec<String>,
    /// Taints with exactly these keys are reported (the policy's taints).
    pub taint_keys: Vec<String>,
    /// Pod label keys to report (`mapping.node_name_label`, the busy label);
    /// `annotation:<key>` reports an annotation (the pod deletion cost of
    /// targets scaled in by `deletion_cost`).
    pub pod_labels: Vec<String>,
    /// Pod condition types to report (the ones lockstep sets).
    pub pod_conditions: Vec<String>,
    /// Kinds of scale target to watch.
    pub scale_kinds: Vec<ScaleKind>,
    /// Label selector of the scale targets; `None`: all of each kind.
    pub scale_selector: Option<String>,
    /// Read announced maintenance (`maintenance.enabled`): the node's
    /// [`Maintenance`], and the drain conditions lockstep sets.
    pub maintenance: bool,
    /// Report which machine each node is (`health.return_condition`): its
    /// UID, boot ID and provider ID.
    pub node_identity: bool,
    /// Watch DRA device faults (`health.device_faults`): ResourceSlices and
    /// DeviceTaintRules for each node's tainted devices, and the devices the
    /// kubelet reports unhealthy to each pod.
    pub device_faults: bool,
    /// Watch the Evictions of pods that name this eviction responder
    /// (`drain.eviction_responder`): each pod's eviction under way.
    pub eviction_responder: Option<String>,
}

impl ObserveSpec {
    /// What `policy` needs observed: the node labels its topology policy
    /// reads plus `node_labels` (label or `annotation:` keys), its pod
    /// selector, node-name and busy labels, the conditions and taints it
    /// reads and sets, and as scale targets StatefulSets and every kind its
    /// scaling rules name ([`scale_kinds`]).
    pub fn from_policy(policy: &Policy, node_labels: &[&str]) -> Self {
        let non_empty = |s: &str| (!s.trim().is_empty()).then(|| s.to_owned());
        let mut taint_keys: Vec<String> = [
            policy.drain.foreign_drain_taint.as_ref(),
            policy.health.unhealthy_taint.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|t| t.key.clone())
        .collect();
        taint_keys.sort();
        taint_keys.dedup();
        let mut pod_conditions: Vec<String> = [
            policy.drain.foreign_drain_condition.as_str(),
            policy.health.slurm_health_condition.as_str(),
        ]
        .into_iter()
        .filter_map(non_empty)
        .collect();
        pod_conditions.sort();
        pod_conditions.dedup();
        let mut spec = Self {
            node_selector: None,
            pod_selector: non_empty(&policy.mapping.pod_selector),
            namespace: None,
            node_conditions: policy
                .health
                .node_conditions
                .iter()
                .cloned()
                .chain(
                    DRAIN_CONDITIONS
                        .iter()
                        .filter(|_| policy.drain_conditions_on())
                        .map(|c| (*c).to_owned()),
                )
                .chain(non_empty(&policy.node_signals.foreign_drain_condition))
                .chain(non_empty(&policy.health.return_condition))
                .collect(),
            node_condition_messages: non_empty(&policy.node_signals.foreign_drain_condition)
                .into_iter()
                .collect(),
            node_labels: node_labels
                .iter()
                .map(|s| (*s).to_owned())
                .chain(policy.topology.features.iter().map(|f| f.label.clone()))
                .chain(policy.topology.unit_label.iter().cloned())
                .chain(
                    non_empty(&policy.node_signals.slurm_nodes_annotation)
                        .map(|a| format!("{ANNOTATION_PREFIX}{a}")),
                )
                .collect(),
            taint_prefixes: vec![LOCKSTEP_TAINT_PREFIX.to_owned()],
            taint_keys,
            pod_labels: policy
                .mapping
                .node_name_label
                .iter()
                .cloned()
                .chain(non_empty(&policy.scaling.busy_label))
                .chain(
                    policy
                        .scaling
                        .targets
                        .iter()
                        .any(|t| {
                            policy.scaling.removal_of(&t.target) == Some(Removal::DeletionCost)
                        })
                        .then(|| POD_DELETION_COST.to_owned()),
                )
                .collect(),
            pod_conditions,
            scale_kinds: scale_kinds(policy),
            scale_selector: None,
            maintenance: policy.maintenance.enabled,
            node_identity: !policy.health.return_condition.is_empty(),
            device_faults: policy.health.device_faults,
            eviction_responder: non_empty(&policy.drain.eviction_responder),
        };
        spec.normalize();
        spec
    }

    /// Sorts and deduplicates the key lists (observations list conditions
    /// sorted by type).
    pub fn normalize(&mut self) {
        for v in [
            &mut self.node_conditions,
            &mut self.node_condition_messages,
            &mut self.node_labels,
            &mut self.taint_prefixes,
            &mut self.taint_keys,
            &mut self.pod_labels,
            &mut self.pod_conditions,
        ] {
            v.retain(|s| !s.is_empty());
            v.sort();
            v.dedup();
        }
    }

    /// The watches that watch something else under `new` than under
    /// `self`: what a policy change restarts.
    pub fn changed_watches(&self, new: &Self) -> ChangedWatches {
        // Every field named, so that a new one cannot be forgotten here.
        let Self {
            node_selector,
            pod_selector,
            namespace,
            node_conditions,
            node_condition_messages,
            node_labels,
            taint_prefixes,
            taint_keys,
            pod_labels,
            pod_conditions,
            scale_kinds,
            scale_selector,
            maintenance,
            node_identity,
            device_faults,
            eviction_responder,
        } = self;
        ChangedWatches {
            nodes: *node_selector != new.node_selector
                || *node_conditions != new.node_conditions
                || *node_condition_messages != new.node_condition_messages
                || *node_labels != new.node_labels
                || *taint_prefixes != new.taint_prefixes
                || *taint_keys != new.taint_keys
                || *maintenance != new.maintenance
                || *node_identity != new.node_identity
                || *device_faults != new.device_faults,
            pods: *pod_selector != new.pod_selector
                || *device_faults != new.device_faults
                || *eviction_responder != new.eviction_responder
                || *namespace != new.namespace
                || *pod_labels != new.pod_labels
                || *pod_conditions != new.pod_conditions,
            scale_targets: *scale_kinds != new.scale_kinds
                || *scale_selector != new.scale_selector
                || *namespace != new.namespace,
        }
    }

    pub(super) fn taint_observed(&self, key: &str) -> bool {
        self.taint_keys.iter().any(|k| k == key)
            || self
                .taint_prefixes
                .iter()
                .any(|p| key.starts_with(p.as_str()))
    }
}

/// The kinds of scale target `policy` needs watched and scaled: StatefulSets
/// (always), then each kind its scaling rules name, in the order they first
/// appear ([`ScaleKind::for_target`]: kinds outside `apps` are discovered).
/// The actuator scales exactly these kinds.
pub fn scale_kinds(policy: &Policy) -> Vec<ScaleKind> {
    let mut kinds = vec![ScaleKind::stateful_set()];
    for t in &policy.scaling.targets {
        let kind = ScaleKind::for_target(&t.target);
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    kinds
}

/// Which watches a change of [`ObserveSpec`] restarts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChangedWatches {
    /// The node watch: its selector, or what it keeps of a node (labels,
    /// conditions, taints, maintenance, identity, device faults); the
    /// ResourceSlice and DeviceTaintRule watches go with it.
    pub nodes: bool,
    /// The pod watch: its selector or namespace, or what it keeps of a pod
    /// (labels, conditions, devices, its eviction); the Eviction watch goes
    /// with it.
    pub pods: bool,
    /// The scale target watches: their kinds, selector or namespace.
    pub scale_targets: bool,
}

impl ChangedWatches {
    /// Every watch (the observer's start).
    pub const ALL: Self = Self {
        nodes: true,
        pods: true,
        scale_targets: true,
    };

    /// Whether any watch restarts.
    pub const fn any(self) -> bool {
        self.nodes || self.pods || self.scale_targets
    }
}

#[cfg(test)]
mod tests {
    use super::super::reduce::DEFAULT_NODE_LABELS;
    use super::*;

    /// A scaling rule for the target of `kind` in `group` named `name`.
    fn rule(group: &str, kind: &str, name: &str) -> lockstep_schemas::ScaleRule {
        lockstep_schemas::ScaleRule {
            target: ScaleTargetRef {
                group: group.to_owned(),
                kind: kind.to_owned(),
                namespace: "slurm".to_owned(),
                name: name.to_owned(),
            },
            partition: "batch".to_owned(),
            min_replicas: 0,
            max_replicas: 4,
            scale_up_cooldown_s: 30,
            scale_down_cooldown_s: 120,
            idle_before_scale_down_s: 300,
            max_unavailable: 1,
        }
    }

    #[test]
    fn spec_names_what_the_policy_reads() {
        let mut policy = Policy::default();
        policy.topology.features = vec![lockstep_schemas::LabelFeature {
            label: "nvidia.com/gpu.product".to_owned(),
            prefix: "gpu-".to_owned(),
        }];
        policy.topology.unit_label = Some("nvidia.com/gpu.clique".to_owned());
        policy.scaling.busy_label = "lockstep.io/slurm-busy".to_owned();
        policy.mapping.node_name_label = Some("slurm.node".to_owned());
        let spec = ObserveSpec::from_policy(&policy, DEFAULT_NODE_LABELS);
        assert_eq!(
            spec.node_labels,
            [
                "nvidia.com/gpu.clique",
                "nvidia.com/gpu.product",
                "topology.kubernetes.io/zone"
            ]
        );
        assert_eq!(spec.pod_labels, ["lockstep.io/slurm-busy", "slurm.node"]);
        assert_eq!(
            spec.pod_conditions,
            ["SlurmNodeDrained", "SlurmNodeHealthy"]
        );
        assert_eq!(spec.taint_keys, ["lockstep.io/slurm-unhealthy"]);
        assert_eq!(
            spec.pod_selector.as_deref(),
            Some("app.kubernetes.io/component=slurmd")
        );
        assert_eq!(spec.scale_kinds, [ScaleKind::stateful_set()]);
    }

    #[test]
    fn scale_kinds_are_statefulsets_and_every_kind_the_policy_names() {
        let mut policy = Policy::default();
        policy.scaling.targets = vec![
            rule("slinky.slurm.net", "NodeSet", "cpu"),
            rule("apps", "Deployment", "web"),
            rule("slinky.slurm.net", "NodeSet", "gpu"),
            rule("apps", "StatefulSet", "compute"),
        ];
        let node_set = ScaleKind::discovered("slinky.slurm.net", "NodeSet");
        assert_eq!(
            scale_kinds(&policy),
            [
                ScaleKind::stateful_set(),
                node_set.clone(),
                ScaleKind::deployment()
            ]
        );
        // A NodeSet's version and resource name come from discovery; it is
        // read at the fields its scale subresource maps, and lockstep rolls
        // out none of its updates.
        assert!(node_set.needs_discovery());
        assert_eq!(
            (
                node_set.replicas_path.as_str(),
                node_set.ready_replicas_path.as_str(),
                node_set.update_revision_path.as_deref()
            ),
            ("spec.replicas", "status.readyReplicas", None)
        );
        assert!(!ScaleKind::stateful_set().needs_discovery());
        let spec = ObserveSpec::from_policy(&policy, DEFAULT_NODE_LABELS);
        assert_eq!(spec.scale_kinds, scale_kinds(&policy));
    }

    #[test]
    fn a_policy_change_restarts_only_the_watches_it_changes() {
        let base = Policy::default();
        let spec = |edit: &dyn Fn(&mut Policy)| {
            let mut p = base.clone();
            edit(&mut p);
            ObserveSpec::from_policy(&p, DEFAULT_NODE_LABELS)
        };
        let before = spec(&|_| {});
        let watches = |nodes, pods, scale_targets| ChangedWatches {
            nodes,
            pods,
            scale_targets,
        };
        // (what the policy change does, the watches it restarts), one a line.
        type Edit<'a> = &'a dyn Fn(&mut Policy);
        let cases: Vec<(&str, Edit, ChangedWatches)> = vec![
            ("nothing", &|_| {}, watches(false, false, false)),
            (
                "a topology label",
                &|p| p.topology.unit_label = Some("nvidia.com/gpu.clique".to_owned()),
                watches(true, false, false),
            ),
            (
                "a node condition",
                &|p| p.health.node_conditions = vec!["GpuXid".to_owned()],
                watches(true, false, false),
            ),
            (
                "maintenance",
                &|p| p.maintenance.enabled = !p.maintenance.enabled,
                watches(true, false, false),
            ),
            (
                "the pod selector",
                &|p| p.mapping.pod_selector = "app=other-slurmd".to_owned(),
                watches(false, true, false),
            ),
            (
                "the node name label",
                &|p| p.mapping.node_name_label = Some("slurm.node".to_owned()),
                watches(false, true, false),
            ),
            (
                "a NodeSet as scale target",
                &|p| p.scaling.targets = vec![rule("slinky.slurm.net", "NodeSet", "cpu")],
                watches(false, false, true),
            ),
            (
                "a drain grace period",
                &|p| p.health.not_ready_grace_s += 1,
                watches(false, false, false),
            ),
        ];
        for (what, edit, want) in cases {
            let after = spec(edit);
            assert_eq!(before.changed_watches(&after), want, "{what}");
            assert_eq!(want.any(), before != after, "{what}");
        }
    }
}
