//! The Kubernetes actuator: carries out the reducer's Kubernetes actions.
//!
//! Every action reads its target first and reports
//! [`OutcomeResult::AlreadyDone`] if it already holds, so executing an
//! action twice (after a crash, a failover, a retry) changes nothing the
//! second time. Every call is bounded by a timeout, and every action ends
//! in an [`ActionOutcome`]: errors become `Failed { retryable }`, never a
//! panic or a hang.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::lifecycle::v1alpha1::Eviction;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::Client;
use lockstep_schemas::{
    Action, ActionOutcome, IssuedAction, OutcomeResult, PodCondition, ScaleTargetRef, Taint,
};
use tokio::sync::watch;

use super::discover::discover;
use super::error::{Error, Result};
use super::spec::ScaleKind;
use super::wire::{self, read_taint, MetaKey};

/// Bounds of the actuator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActuatorConfig {
    /// Timeout to connect to the API server.
    pub connect_timeout_ms: u64,
    /// Timeout of one API call (read of the response).
    pub request_timeout_ms: u64,
    /// Timeout of one whole action, all its calls included.
    pub action_timeout_ms: u64,
    /// How often a read-modify-write that lost a race (409 Conflict) is
    /// tried again within one action before it is reported as retryable.
    pub conflict_attempts_max: u32,
}

impl Default for ActuatorConfig {
    fn default() -> Self {
        Self {
            connect_timeout_ms: 5_000,
            request_timeout_ms: 10_000,
            action_timeout_ms: 30_000,
            conflict_attempts_max: 3,
        }
    }
}

/// What an action did when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Done {
    Changed,
    Already,
}

/// Executes Kubernetes actions.
#[derive(Clone)]
pub struct Actuator {
    client: Client,
    /// The kinds of scale target it scales besides the `apps/v1` ones: the
    /// ones the policy in force names ([`scale_kinds`](super::scale_kinds)).
    scale_kinds: watch::Receiver<Vec<ScaleKind>>,
    config: ActuatorConfig,
}

impl std::fmt::Debug for Actuator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actuator")
            .field("scale_kinds", &*self.scale_kinds.borrow())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Actuator {
    /// An actuator for the cluster of `kube_config` (see
    /// [`load_config`](super::load_config)) that can scale targets of
    /// `scale_kinds` (and of the `apps/v1` kinds, always).
    pub fn new(
        kube_config: kube::Config,
        scale_kinds: Vec<ScaleKind>,
        config: ActuatorConfig,
    ) -> Result<Self> {
        // A list nobody changes: the receiver keeps the last value.
        let (_unchanged, scale_kinds) = watch::channel(scale_kinds);
        Self::following(kube_config, scale_kinds, config)
    }

    /// [`Actuator::new`], scaling from each action on the kinds `scale_kinds`
    /// holds at that moment (the service sends the ones of each policy put in
    /// force).
    pub fn following(
        mut kube_config: kube::Config,
        scale_kinds: watch::Receiver<Vec<ScaleKind>>,
        config: ActuatorConfig,
    ) -> Result<Self> {
        kube_config.connect_timeout = Some(Duration::from_millis(config.connect_timeout_ms));
        kube_config.read_timeout = Some(Duration::from_millis(config.request_timeout_ms));
        kube_config.write_timeout = Some(Duration::from_millis(config.request_timeout_ms));
        kube_config.reset_reader_on_write = true;
        let client = Client::try_from(kube_config).map_err(|e| Error::Client(Box::new(e)))?;
        Ok(Self {
            client,
            scale_kinds,
            config,
        })
    }

    /// The kind of `target` if this actuator scales it: one it was given,
    /// else an `apps/v1` kind lockstep knows how to scale in, whatever the
    /// policy lists.
    fn scale_kind(&self, target: &ScaleTargetRef) -> Option<ScaleKind> {
        if let Some(k) = self.scale_kinds.borrow().iter().find(|k| k.matches(target)) {
            return Some(k.clone());
        }
        Some(ScaleKind::for_target(target)).filter(|k| !k.needs_discovery())
    }

    /// Executes one action and reports how it ended. Never fails, never
    /// takes longer than `action_timeout_ms` (plus scheduling).
    pub async fn execute(&self, issued: &IssuedAction) -> ActionOutcome {
        let action = &issued.action;
        let timeout_ms = self.config.action_timeout_ms;
        let result =
            match tokio::time::timeout(Duration::from_millis(timeout_ms), self.apply(action)).await
            {
                Ok(Ok(Done::Changed)) => OutcomeResult::Succeeded,
                Ok(Ok(Done::Already)) => OutcomeResult::AlreadyDone,
                Ok(Err(e)) => failed(&e),
                Err(_) => failed(&Error::Timeout {
                    what: action.describe(),
                    timeout_ms,
                }),
            };
        match &result {
            OutcomeResult::Failed { retryable, error } => tracing::warn!(
                action_id = %issued.id,
                kind = action.kind().name(),
                retryable,
                error = %error,
                "kubernetes action failed"
            ),
            r => tracing::info!(
                action_id = %issued.id,
                kind = action.kind().name(),
                already_done = (*r == OutcomeResult::AlreadyDone),
                "kubernetes action done"
            ),
        }
        ActionOutcome {
            action_id: issued.id.clone(),
            kind: action.kind(),
            target: action.target(),
            result,
        }
    }

    async fn apply(&self, action: &Action) -> Result<Done> {
        match action {
            Action::KubeSetPodCondition {
                namespace,
                pod,
                condition,
            } => self.set_pod_condition(namespace, pod, condition).await,
            Action::KubeTaintNode { node, taint } => {
                self.edit_taints(node, |taints| taint_node(taints, taint))
                    .await
            }
            Action::KubeUntaintNode { node, key } => {
                self.edit_taints(node, |taints| untaint_node(taints, key))
                    .await
            }
            Action::KubeLabelPod {
                namespace,
                pod,
                key,
                value,
            } => self.label_pod(namespace, pod, key, value.as_deref()).await,
            Action::KubeDeletePod {
                namespace,
                pod,
                uid,
            } => self.delete_pod(namespace, pod, uid).await,
            Action::KubeScale { target, replicas } => self.scale(target, *replicas).await,
            Action::KubeSetNodeCondition { node, condition } => {
                self.set_node_condition(node, condition).await
            }
            Action::KubeLabelNode { node, key, value } => {
                self.label_node(node, key, value.as_deref()).await
            }
            Action::KubeRespondEviction {
                namespace,
                eviction,
                responder,
                message,
                complete,
                ..
            } => {
                self.respond_eviction(namespace, eviction, responder, message, *complete)
                    .await
            }
            // Every other action is Slurm's (the dispatcher routes by
            // `ActionKind::connector`): refused, as the Slurm actuator
            // refuses what is not its own, so that a new Slurm action does
            // not touch this one.
            other => Err(Error::NotKubernetes(other.kind().name())),
        }
    }

    async fn set_pod_condition(
        &self,
        namespace: &str,
        name: &str,
        want: &PodCondition,
    ) -> Result<Done> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let what = format!("get pod {namespace}/{name}");
        let pod = api.get(name).await.map_err(|e| Error::from_kube(what, e))?;
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_deref());
        let current = wire::find_condition(conditions, &want.type_);
        let Some(patch) = condition_patch(current.as_ref(), want) else {
            return Ok(Done::Already);
        };
        api.patch_status(name, &wire::patch_params(), &Patch::Strategic(patch))
            .await
            .map_err(|e| Error::from_kube(format!("patch status of pod {namespace}/{name}"), e))?;
        Ok(Done::Changed)
    }

    /// Sets one condition on a node's status (the node lifecycle conditions
    /// `DrainInProgress`, `Drained`): a strategic merge by type, as for pods.
    async fn set_node_condition(&self, name: &str, want: &PodCondition) -> Result<Done> {
        let api: Api<Node> = Api::all(self.client.clone());
        let what = format!("get node {name}");
        let node = api.get(name).await.map_err(|e| Error::from_kube(what, e))?;
        let conditions = node.status.as_ref().and_then(|s| s.conditions.as_deref());
        let current = wire::find_condition(conditions, &want.type_);
        let Some(patch) = condition_patch(current.as_ref(), want) else {
            return Ok(Done::Already);
        };
        api.patch_status(name, &wire::patch_params(), &Patch::Strategic(patch))
            .await
            .map_err(|e| Error::from_kube(format!("patch status of node {name}"), e))?;
        Ok(Done::Changed)
    }

    /// Read-modify-write of a node's taints, guarded by its resourceVersion
    /// so that a concurrent change to the other taints is never lost.
    async fn edit_taints(
        &self,
        node: &str,
        edit: impl Fn(&[k8s_openapi::api::core::v1::Taint]) -> Option<serde_json::Value>,
    ) -> Result<Done> {
        let api: Api<Node> = Api::all(self.client.clone());
        let mut attempt = 1;
        loop {
            let n = api
                .get(node)
                .await
                .map_err(|e| Error::from_kube(format!("get node {node}"), e))?;
            let taints = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_deref())
                .unwrap_or_default();
            let Some(new_taints) = edit(taints) else {
                return Ok(Done::Already);
            };
            let patch = wire::taints_patch(n.metadata.resource_version.as_deref(), new_taints);
            match api
                .patch(node, &wire::patch_params(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => return Ok(Done::Changed),
                Err(kube::Error::Api(s))
                    if s.code == 409 && attempt < self.config.conflict_attempts_max =>
                {
                    tracing::debug!(node, attempt, "taint patch conflict; reading again");
                    attempt += 1;
                }
                Err(e) => return Err(Error::from_kube(format!("patch taints of node {node}"), e)),
            }
        }
    }

    /// Sets or removes a pod label, or with a key `annotation:<key>` an
    /// annotation (`controller.kubernetes.io/pod-deletion-cost` for scale-in),
    /// as a JSON merge patch (`null` removes).
    async fn label_pod(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<Done> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        label(&api, name, &format!("pod {namespace}/{name}"), key, value).await
    }

    /// Reports on an eviction as its responder: a server-side apply of
    /// lockstep's own `status.responders` entry (`heartbeatTime`, `message`;
    /// `completionTime` when `complete`), as the EvictionRequest API asks of
    /// a responder. Only the active responder may write its entry; one that
    /// completed already is done.
    async fn respond_eviction(
        &self,
        namespace: &str,
        name: &str,
        responder: &str,
        message: &str,
        complete: bool,
    ) -> Result<Done> {
        let api: Api<Eviction> = Api::namespaced(self.client.clone(), namespace);
        let what = format!("eviction {namespace}/{name}");
        let eviction = api
            .get(name)
            .await
            .map_err(|e| Error::from_kube(format!("get {what}"), e))?;
        let status = eviction.status.as_ref();
        let mine = status
            .and_then(|s| s.responders.as_deref())
            .and_then(|r| r.iter().find(|r| r.name == responder));
        if mine.is_some_and(|m| m.completion_time.is_some()) {
            return Ok(Done::Already);
        }
        let state = status
            .and_then(|s| s.target_responders.as_deref())
            .and_then(|t| t.iter().find(|r| r.name == responder))
            .map(|r| r.state.as_str());
        if state != Some("Active") {
            return Err(Error::Malformed {
                what,
                detail: format!(
                    "the responder {responder} is {}, not Active: it may not report",
                    state.unwrap_or("not among the eviction's responders")
                ),
            });
        }
        let now = rfc3339_now();
        let mut entry = serde_json::json!({
            "name": responder, "heartbeatTime": now, "message": message,
        });
        if complete {
            entry["completionTime"] = serde_json::json!(now);
        }
        let body = serde_json::json!({
            "apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"responders": [entry]},
        });
        let params = PatchParams::apply(wire::FIELD_MANAGER).force();
        api.patch_status(name, &params, &Patch::Apply(body))
            .await
            .map_err(|e| Error::from_kube(format!("report on {what}"), e))?;
        Ok(Done::Changed)
    }

    /// Sets or removes a node label, or with a key `annotation:<key>` an
    /// annotation (the one naming the node's Slurm nodes).
    async fn label_node(&self, name: &str, key: &str, value: Option<&str>) -> Result<Done> {
        let api: Api<Node> = Api::all(self.client.clone());
        label(&api, name, &format!("node {name}"), key, value).await
    }

    async fn delete_pod(&self, namespace: &str, name: &str, uid: &str) -> Result<Done> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let what = format!("delete pod {namespace}/{name}");
        let pod = match api.get_opt(name).await {
            Ok(Some(pod)) => pod,
            // The pod is gone: what the delete wanted holds.
            Ok(None) => return Ok(Done::Already),
            Err(e) => return Err(Error::from_kube(what, e)),
        };
        if pod.metadata.uid.as_deref() == Some(uid) && pod.metadata.deletion_timestamp.is_some() {
            return Ok(Done::Already);
        }
        // Even when the UID read above differs, the refusal is left to the
        // API server's precondition: it is the atomic check.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => Ok(Done::Changed),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Done::Already),
            // The only precondition sent is the UID, so a conflict is its
            // failure, whatever the server's wording.
            Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::UidPrecondition {
                what,
                message: s.message,
            }),
            Err(e) => Err(Error::from_kube(what, e)),
        }
    }

    /// Sets `spec.replicas` through the target's scale subresource, which
    /// every kind that can be scaled has, whatever its own fields: read,
    /// compare, then a merge patch of the replicas alone.
    async fn scale(&self, target: &ScaleTargetRef, replicas: u32) -> Result<Done> {
        let kind = self
            .scale_kind(target)
            .ok_or_else(|| Error::UnknownScaleKind {
                group: target.group.clone(),
                kind: target.kind.clone(),
            })?;
        // Asked at each action (scales are rare: cooldowns of tens of
        // seconds), so a CRD installed or upgraded since is followed. Once
        // the kind is known to be served, a 404 below is the object's.
        let kind = discover(&self.client, &kind).await?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &target.namespace, &kind.api_resource());
        let scale = api
            .get_scale(&target.name)
            .await
            .map_err(|e| Error::from_kube(format!("get scale of {target}"), e))?;
        let current = scale.spec.as_ref().and_then(|s| s.replicas);
        if current.and_then(|r| u32::try_from(r).ok()) == Some(replicas) {
            return Ok(Done::Already);
        }
        let patch = wire::scale_patch(replicas);
        api.patch_scale(&target.name, &wire::patch_params(), &Patch::Merge(patch))
            .await
            .map_err(|e| Error::from_kube(format!("scale {target}"), e))?;
        Ok(Done::Changed)
    }
}

/// The strategic merge patch ([`wire::condition_patch`]) that makes a
/// condition (as currently read back, of the same type) what is wanted, or
/// `None` when it already is. Its `lastTransitionTime` is sent only when the
/// status changes.
fn condition_patch(
    current: Option<&PodCondition>,
    want: &PodCondition,
) -> Option<serde_json::Value> {
    if current == Some(want) {
        return None;
    }
    let status_changes = current.is_none_or(|c| c.status != want.status);
    let now = status_changes.then(rfc3339_now);
    Some(wire::condition_patch(want, now.as_deref()))
}

/// Sets or removes one label or (`annotation:<key>`) annotation of the
/// object `name` as a JSON merge patch (`null` removes); `what` names it in
/// errors.
async fn label<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    key: &str,
    value: Option<&str>,
) -> Result<Done>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let object = api
        .get(name)
        .await
        .map_err(|e| Error::from_kube(format!("get {what}"), e))?;
    let key = MetaKey::parse(key);
    if key.get(object.meta()).map(String::as_str) == value {
        return Ok(Done::Already);
    }
    let patch = key.patch(value);
    api.patch(name, &wire::patch_params(), &Patch::Merge(patch))
        .await
        .map_err(|e| Error::from_kube(format!("label {what}"), e))?;
    Ok(Done::Changed)
}

fn failed(e: &Error) -> OutcomeResult {
    OutcomeResult::Failed {
        retryable: e.retryable(),
        error: e.to_string(),
    }
}

/// The taint list with `taint` in place of any taint with its key, or
/// `None` if it is already there exactly.
fn taint_node(
    taints: &[k8s_openapi::api::core::v1::Taint],
    taint: &Taint,
) -> Option<serde_json::Value> {
    let same_key: Vec<_> = taints.iter().filter(|t| t.key == taint.key).collect();
    if let [only] = same_key.as_slice() {
        if read_taint(only).as_ref() == Some(taint) {
            return None;
        }
    }
    let mut out: Vec<serde_json::Value> = taints
        .iter()
        .filter(|t| t.key != taint.key)
        .map(|t| serde_json::to_value(t).expect("taints serialize"))
        .collect();
    out.push(wire::taint_entry(taint, &rfc3339_now()));
    Some(serde_json::Value::Array(out))
}

/// The taint list without taints of `key`, or `None` if there is none.
fn untaint_node(
    taints: &[k8s_openapi::api::core::v1::Taint],
    key: &str,
) -> Option<serde_json::Value> {
    if !taints.iter().any(|t| t.key == key) {
        return None;
    }
    let rest: Vec<serde_json::Value> = taints
        .iter()
        .filter(|t| t.key != key)
        .map(|t| serde_json::to_value(t).expect("taints serialize"))
        .collect();
    // `null` removes the field, as `kubectl taint ... -` does for the last one.
    Some(if rest.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::Value::Array(rest)
    })
}

fn rfc3339_now() -> String {
    let secs = i64::try_from(crate::clock::now_s()).unwrap_or(i64::MAX);
    Timestamp::from_second(secs)
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Taint as KTaint;
    use lockstep_schemas::{ActionKind, ConditionStatus, Connector, TaintEffect};
    use serde_json::json;

    fn kt(key: &str, value: Option<&str>, effect: &str) -> KTaint {
        KTaint {
            key: key.to_owned(),
            value: value.map(str::to_owned),
            effect: effect.to_owned(),
            time_added: None,
        }
    }

    fn lt(key: &str, value: &str, effect: TaintEffect) -> Taint {
        Taint {
            key: key.to_owned(),
            value: value.to_owned(),
            effect,
        }
    }

    #[test]
    fn taint_edits_keep_other_taints() {
        let foreign = kt("node.kubernetes.io/not-ready", None, "NoSchedule");
        let ours = kt("lockstep.io/x", Some("v"), "NoSchedule");
        // Already there exactly: nothing to do.
        assert_eq!(
            taint_node(
                &[foreign.clone(), ours.clone()],
                &lt("lockstep.io/x", "v", TaintEffect::NoSchedule)
            ),
            None
        );
        // New value replaces the old taint of that key, keeps the foreign one.
        let got = taint_node(
            &[foreign.clone(), ours.clone()],
            &lt("lockstep.io/x", "w", TaintEffect::NoSchedule),
        )
        .unwrap();
        assert_eq!(
            got,
            json!([
                {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                {"key": "lockstep.io/x", "value": "w", "effect": "NoSchedule"},
            ])
        );
        // NoExecute gets timeAdded.
        let got = taint_node(&[], &lt("lockstep.io/x", "", TaintEffect::NoExecute)).unwrap();
        assert!(
            got[0]["timeAdded"].as_str().unwrap().ends_with('Z'),
            "{got}"
        );
        // Untaint.
        assert_eq!(
            untaint_node(std::slice::from_ref(&foreign), "lockstep.io/x"),
            None
        );
        assert_eq!(
            untaint_node(&[foreign.clone(), ours.clone()], "lockstep.io/x").unwrap(),
            json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}])
        );
        assert_eq!(
            untaint_node(&[ours], "lockstep.io/x").unwrap(),
            serde_json::Value::Null
        );
    }

    /// An action of `kind`. A kind added without one here fails to compile.
    fn one_of(kind: ActionKind) -> Action {
        let node = || "n1".to_owned();
        let (namespace, pod) = ("slurm".to_owned(), "c1".to_owned());
        let condition = PodCondition {
            type_: "SlurmNodeDrained".to_owned(),
            status: ConditionStatus::True,
            reason: "LockstepDrain".to_owned(),
            message: String::new(),
        };
        match kind {
            ActionKind::SlurmDrain => Action::SlurmDrain {
                node: node(),
                reason: "r".to_owned(),
            },
            ActionKind::SlurmResume => Action::SlurmResume { node: node() },
            ActionKind::SlurmDown => Action::SlurmDown {
                node: node(),
                reason: "r".to_owned(),
            },
            ActionKind::SlurmSetFeatures => Action::SlurmSetFeatures {
                node: node(),
                features: vec!["gpu".to_owned()],
            },
            ActionKind::SlurmSetTopology => Action::SlurmSetTopology {
                node: node(),
                topology: "blocks:b1".to_owned(),
            },
            ActionKind::SlurmReserve => Action::SlurmReserve {
                name: "lockstep_maint_k1".to_owned(),
                nodes: vec![node()],
                start_ms: 0,
                end_ms: None,
                users: "root".to_owned(),
            },
            ActionKind::SlurmUnreserve => Action::SlurmUnreserve {
                name: "lockstep_maint_k1".to_owned(),
            },
            ActionKind::KubeSetPodCondition => Action::KubeSetPodCondition {
                namespace,
                pod,
                condition,
            },
            ActionKind::KubeTaintNode => Action::KubeTaintNode {
                node: node(),
                taint: lt("lockstep.io/x", "", TaintEffect::NoSchedule),
            },
            ActionKind::KubeUntaintNode => Action::KubeUntaintNode {
                node: node(),
                key: "lockstep.io/x".to_owned(),
            },
            ActionKind::KubeLabelPod => Action::KubeLabelPod {
                namespace,
                pod,
                key: "lockstep.io/busy".to_owned(),
                value: None,
            },
            ActionKind::KubeDeletePod => Action::KubeDeletePod {
                namespace,
                pod,
                uid: "u1".to_owned(),
            },
            ActionKind::KubeScale => Action::KubeScale {
                target: ScaleTargetRef {
                    group: "apps".to_owned(),
                    kind: "StatefulSet".to_owned(),
                    namespace,
                    name: "compute".to_owned(),
                },
                replicas: 2,
            },
            ActionKind::KubeSetNodeCondition => Action::KubeSetNodeCondition {
                node: node(),
                condition,
            },
            ActionKind::KubeLabelNode => Action::KubeLabelNode {
                node: node(),
                key: "annotation:lockstep.dev/slurm-nodes".to_owned(),
                value: Some("n1".to_owned()),
            },
            ActionKind::KubeRespondEviction => Action::KubeRespondEviction {
                namespace,
                pod,
                eviction: "pod-1-n1".to_owned(),
                responder: "lockstep.dev/slurm-drain".to_owned(),
                message: "Slurm node n1 drained; no job runs".to_owned(),
                beat: 0,
                complete: true,
            },
        }
    }

    /// Every Kubernetes action is carried out (here: tried, on an API server
    /// that does not answer), every other one refused as not this
    /// actuator's, whatever kinds are added on the Slurm side.
    #[tokio::test]
    async fn only_the_actions_of_other_connectors_are_refused() {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let act = Actuator::new(
            config,
            Vec::new(),
            ActuatorConfig {
                connect_timeout_ms: 500,
                request_timeout_ms: 500,
                action_timeout_ms: 2_000,
                conflict_attempts_max: 1,
            },
        )
        .unwrap();
        for kind in ActionKind::ALL {
            let outcome = act
                .execute(&lockstep_testkit::issued(1, one_of(kind)))
                .await;
            assert_eq!(outcome.kind, kind);
            let OutcomeResult::Failed { retryable, error } = &outcome.result else {
                panic!("{kind}: {outcome:?}");
            };
            let refused = error.starts_with("not a kubernetes action");
            assert_eq!(
                refused,
                kind.connector() != Connector::Kubernetes,
                "{kind}: {error}"
            );
            if refused {
                assert!(!retryable, "{kind}");
                assert_eq!(error, &format!("not a kubernetes action: {}", kind.name()));
            }
        }
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let t = rfc3339_now();
        assert!(
            t.len() == 20 && t.ends_with('Z') && t.as_bytes()[10] == b'T',
            "{t}"
        );
    }
}
