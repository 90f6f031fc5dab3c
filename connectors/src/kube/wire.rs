//! The Kubernetes dialect lockstep speaks: the names and shapes of what the
//! actuator writes and what the reducer ([`super::reduce`]) and the observer
//! read back. Condition types and the spelling of their statuses, taint
//! effects, label and annotation keys, the field manager lockstep's writes
//! are recorded under, and the patch documents.
//!
//! The writer and the readers take all of these from here, so that they
//! cannot drift apart: a taint or a condition that the actuator writes reads
//! back as what it was written from (the tests below check it without a
//! cluster). Names the engine reads too (the drain conditions, the
//! `annotation:` keys) belong to `lockstep_schemas` and are re-exported
//! here, never copied.
//!
//! This module does no I/O and decides nothing: whether a write is needed
//! is the actuator's, what an observation keeps is the reducer's.

use k8s_openapi::api::core::v1::Taint as KubeTaint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PatchParams;
use lockstep_schemas::{ConditionStatus, PodCondition, Taint, TaintEffect};
use serde_json::{json, Value};

pub use lockstep_schemas::{ANNOTATION_PREFIX, DRAINED, DRAIN_IN_PROGRESS, POD_DELETION_COST};

/// The field manager lockstep's writes are recorded under (in each object's
/// `managedFields`, which the reducer reads to find the conditions lockstep
/// wrote).
pub const FIELD_MANAGER: &str = "lockstep";

/// The subresource lockstep's condition patches go to.
pub const STATUS_SUBRESOURCE: &str = "status";

/// The condition type of a node's and a pod's readiness.
pub const READY: &str = "Ready";

/// The condition the eviction API and the scheduler's preemption put on a pod.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// Node lifecycle condition (Kubernetes v1.37, `NodeLifecycleConditions`):
/// maintenance is planned; lockstep reads its window from the message.
pub const MAINTENANCE_PLANNED: &str = "MaintenancePlanned";

/// Node lifecycle condition: maintenance is under way.
pub const MAINTENANCE_IN_PROGRESS: &str = "MaintenanceInProgress";

/// Node lifecycle conditions lockstep sets from the progress of its drain
/// (and observes, when the policy reads node lifecycle conditions).
pub const DRAIN_CONDITIONS: [&str; 2] = [DRAIN_IN_PROGRESS, DRAINED];

/// The annotation that announces a maintenance window on clusters without
/// node lifecycle conditions: `START/END` in RFC 3339 (`START/`: no end yet).
pub const MAINTENANCE_WINDOW_ANNOTATION: &str = "lockstep.dev/maintenance-window";

/// The label a StatefulSet (or a Slinky NodeSet) puts the pod's revision in.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// Taint keys and pod label keys with this prefix are lockstep's, and are
/// always observed: what lockstep set under a name an earlier policy used
/// (a busy label since renamed or turned off) stays visible, so lockstep
/// can remove it.
pub const LOCKSTEP_TAINT_PREFIX: &str = "lockstep.io/";

/// The parameters of every patch lockstep sends: recorded under
/// [`FIELD_MANAGER`].
pub fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

// ---- conditions -----------------------------------------------------------------

/// Parses a Kubernetes condition status; anything but `True`/`False` is
/// `Unknown`.
pub fn condition_status(s: &str) -> ConditionStatus {
    match s {
        "True" => ConditionStatus::True,
        "False" => ConditionStatus::False,
        _ => ConditionStatus::Unknown,
    }
}

/// The Kubernetes spelling of a condition status.
pub const fn condition_status_str(s: ConditionStatus) -> &'static str {
    match s {
        ConditionStatus::True => "True",
        ConditionStatus::False => "False",
        ConditionStatus::Unknown => "Unknown",
    }
}

/// A condition of a node or a pod (their fields alike: type, status,
/// reason, message), as lockstep reads it back.
pub trait ReadCondition {
    /// Its `type`.
    fn type_name(&self) -> &str;
    /// What lockstep compares: type, status, reason and message.
    fn read(&self) -> PodCondition;
}

/// Implements [`ReadCondition`] for a Kubernetes condition type.
macro_rules! read_condition {
    ($t:ty) => {
        impl ReadCondition for $t {
            fn type_name(&self) -> &str {
                &self.type_
            }

            fn read(&self) -> PodCondition {
                PodCondition {
                    type_: self.type_.clone(),
                    status: condition_status(&self.status),
                    reason: self.reason.clone().unwrap_or_default(),
                    message: self.message.clone().unwrap_or_default(),
                }
            }
        }
    };
}
read_condition!(k8s_openapi::api::core::v1::PodCondition);
read_condition!(k8s_openapi::api::core::v1::NodeCondition);

/// The condition of `type_` among an object's `conditions`, as read back.
pub fn find_condition<C: ReadCondition>(
    conditions: Option<&[C]>,
    type_: &str,
) -> Option<PodCondition> {
    conditions
        .unwrap_or_default()
        .iter()
        .find(|c| c.type_name() == type_)
        .map(ReadCondition::read)
}

/// The strategic merge patch of a node's or a pod's status that sets one
/// condition, with `last_transition_time` (RFC 3339) when its status
/// changes. Conditions merge by type: the others, and the fields of this one
/// not sent (its `lastTransitionTime` when the status stays), are kept.
pub fn condition_patch(want: &PodCondition, last_transition_time: Option<&str>) -> Value {
    let mut condition = json!({
        "type": want.type_,
        "status": condition_status_str(want.status),
        "reason": want.reason,
        "message": want.message,
    });
    if let Some(t) = last_transition_time {
        condition["lastTransitionTime"] = json!(t);
    }
    json!({"status": {"conditions": [condition]}})
}

/// The pod condition types lockstep itself wrote, as the API server records
/// them in `managedFields` (its [`FIELD_MANAGER`], on the
/// [`STATUS_SUBRESOURCE`], a key `k:{"type":"..."}` per condition).
pub fn conditions_written_by_lockstep(meta: &ObjectMeta) -> Vec<String> {
    let mut types = Vec::new();
    for entry in meta.managed_fields.iter().flatten() {
        if entry.manager.as_deref() != Some(FIELD_MANAGER)
            || entry.subresource.as_deref() != Some(STATUS_SUBRESOURCE)
        {
            continue;
        }
        let Some(fields) = &entry.fields_v1 else {
            continue;
        };
        let conditions = fields.0.get("f:status").and_then(|s| s.get("f:conditions"));
        let Some(keys) = conditions.and_then(Value::as_object) else {
            continue;
        };
        for key in keys.keys() {
            let Some(k) = key.strip_prefix("k:") else {
                continue;
            };
            if let Ok(Value::Object(o)) = serde_json::from_str(k) {
                if let Some(t) = o.get("type").and_then(Value::as_str) {
                    types.push(t.to_owned());
                }
            }
        }
    }
    types
}

// ---- taints ---------------------------------------------------------------------

/// Parses a taint effect; `None` for a value Kubernetes does not define.
pub fn taint_effect(s: &str) -> Option<TaintEffect> {
    match s {
        "NoSchedule" => Some(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
        "NoExecute" => Some(TaintEffect::NoExecute),
        _ => None,
    }
}

/// The Kubernetes spelling of a taint effect.
pub const fn taint_effect_str(e: TaintEffect) -> &'static str {
    match e {
        TaintEffect::NoSchedule => "NoSchedule",
        TaintEffect::PreferNoSchedule => "PreferNoSchedule",
        TaintEffect::NoExecute => "NoExecute",
    }
}

/// A node's taint as lockstep reads it back; `None` for an effect
/// Kubernetes does not define.
pub fn read_taint(t: &KubeTaint) -> Option<Taint> {
    Some(Taint {
        key: t.key.clone(),
        value: t.value.clone().unwrap_or_default(),
        effect: taint_effect(&t.effect)?,
    })
}

/// `taint` as an entry of a node's `spec.taints`: no `value` when it is
/// empty; a NoExecute taint carries `time_added` (RFC 3339), as `kubectl
/// taint` does, which tolerationSeconds count from.
pub fn taint_entry(taint: &Taint, time_added: &str) -> Value {
    let mut entry = json!({"key": taint.key, "effect": taint_effect_str(taint.effect)});
    if !taint.value.is_empty() {
        entry["value"] = json!(taint.value);
    }
    if taint.effect == TaintEffect::NoExecute {
        entry["timeAdded"] = json!(time_added);
    }
    entry
}

/// The JSON merge patch that replaces a node's taints with `taints` (a list,
/// or `null` for none), only while the node is still at `resource_version`,
/// so that a concurrent change to the other taints is never lost.
pub fn taints_patch(resource_version: Option<&str>, taints: Value) -> Value {
    json!({
        "metadata": {"resourceVersion": resource_version},
        "spec": {"taints": taints},
    })
}

// ---- labels and annotations -----------------------------------------------------

/// A key of lockstep's label vocabulary: a label, or with
/// [`ANNOTATION_PREFIX`] an annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaKey<'a> {
    /// A label key.
    Label(&'a str),
    /// An annotation key (without the prefix).
    Annotation(&'a str),
}

impl<'a> MetaKey<'a> {
    /// What `key` names.
    pub fn parse(key: &'a str) -> Self {
        match key.strip_prefix(ANNOTATION_PREFIX) {
            Some(annotation) => Self::Annotation(annotation),
            None => Self::Label(key),
        }
    }

    /// The key in its map of `metadata`.
    pub const fn key(self) -> &'a str {
        match self {
            Self::Label(k) | Self::Annotation(k) => k,
        }
    }

    /// The field of `metadata` that holds it.
    pub const fn field(self) -> &'static str {
        match self {
            Self::Label(_) => "labels",
            Self::Annotation(_) => "annotations",
        }
    }

    /// Its value in `meta`, if it is set.
    pub fn get(self, meta: &ObjectMeta) -> Option<&String> {
        let map = match self {
            Self::Label(_) => meta.labels.as_ref(),
            Self::Annotation(_) => meta.annotations.as_ref(),
        };
        map?.get(self.key())
    }

    /// The JSON merge patch that sets it to `value` (`None`: removes it).
    pub fn patch(self, value: Option<&str>) -> Value {
        json!({"metadata": {self.field(): {self.key(): value}}})
    }
}

// ---- scale ----------------------------------------------------------------------

/// The JSON merge patch of a scale subresource that sets the replicas alone.
pub fn scale_patch(replicas: u32) -> Value {
    json!({"spec": {"replicas": replicas}})
}

#[cfg(test)]
mod tests {
    //! Round trips: what the actuator's builders write, applied as the API
    //! server applies it, reads back through the reducer as it was written.

    use super::*;
    use crate::kube::reduce::{self, ObserveSpec};
    use k8s_openapi::api::core::v1::{Node, Pod};
    use lockstep_schemas::Policy;

    /// RFC 7386 JSON merge patch, as the API server applies `Patch::Merge`.
    fn merge(target: &mut Value, patch: &Value) {
        let Value::Object(patch) = patch else {
            *target = patch.clone();
            return;
        };
        if !target.is_object() {
            *target = json!({});
        }
        let target = target.as_object_mut().expect("an object");
        for (k, v) in patch {
            if v.is_null() {
                target.remove(k);
            } else {
                merge(target.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }

    /// The strategic merge of `status.conditions` by type, as the API server
    /// applies lockstep's condition patches: a condition of the same type is
    /// merged field by field, others are kept.
    fn merge_conditions(object: &mut Value, patch: &Value) {
        let list = object["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut list = list;
        for c in patch["status"]["conditions"].as_array().expect("a list") {
            match list.iter_mut().find(|o| o["type"] == c["type"]) {
                Some(o) => merge(o, c),
                None => list.push(c.clone()),
            }
        }
        object["status"]["conditions"] = Value::Array(list);
    }

    const STATUSES: [ConditionStatus; 3] = [
        ConditionStatus::True,
        ConditionStatus::False,
        ConditionStatus::Unknown,
    ];
    const EFFECTS: [TaintEffect; 3] = [
        TaintEffect::NoSchedule,
        TaintEffect::PreferNoSchedule,
        TaintEffect::NoExecute,
    ];

    // Every variant is in the tables above: a new one fails to compile here.
    const _: fn(ConditionStatus, TaintEffect) = |s, e| {
        match s {
            ConditionStatus::True | ConditionStatus::False | ConditionStatus::Unknown => {}
        }
        match e {
            TaintEffect::NoSchedule | TaintEffect::PreferNoSchedule | TaintEffect::NoExecute => {}
        }
    };

    #[test]
    fn statuses_and_effects_read_back_as_written() {
        for s in STATUSES {
            assert_eq!(condition_status(condition_status_str(s)), s);
        }
        for e in EFFECTS {
            assert_eq!(taint_effect(taint_effect_str(e)), Some(e));
        }
        assert_eq!(condition_status("true"), ConditionStatus::Unknown);
        assert_eq!(taint_effect("noschedule"), None);
    }

    fn pod_spec(conditions: &[&str], labels: &[&str]) -> ObserveSpec {
        let mut spec = ObserveSpec::from_policy(&Policy::default(), &[]);
        spec.pod_conditions = conditions.iter().map(|c| (*c).to_owned()).collect();
        spec.pod_labels = labels.iter().map(|l| (*l).to_owned()).collect();
        spec.normalize();
        spec
    }

    #[test]
    fn a_pod_condition_written_reads_back_as_wanted() {
        let mut pod = json!({
            "metadata": {"namespace": "slurm", "name": "c1"},
            "status": {"phase": "Running", "conditions": [{"type": READY, "status": "True"}]},
        });
        for status in STATUSES {
            let want = PodCondition {
                type_: "SlurmNodeDrained".to_owned(),
                status,
                reason: "LockstepDrain".to_owned(),
                message: "drained by lockstep".to_owned(),
            };
            merge_conditions(
                &mut pod,
                &condition_patch(&want, Some("2026-01-01T00:00:00Z")),
            );
            let read: Pod = serde_json::from_value(pod.clone()).unwrap();
            let got = reduce::pod(&read, &pod_spec(&["SlurmNodeDrained"], &[])).unwrap();
            assert_eq!(got.conditions, std::slice::from_ref(&want), "{status:?}");
            assert!(got.ready, "the other conditions are kept");
            // What the actuator compares with before it writes.
            let c = read.status.unwrap().conditions;
            assert_eq!(find_condition(c.as_deref(), &want.type_), Some(want));
        }
    }

    #[test]
    fn a_drain_condition_written_on_a_node_reads_back() {
        let mut policy = Policy::default();
        policy.maintenance.enabled = true;
        let spec = ObserveSpec::from_policy(&policy, &[]);
        let mut node = json!({"metadata": {"name": "k1"}, "status": {"conditions": []}});
        for type_ in DRAIN_CONDITIONS {
            let want = PodCondition {
                type_: type_.to_owned(),
                status: ConditionStatus::True,
                reason: "LockstepSlurmDrain".to_owned(),
                message: String::new(),
            };
            merge_conditions(&mut node, &condition_patch(&want, None));
        }
        let read: Node = serde_json::from_value(node).unwrap();
        let got = reduce::node(&read, &spec).unwrap();
        let types: Vec<_> = got.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, [DRAIN_IN_PROGRESS, DRAINED]);
        assert!(got
            .conditions
            .iter()
            .all(|c| c.status == ConditionStatus::True && c.reason == "LockstepSlurmDrain"));
    }

    #[test]
    fn a_status_patch_under_the_field_manager_is_recognised_as_lockstep_s() {
        let manager = patch_params().field_manager.unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "namespace": "slurm", "name": "c1",
                "managedFields": [
                    {"manager": manager, "operation": "Update", "subresource": STATUS_SUBRESOURCE,
                     "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:status": {"f:conditions": {
                         "k:{\"type\":\"OldName\"}": {".": {}, "f:status": {}}}}}},
                    {"manager": "kubelet", "operation": "Update", "subresource": STATUS_SUBRESOURCE,
                     "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:status": {"f:conditions": {
                         "k:{\"type\":\"Ready\"}": {".": {}}}}}},
                ],
            },
            "status": {"conditions": [
                {"type": "OldName", "status": "True"},
                {"type": READY, "status": "True"},
            ]},
        }))
        .unwrap();
        assert_eq!(conditions_written_by_lockstep(&pod.metadata), ["OldName"]);
        // A condition lockstep wrote is observed whatever the policy names.
        let got = reduce::pod(&pod, &pod_spec(&[], &[])).unwrap();
        assert_eq!(got.conditions.len(), 1);
        assert_eq!(got.conditions[0].type_, "OldName");
    }

    #[test]
    fn a_taint_written_reads_back_as_wanted() {
        let spec = ObserveSpec::from_policy(&Policy::default(), &[]);
        for effect in EFFECTS {
            for value in ["", "v"] {
                let want = Taint {
                    key: format!("{LOCKSTEP_TAINT_PREFIX}x"),
                    value: value.to_owned(),
                    effect,
                };
                let entry = taint_entry(&want, "2026-01-01T00:00:00Z");
                let read: KubeTaint = serde_json::from_value(entry.clone()).unwrap();
                assert_eq!(read_taint(&read).as_ref(), Some(&want), "{entry}");
                assert_eq!(
                    read.time_added.is_some(),
                    effect == TaintEffect::NoExecute,
                    "{entry}"
                );

                let mut node = json!({
                    "metadata": {"name": "k1", "resourceVersion": "7"},
                    "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
                });
                let mut taints = node["spec"]["taints"].as_array().cloned().unwrap();
                taints.push(entry);
                merge(&mut node, &taints_patch(Some("7"), Value::Array(taints)));
                let got = reduce::node(&serde_json::from_value(node.clone()).unwrap(), &spec);
                assert_eq!(got.unwrap().taints, std::slice::from_ref(&want), "{node}");

                // `null` removes the last one.
                merge(&mut node, &taints_patch(Some("8"), Value::Null));
                let got = reduce::node(&serde_json::from_value(node).unwrap(), &spec);
                assert!(got.unwrap().taints.is_empty());
            }
        }
    }

    #[test]
    fn a_label_or_annotation_written_reads_back_and_removed_is_gone() {
        assert_eq!(
            MetaKey::parse(POD_DELETION_COST),
            MetaKey::Annotation("controller.kubernetes.io/pod-deletion-cost")
        );
        assert_eq!(
            MetaKey::parse("lockstep.io/busy"),
            MetaKey::Label("lockstep.io/busy")
        );
        for key in [POD_DELETION_COST, "slurm.node", "lockstep.io/busy"] {
            let spec = pod_spec(&[], &[key]);
            let mut pod = json!({"metadata": {"namespace": "slurm", "name": "c1",
                                              "labels": {"x": "y"}, "annotations": {"a": "b"}}});
            let k = MetaKey::parse(key);
            merge(&mut pod, &k.patch(Some("-2147483648")));
            let read: Pod = serde_json::from_value(pod.clone()).unwrap();
            assert_eq!(
                k.get(&read.metadata).map(String::as_str),
                Some("-2147483648")
            );
            let got = reduce::pod(&read, &spec).unwrap();
            assert_eq!(
                got.labels.get(key).map(String::as_str),
                Some("-2147483648"),
                "{pod}"
            );
            // The other labels and annotations are kept.
            assert_eq!(read.metadata.labels.unwrap()["x"], "y");
            assert_eq!(read.metadata.annotations.unwrap()["a"], "b");

            merge(&mut pod, &k.patch(None));
            let read: Pod = serde_json::from_value(pod.clone()).unwrap();
            assert_eq!(k.get(&read.metadata), None);
            assert_eq!(reduce::pod(&read, &spec).unwrap().labels.get(key), None);
        }
    }

    #[test]
    fn a_scale_patch_sets_the_replicas_alone() {
        let mut scale = json!({"metadata": {"name": "compute"}, "spec": {"replicas": 2},
                               "status": {"replicas": 2}});
        merge(&mut scale, &scale_patch(5));
        assert_eq!(
            scale,
            json!({"metadata": {"name": "compute"}, "spec": {"replicas": 5},
                   "status": {"replicas": 2}})
        );
    }
}
