//! Reduces Kubernetes objects to the observations the reducer reads.
//!
//! Everything not named here is dropped: heartbeat times, managed fields,
//! labels and conditions lockstep was not asked about. The resource version
//! is kept as the observation's `version` (so the reducer can drop one older
//! than what it holds), but the tracker compares observations without it: an
//! object whose only change is a kubelet heartbeat reduces to the same
//! observation, and the tracker does not emit it again.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::DynamicObject;
use lockstep_schemas::{
    ConditionStatus, KubeNode, KubePod, KubeScaleTarget, Maintenance, NodeCondition, NodeIdentity,
    OwnerRef, PodCondition, PodPhase, ScaleTargetRef, Taint,
};

pub use super::spec::{ObserveSpec, ScaleKind};
use super::wire::{
    self, condition_status, read_taint, taint_effect_str, MetaKey, ReadCondition,
    DISRUPTION_TARGET, LOCKSTEP_TAINT_PREFIX, MAINTENANCE_IN_PROGRESS, MAINTENANCE_PLANNED,
    MAINTENANCE_WINDOW_ANNOTATION, READY, REVISION_LABEL,
};

/// Node label keys observed by default: the ones topology policies read.
pub const DEFAULT_NODE_LABELS: &[&str] = &["topology.kubernetes.io/zone"];

/// `metadata.resourceVersion` as a number: the etcd revision of the object's
/// last write. Kubernetes calls it opaque; an API server that does not give
/// a decimal number gets 0 (unknown: every observation is applied).
pub fn resource_version(rv: Option<&str>) -> u64 {
    rv.and_then(|s| s.parse().ok()).unwrap_or(0)
}

fn pod_phase(s: Option<&str>) -> PodPhase {
    match s {
        // The API server defaults a new pod's phase to Pending.
        Some("Pending") | None => PodPhase::Pending,
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        Some(_) => PodPhase::Unknown,
    }
}

/// A node's observation, or `None` if it has no name.
pub fn node(node: &Node, spec: &ObserveSpec) -> Option<KubeNode> {
    let name = node.metadata.name.clone().filter(|n| !n.is_empty())?;
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let ready = conditions
        .iter()
        .find(|c| c.type_ == READY)
        .map_or(ConditionStatus::Unknown, |c| condition_status(&c.status));
    let mut watched: Vec<NodeCondition> = conditions
        .iter()
        .filter(|c| spec.node_conditions.binary_search(&c.type_).is_ok())
        .map(|c| NodeCondition {
            type_: c.type_.clone(),
            status: condition_status(&c.status),
            reason: c.reason.clone().unwrap_or_default(),
            message: if spec.node_condition_messages.contains(&c.type_) {
                c.message.clone().unwrap_or_default()
            } else {
                String::new()
            },
        })
        .collect();
    watched.sort_by(|a, b| a.type_.cmp(&b.type_));
    watched.dedup_by(|a, b| a.type_ == b.type_);

    let mut labels = BTreeMap::new();
    for key in &spec.node_labels {
        if let Some(v) = MetaKey::parse(key).get(&node.metadata) {
            labels.insert(key.clone(), v.clone());
        }
    }

    let node_spec = node.spec.as_ref();
    let mut taints: Vec<Taint> = node_spec
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|t| spec.taint_observed(&t.key))
        .filter_map(read_taint)
        .collect();
    taints.sort_by(|a, b| {
        (a.key.as_str(), taint_effect_str(a.effect), a.value.as_str()).cmp(&(
            b.key.as_str(),
            taint_effect_str(b.effect),
            b.value.as_str(),
        ))
    });

    let maintenance = spec
        .maintenance
        .then(|| maintenance(&name, node, conditions))
        .flatten();
    Some(KubeNode {
        name: name.into(),
        unschedulable: node_spec.and_then(|s| s.unschedulable).unwrap_or(false),
        ready,
        conditions: watched,
        labels,
        taints,
        read_labels: Some(spec.node_labels.clone()),
        maintenance,
        identity: if spec.node_identity {
            NodeIdentity {
                uid: node.metadata.uid.clone().unwrap_or_default(),
                boot_id: node
                    .status
                    .as_ref()
                    .and_then(|s| s.node_info.as_ref())
                    .map(|i| i.boot_id.clone())
                    .unwrap_or_default(),
                provider_id: node_spec
                    .and_then(|s| s.provider_id.clone())
                    .unwrap_or_default(),
            }
        } else {
            NodeIdentity::default()
        },
        devices: Default::default(),
        version: resource_version(node.metadata.resource_version.as_deref()),
    })
}

/// The maintenance a node announces: the window of its
/// `lockstep.dev/maintenance-window` annotation, else the one in the message
/// of its `MaintenancePlanned=True` condition; and whether
/// `MaintenanceInProgress` is True. A window that does not parse is left out
/// (and logged): lockstep never guesses a time.
fn maintenance(
    name: &str,
    node: &Node,
    conditions: &[k8s_openapi::api::core::v1::NodeCondition],
) -> Option<Maintenance> {
    let is_true = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t)
            .filter(|c| condition_status(&c.status) == ConditionStatus::True)
    };
    let in_progress = is_true(MAINTENANCE_IN_PROGRESS).is_some();
    let annotated = MetaKey::Annotation(MAINTENANCE_WINDOW_ANNOTATION).get(&node.metadata);
    let window = match annotated {
        Some(text) => match parse_window(text) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(node = name, annotation = MAINTENANCE_WINDOW_ANNOTATION, value = %text, error = %e, "maintenance window ignored");
                None
            }
        },
        None => is_true(MAINTENANCE_PLANNED).and_then(|c| {
            let message = c.message.as_deref().unwrap_or_default();
            let found = message
                .split_whitespace()
                .map(|w| w.trim_end_matches(['.', ',', ';', ')']).trim_start_matches('('))
                .find_map(|w| parse_window(w).ok());
            if found.is_none() {
                tracing::warn!(node = name, message, "MaintenancePlanned without a START/END window (RFC 3339) in its message: nothing reserved");
            }
            found
        }),
    };
    match window {
        Some((start_ms, end_ms, window)) => Some(Maintenance {
            window,
            start_ms,
            end_ms,
            in_progress,
        }),
        None if in_progress => Some(Maintenance {
            window: String::new(),
            start_ms: 0,
            end_ms: None,
            in_progress,
        }),
        None => None,
    }
}

/// Parses a maintenance window `START/END`, `START/` or `START` (RFC 3339
/// times, any offset) into (start ms, end ms, the window normalised to UTC).
pub fn parse_window(text: &str) -> Result<(u64, Option<u64>, String), String> {
    use k8s_openapi::jiff::Timestamp;
    let text = text.trim();
    let (start, end) = text.split_once('/').unwrap_or((text, ""));
    let time = |s: &str| -> Result<Timestamp, String> {
        s.trim()
            .parse::<Timestamp>()
            .map_err(|e| format!("`{s}` is not an RFC 3339 time: {e}"))
    };
    let start = time(start)?;
    let start_ms = u64::try_from(start.as_millisecond())
        .map_err(|_| format!("start {start} is before 1970"))?;
    let end = match end.trim() {
        "" => None,
        e => Some(time(e)?),
    };
    let end_ms = match end {
        Some(e) if e <= start => return Err(format!("end {e} is not after start {start}")),
        Some(e) => Some(u64::try_from(e.as_millisecond()).map_err(|_| "end before 1970")?),
        None => None,
    };
    let window = match end {
        Some(e) => format!("{start}/{e}"),
        None => format!("{start}/"),
    };
    Ok((start_ms, end_ms, window))
}

/// A pod's observation, or `None` if it has no name.
pub fn pod(pod: &Pod, spec: &ObserveSpec) -> Option<KubePod> {
    let meta = &pod.metadata;
    let name = meta.name.clone().filter(|n| !n.is_empty())?;
    let status = pod.status.as_ref();
    let conditions = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let is_true = |type_: &str| {
        conditions
            .iter()
            .any(|c| c.type_ == type_ && condition_status(&c.status) == ConditionStatus::True)
    };
    let disruption_target = is_true(DISRUPTION_TARGET);
    let ready = is_true(READY);
    // The conditions lockstep wrote are always reported, whatever the
    // policy names now, so that one set under a name a later policy dropped
    // is still seen and retired (the condition analogue of labels under
    // `lockstep.io/`).
    let written = wire::conditions_written_by_lockstep(meta);
    let mut managed: Vec<PodCondition> = conditions
        .iter()
        .filter(|c| {
            spec.pod_conditions.binary_search(&c.type_).is_ok() || written.contains(&c.type_)
        })
        .map(ReadCondition::read)
        .collect();
    managed.sort_by(|a, b| a.type_.cmp(&b.type_));
    managed.dedup_by(|a, b| a.type_ == b.type_);

    let all_labels = meta.labels.as_ref();
    let labels: BTreeMap<String, String> = spec
        .pod_labels
        .iter()
        .filter_map(|k| Some((k.clone(), MetaKey::parse(k).get(meta)?.clone())))
        .chain(
            all_labels
                .into_iter()
                .flatten()
                .filter(|(k, _)| k.starts_with(LOCKSTEP_TAINT_PREFIX))
                .map(|(k, v)| (k.clone(), v.clone())),
        )
        .collect();
    let owner = meta
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| OwnerRef {
            kind: o.kind.clone(),
            name: o.name.clone(),
        });

    Some(KubePod {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name,
        uid: meta.uid.clone().unwrap_or_default(),
        node_name: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        phase: pod_phase(status.and_then(|s| s.phase.as_deref())),
        ready,
        deleting: meta.deletion_timestamp.is_some(),
        disruption_target,
        labels,
        conditions: managed,
        owner,
        revision: all_labels.and_then(|l| l.get(REVISION_LABEL)).cloned(),
        unhealthy_devices: if spec.device_faults {
            unhealthy_devices(pod)
        } else {
            Vec::new()
        },
        eviction: Default::default(),
        version: resource_version(meta.resource_version.as_deref()),
    })
}

/// The resources allocated to a pod's containers (init containers too)
/// that the kubelet reports Unhealthy, by resource ID, sorted.
fn unhealthy_devices(pod: &Pod) -> Vec<String> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let mut ids: Vec<String> = [
        status.container_statuses.as_deref(),
        status.init_container_statuses.as_deref(),
    ]
    .into_iter()
    .flatten()
    .flatten()
    .flat_map(|c| c.allocated_resources_status.iter().flatten())
    .flat_map(|r| r.resources.iter().flatten())
    .filter(|h| h.health.as_deref() == Some("Unhealthy"))
    .map(|h| h.resource_id.clone())
    .collect();
    ids.sort();
    ids.dedup();
    ids
}

fn json_path<'a>(v: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.')
        .filter(|p| !p.is_empty())
        .try_fold(v, |v, p| v.get(p))
}

fn json_u32(v: &serde_json::Value, path: &str) -> u32 {
    json_path(v, path)
        .and_then(serde_json::Value::as_u64)
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The reference of a scale target of `kind`, or `None` without a name.
pub fn scale_ref(obj: &DynamicObject, kind: &ScaleKind) -> Option<ScaleTargetRef> {
    Some(ScaleTargetRef {
        group: kind.group.clone(),
        kind: kind.kind.clone(),
        namespace: obj.metadata.namespace.clone().unwrap_or_default(),
        name: obj.metadata.name.clone().filter(|n| !n.is_empty())?,
    })
}

/// A scale target's observation, or `None` if it has no name.
pub fn scale_target(obj: &DynamicObject, kind: &ScaleKind) -> Option<KubeScaleTarget> {
    Some(KubeScaleTarget {
        target: scale_ref(obj, kind)?,
        replicas: json_u32(&obj.data, &kind.replicas_path),
        ready_replicas: json_u32(&obj.data, &kind.ready_replicas_path),
        update_revision: kind
            .update_revision_path
            .as_deref()
            .and_then(|p| json_path(&obj.data, p))
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        version: resource_version(obj.metadata.resource_version.as_deref()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_schemas::{Policy, TaintEffect, POD_DELETION_COST};
    use serde_json::{json, Value};

    fn spec() -> ObserveSpec {
        let mut policy = Policy::default();
        policy.health.node_conditions = vec!["GpuXid".to_owned()];
        policy.mapping.node_name_label = Some("slurm.node".to_owned());
        ObserveSpec::from_policy(&policy, &["topology.kubernetes.io/zone", "annotation:rack"])
    }

    /// The devices the kubelet reports Unhealthy to a pod, read only under
    /// `health.device_faults`: Healthy and Unknown ones are not faults.
    #[test]
    fn a_pod_s_unhealthy_devices_are_read_for_device_faults() {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "n1", "namespace": "slurm", "uid": "u",
                "labels": {"app.kubernetes.io/component": "slurmd"}},
            "spec": {"nodeName": "k1", "containers": [{"name": "slurmd"}]},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "slurmd", "image": "", "imageID": "", "ready": true, "restartCount": 0,
                "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [
                    {"resourceID": "gpu.nvidia.com/k1/gpu-1", "health": "Unhealthy"},
                    {"resourceID": "gpu.nvidia.com/k1/gpu-0", "health": "Healthy"},
                    {"resourceID": "gpu.nvidia.com/k1/gpu-2", "health": "Unknown"},
                ]}],
            }]},
        }))
        .unwrap();
        let mut policy = Policy::default();
        assert!(pod(&p, &ObserveSpec::from_policy(&policy, &[]))
            .unwrap()
            .unhealthy_devices
            .is_empty());
        policy.health.device_faults = true;
        let spec = ObserveSpec::from_policy(&policy, &[]);
        assert_eq!(
            pod(&p, &spec).unwrap().unhealthy_devices,
            ["gpu.nvidia.com/k1/gpu-1"]
        );
    }

    /// Which machine a node is, reported only while the policy gates a
    /// return to service on it.
    #[test]
    fn a_node_s_identity_is_read_only_for_the_return_gate() {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "uid": "u-1", "resourceVersion": "5"},
            "spec": {"providerID": "aws:///us-east-1a/i-0abc"},
            "status": {"nodeInfo": {
                "bootID": "b-1", "machineID": "m", "systemUUID": "s",
                "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "",
                "kubeletVersion": "", "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64",
            }},
        }))
        .unwrap();
        assert!(node(&n, &spec()).unwrap().identity.is_empty());
        let mut policy = Policy::default();
        policy.health.return_condition = "HealthCheckPassed".to_owned();
        let gated = ObserveSpec::from_policy(&policy, &[]);
        assert!(gated
            .node_conditions
            .contains(&"HealthCheckPassed".to_owned()));
        assert_eq!(
            node(&n, &gated).unwrap().identity,
            NodeIdentity {
                uid: "u-1".to_owned(),
                boot_id: "b-1".to_owned(),
                provider_id: "aws:///us-east-1a/i-0abc".to_owned(),
            }
        );
        assert!(spec().changed_watches(&gated).nodes);
    }

    fn node_json(heartbeat: &str, resource_version: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {
                "name": "n1",
                "resourceVersion": resource_version,
                "labels": {"topology.kubernetes.io/zone": "z1", "other": "x"},
                "annotations": {"rack": "r7", "noise": "y"},
            },
            "spec": {
                "unschedulable": true,
                "taints": [
                    {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                    {"key": "lockstep.io/slurm-unhealthy", "effect": "NoSchedule"},
                    {"key": "lockstep.io/a", "value": "v", "effect": "NoExecute", "timeAdded": "2025-01-01T00:00:00Z"},
                ],
            },
            "status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "lastHeartbeatTime": heartbeat},
                {"type": "GpuXid", "status": "True", "reason": "Xid79", "lastHeartbeatTime": heartbeat},
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": heartbeat},
            ]},
        }))
        .unwrap()
    }

    /// A window as written -> (start ms, end ms, normalised), or refused.
    type WindowCase = (&'static str, Result<(u64, Option<u64>, &'static str), ()>);

    #[test]
    fn maintenance_windows_parse_in_any_offset_and_normalise_to_utc() {
        let cases: [WindowCase; 7] = [
            (
                "2026-12-01T03:00:00Z/2026-12-01T05:00:00Z",
                Ok((
                    1_796_094_000_000,
                    Some(1_796_101_200_000),
                    "2026-12-01T03:00:00Z/2026-12-01T05:00:00Z",
                )),
            ),
            (
                " 2026-12-01T04:00:00+01:00/2026-12-01T06:00:00+01:00 ",
                Ok((
                    1_796_094_000_000,
                    Some(1_796_101_200_000),
                    "2026-12-01T03:00:00Z/2026-12-01T05:00:00Z",
                )),
            ),
            (
                "2026-12-01T03:00:00Z/",
                Ok((1_796_094_000_000, None, "2026-12-01T03:00:00Z/")),
            ),
            (
                "2026-12-01T03:00:00Z",
                Ok((1_796_094_000_000, None, "2026-12-01T03:00:00Z/")),
            ),
            ("2026-12-01T05:00:00Z/2026-12-01T03:00:00Z", Err(())),
            ("tomorrow/", Err(())),
            ("", Err(())),
        ];
        for (text, want) in cases {
            let got = parse_window(text);
            match want {
                Ok((start, end, norm)) => {
                    assert_eq!(got, Ok((start, end, norm.to_owned())), "{text:?}");
                }
                Err(()) => assert!(got.is_err(), "{text:?}: {got:?}"),
            }
        }
    }

    fn maintenance_spec() -> ObserveSpec {
        let mut policy = Policy::default();
        policy.maintenance.enabled = true;
        ObserveSpec::from_policy(&policy, &[])
    }

    fn maintenance_node(annotation: Option<&str>, conditions: Value) -> Node {
        let mut n = json!({
            "metadata": {"name": "k1"},
            "status": {"conditions": conditions},
        });
        if let Some(a) = annotation {
            n["metadata"]["annotations"] = json!({MAINTENANCE_WINDOW_ANNOTATION: a});
        }
        serde_json::from_value(n).unwrap()
    }

    #[test]
    fn maintenance_comes_from_the_annotation_else_the_planned_condition() {
        let spec = maintenance_spec();
        let planned = json!([
            {"type": "Ready", "status": "True"},
            {"type": "MaintenancePlanned", "status": "True", "reason": "MaintenanceWindow",
             "message": "BIOS update in window 2026-12-01T03:00:00Z/2026-12-01T05:00:00Z."},
            {"type": "Drained", "status": "True", "reason": "LockstepSlurmDrain"},
        ]);
        let from_condition = node(&maintenance_node(None, planned.clone()), &spec).unwrap();
        let m = from_condition.maintenance.unwrap();
        assert_eq!(m.window, "2026-12-01T03:00:00Z/2026-12-01T05:00:00Z");
        assert!(!m.in_progress);
        // The drain conditions lockstep sets are observed with it.
        assert_eq!(from_condition.conditions.len(), 1);
        assert_eq!(from_condition.conditions[0].type_, "Drained");

        let from_annotation = node(
            &maintenance_node(Some("2026-12-02T03:00:00Z/"), planned),
            &spec,
        )
        .unwrap();
        assert_eq!(from_annotation.maintenance.unwrap().end_ms, None);

        let in_progress = json!([{"type": "MaintenanceInProgress", "status": "True"}]);
        let m = node(&maintenance_node(None, in_progress), &spec)
            .unwrap()
            .maintenance
            .unwrap();
        assert!(m.in_progress && m.window.is_empty() && m.start_ms == 0);

        // Nothing usable: no window in the message, a malformed annotation,
        // a planned maintenance that is False; or the policy off.
        let vague = json!([{"type": "MaintenancePlanned", "status": "True", "message": "soon"}]);
        assert_eq!(
            node(&maintenance_node(None, vague), &spec)
                .unwrap()
                .maintenance,
            None
        );
        assert_eq!(
            node(&maintenance_node(Some("next tuesday"), json!([])), &spec)
                .unwrap()
                .maintenance,
            None
        );
        let off = json!([{"type": "MaintenancePlanned", "status": "False",
                          "message": "2026-12-01T03:00:00Z/2026-12-01T05:00:00Z"}]);
        assert_eq!(
            node(&maintenance_node(None, off), &spec)
                .unwrap()
                .maintenance,
            None
        );
        let n = maintenance_node(Some("2026-12-02T03:00:00Z/"), json!([]));
        assert_eq!(node(&n, &self::spec()).unwrap().maintenance, None);
    }

    #[test]
    fn node_keeps_only_what_the_policy_names() {
        let got = node(&node_json("2025-01-01T00:00:00Z", "17"), &spec()).unwrap();
        let want = KubeNode {
            read_labels: Some(vec![
                "annotation:rack".to_owned(),
                "topology.kubernetes.io/zone".to_owned(),
            ]),
            maintenance: None,
            name: "n1".into(),
            unschedulable: true,
            ready: ConditionStatus::False,
            conditions: vec![NodeCondition {
                type_: "GpuXid".to_owned(),
                status: ConditionStatus::True,
                reason: "Xid79".to_owned(),
                message: String::new(),
            }],
            labels: [
                ("annotation:rack", "r7"),
                ("topology.kubernetes.io/zone", "z1"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
            taints: vec![
                Taint {
                    key: "lockstep.io/a".to_owned(),
                    value: "v".to_owned(),
                    effect: TaintEffect::NoExecute,
                },
                Taint {
                    key: "lockstep.io/slurm-unhealthy".to_owned(),
                    value: String::new(),
                    effect: TaintEffect::NoSchedule,
                },
            ],
            identity: Default::default(),
            devices: Default::default(),
            version: 17,
        };
        assert_eq!(got, want);
        // A heartbeat changes nothing lockstep reads but the version.
        let beat = node(&node_json("2025-01-01T00:00:10Z", "18"), &spec()).unwrap();
        assert_eq!(beat.version, 18);
        assert!(beat.same_but_version(&want));
    }

    #[test]
    fn resource_version_table() {
        let cases = [
            (Some("17"), 17),
            (Some("18446744073709551615"), u64::MAX),
            (Some(""), 0),
            (Some("abc"), 0),
            (Some("-3"), 0),
            (Some("18446744073709551616"), 0),
            (None, 0),
        ];
        for (rv, want) in cases {
            assert_eq!(resource_version(rv), want, "{rv:?}");
        }
    }

    #[test]
    fn node_without_conditions_is_ready_unknown() {
        let n: Node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        let got = node(&n, &spec()).unwrap();
        assert_eq!(got.ready, ConditionStatus::Unknown);
        assert!(!got.unschedulable && got.labels.is_empty() && got.taints.is_empty());
        let nameless: Node = serde_json::from_value(json!({"metadata": {}})).unwrap();
        assert_eq!(node(&nameless, &spec()), None);
    }

    #[test]
    fn pod_reduction() {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {
                "namespace": "slurm", "name": "c1", "uid": "u1", "resourceVersion": "42",
                "deletionTimestamp": "2025-01-01T00:00:00Z",
                "labels": {"slurm.node": "c1", "controller-revision-hash": "r-1", "x": "y",
                           "lockstep.io/busy-before": "true"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Other", "name": "o", "uid": "1"},
                    {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "ss", "uid": "2", "controller": true},
                ],
            },
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
                {"type": "SlurmNodeDrained", "status": "True", "reason": "Admin", "message": "m",
                 "lastTransitionTime": "2025-01-01T00:00:00Z"},
            ]},
        }))
        .unwrap();
        let got = pod(&p, &spec()).unwrap();
        assert_eq!(
            got,
            KubePod {
                namespace: "slurm".to_owned(),
                name: "c1".to_owned(),
                uid: "u1".to_owned(),
                node_name: Some("n1".to_owned()),
                phase: PodPhase::Running,
                ready: true,
                deleting: true,
                disruption_target: true,
                // lockstep's own labels are reported whatever the policy
                // names: one an earlier policy used can still be removed.
                labels: [
                    ("slurm.node".to_owned(), "c1".to_owned()),
                    ("lockstep.io/busy-before".to_owned(), "true".to_owned())
                ]
                .into(),
                conditions: vec![PodCondition {
                    type_: "SlurmNodeDrained".to_owned(),
                    status: ConditionStatus::True,
                    reason: "Admin".to_owned(),
                    message: "m".to_owned(),
                }],
                owner: Some(OwnerRef {
                    kind: "StatefulSet".to_owned(),
                    name: "ss".to_owned()
                }),
                revision: Some("r-1".to_owned()),
                unhealthy_devices: Default::default(),
                eviction: Default::default(),
                version: 42,
            }
        );
    }

    #[test]
    fn deletion_cost_is_watched_for_targets_scaled_in_by_it() {
        let mut policy = Policy::default();
        let spec = ObserveSpec::from_policy(&policy, DEFAULT_NODE_LABELS);
        assert!(!spec.pod_labels.contains(&POD_DELETION_COST.to_owned()));
        policy.scaling.targets = vec![lockstep_schemas::ScaleRule {
            target: ScaleTargetRef {
                group: "apps".to_owned(),
                kind: "ReplicaSet".to_owned(),
                namespace: "slurm".to_owned(),
                name: "web".to_owned(),
            },
            partition: "batch".to_owned(),
            min_replicas: 0,
            max_replicas: 4,
            scale_up_cooldown_s: 30,
            scale_down_cooldown_s: 120,
            idle_before_scale_down_s: 300,
            max_unavailable: 1,
        }];
        let spec = ObserveSpec::from_policy(&policy, DEFAULT_NODE_LABELS);
        assert!(spec.pod_labels.contains(&POD_DELETION_COST.to_owned()));
        assert_eq!(
            spec.scale_kinds,
            [ScaleKind::stateful_set(), ScaleKind::replica_set()]
        );
        let p: Pod = serde_json::from_value(json!({
            "metadata": {
                "namespace": "slurm", "name": "web-1",
                "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-2147483648"},
                "labels": {"controller.kubernetes.io/pod-deletion-cost": "not this"},
            },
        }))
        .unwrap();
        let got = pod(&p, &spec).unwrap();
        assert_eq!(
            got.labels.get(POD_DELETION_COST).map(String::as_str),
            Some("-2147483648")
        );
    }

    #[test]
    fn pod_ready_is_the_ready_condition() {
        let with = |conditions: serde_json::Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"namespace": "slurm", "name": "c1"},
                "status": {"phase": "Running", "conditions": conditions},
            }))
            .unwrap()
        };
        let cases = [
            (json!([{"type": "Ready", "status": "True"}]), true),
            (json!([{"type": "Ready", "status": "False"}]), false),
            (json!([{"type": "Ready", "status": "Unknown"}]), false),
            (
                json!([{"type": "ContainersReady", "status": "True"}]),
                false,
            ),
            (json!([]), false),
        ];
        for (conditions, want) in cases {
            let got = pod(&with(conditions.clone()), &spec()).unwrap();
            assert_eq!(got.ready, want, "{conditions}");
        }
    }

    #[test]
    fn pod_phase_table() {
        let cases = [
            (None, PodPhase::Pending),
            (Some("Pending"), PodPhase::Pending),
            (Some("Running"), PodPhase::Running),
            (Some("Succeeded"), PodPhase::Succeeded),
            (Some("Failed"), PodPhase::Failed),
            (Some("Unknown"), PodPhase::Unknown),
            (Some("Surprising"), PodPhase::Unknown),
        ];
        for (s, want) in cases {
            assert_eq!(pod_phase(s), want, "{s:?}");
        }
    }

    #[test]
    fn stateful_set_as_scale_target() {
        let kind = ScaleKind::stateful_set();
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"namespace": "slurm", "name": "compute", "resourceVersion": "9"},
            "spec": {"replicas": 4},
            "status": {"readyReplicas": 3, "updateRevision": "compute-abc"},
        }))
        .unwrap();
        assert_eq!(
            scale_target(&obj, &kind).unwrap(),
            KubeScaleTarget {
                target: ScaleTargetRef {
                    group: "apps".to_owned(),
                    kind: "StatefulSet".to_owned(),
                    namespace: "slurm".to_owned(),
                    name: "compute".to_owned(),
                },
                replicas: 4,
                ready_replicas: 3,
                update_revision: Some("compute-abc".to_owned()),
                version: 9,
            }
        );
        let fresh: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"namespace": "slurm", "name": "compute"},
            "spec": {"replicas": 2},
        }))
        .unwrap();
        let got = scale_target(&fresh, &kind).unwrap();
        assert_eq!(
            (got.replicas, got.ready_replicas, got.update_revision),
            (2, 0, None)
        );
        assert_eq!(kind.api_resource().api_version, "apps/v1");
    }
}
