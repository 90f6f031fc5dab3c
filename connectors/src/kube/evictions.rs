//! The evictions of pods that lockstep answers as their eviction responder
//! (`lifecycle.k8s.io/v1alpha1` Evictions labelled with the responder's
//! name, `drain.eviction_responder`), by pod.
//!
//! Pure: the observer feeds it the Eviction watcher's events and asks which
//! pods' evictions changed; a pod's eviction travels on its `KubePod`
//! observation ([`PodEviction`]), versioned by the Eviction's
//! `resourceVersion`: the latest one, over (`TargetEvicted` or `Failed`
//! True: done, canceled or failed) or not. A listing (`Init` .. `InitDone`)
//! replaces what was known at its end.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::lifecycle::v1alpha1::Eviction;
use kube::runtime::watcher;
use lockstep_schemas::{PodEviction, ResponderState};

use super::multimap::link;

/// A pod: (namespace, name).
pub(crate) type PodRef = (String, String);

/// What lockstep keeps of one Eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    pod: PodRef,
    pod_uid: String,
    eviction: PodEviction,
}

/// Every Eviction known, and the listing in progress.
#[derive(Debug)]
pub(crate) struct Evictions {
    responder: String,
    /// By (namespace, Eviction name).
    known: HashMap<(String, String), Entry>,
    /// The Evictions of each pod, as keys of `known`.
    of_pod: HashMap<PodRef, BTreeSet<(String, String)>>,
    listing: Option<HashMap<(String, String), Entry>>,
}

impl Evictions {
    /// Evictions as the responder `responder` sees them.
    pub(crate) fn new(responder: &str) -> Self {
        Self {
            responder: responder.to_owned(),
            known: HashMap::new(),
            of_pod: HashMap::new(),
            listing: None,
        }
    }

    /// The latest eviction of the pod `(namespace, name)` with `uid`.
    pub(crate) fn of(&self, namespace: &str, name: &str, uid: &str) -> Option<PodEviction> {
        self.of_pod
            .get(&(namespace.to_owned(), name.to_owned()))
            .into_iter()
            .flatten()
            .filter_map(|k| self.known.get(k))
            .filter(|e| e.pod_uid.is_empty() || uid.is_empty() || e.pod_uid == uid)
            .map(|e| &e.eviction)
            .max_by_key(|e| e.version)
            .cloned()
    }

    /// One watcher event; the pods whose eviction may have changed.
    pub(crate) fn step(&mut self, e: watcher::Event<Eviction>) -> Vec<PodRef> {
        match e {
            watcher::Event::Init => {
                self.listing = Some(HashMap::new());
                Vec::new()
            }
            watcher::Event::InitApply(o) => {
                if let (Some(key), Some(l)) = (key(&o), self.listing.as_mut()) {
                    l.insert(key, entry(&o, &self.responder));
                }
                Vec::new()
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let pods: BTreeSet<PodRef> = self
                    .known
                    .values()
                    .chain(listed.values())
                    .map(|e| e.pod.clone())
                    .collect();
                self.known = listed;
                self.of_pod.clear();
                for (k, e) in &self.known {
                    link(&mut self.of_pod, &e.pod, k, true);
                }
                pods.into_iter().collect()
            }
            watcher::Event::Apply(o) => {
                let Some(key) = key(&o) else {
                    return Vec::new();
                };
                let new = entry(&o, &self.responder);
                let pod = new.pod.clone();
                let old = self.known.insert(key.clone(), new.clone());
                if let Some(old) = &old {
                    link(&mut self.of_pod, &old.pod, &key, false);
                }
                link(&mut self.of_pod, &pod, &key, true);
                if old.as_ref() == Some(&new) {
                    Vec::new()
                } else {
                    let mut pods = vec![pod];
                    pods.extend(old.map(|o| o.pod).filter(|p| *p != pods[0]));
                    pods
                }
            }
            watcher::Event::Delete(o) => {
                let Some((k, e)) = key(&o).and_then(|k| self.known.remove(&k).map(|e| (k, e)))
                else {
                    return Vec::new();
                };
                link(&mut self.of_pod, &e.pod, &k, false);
                vec![e.pod]
            }
        }
    }
}

fn key(e: &Eviction) -> Option<(String, String)> {
    Some((e.metadata.namespace.clone()?, e.metadata.name.clone()?))
}

/// What `responder` reads of one Eviction.
fn entry(e: &Eviction, responder: &str) -> Entry {
    let target = e.spec.target.pod.as_ref();
    let pod = (
        e.metadata.namespace.clone().unwrap_or_default(),
        target.map(|p| p.name.clone()).unwrap_or_default(),
    );
    let pod_uid = target.map(|p| p.uid.clone()).unwrap_or_default();
    let status = e.status.as_ref();
    let fin = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|c| (c.type_ == "TargetEvicted" || c.type_ == "Failed") && c.status == "True");
    let state = status
        .and_then(|s| s.target_responders.as_deref())
        .and_then(|t| t.iter().find(|r| r.name == responder))
        .map(|r| match r.state.as_str() {
            "Inactive" => ResponderState::Inactive,
            "Active" => ResponderState::Active,
            "Interrupted" => ResponderState::Interrupted,
            "Canceled" => ResponderState::Canceled,
            "Completed" => ResponderState::Completed,
            _ => ResponderState::Unknown,
        });
    let completed = status
        .and_then(|s| s.responders.as_deref())
        .and_then(|r| r.iter().find(|r| r.name == responder))
        .is_some_and(|r| r.completion_time.is_some());
    let version = e
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Before the controller lists the responders, an Eviction of a pod that
    // names lockstep (it is labelled with the name) is lockstep's, not its
    // turn yet.
    let eviction = PodEviction {
        name: e.metadata.name.clone().unwrap_or_default(),
        state: state.unwrap_or(ResponderState::Inactive),
        completed,
        over: fin,
        version,
    };
    Entry {
        pod,
        pod_uid,
        eviction,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const R: &str = "lockstep.dev/slurm-drain";

    fn eviction(name: &str, rv: u64, pod: &str, state: &str, extra: Value) -> Eviction {
        let mut status = json!({
            "targetResponders": [
                {"name": R, "priority": 10000, "state": state},
                {"name": "imperative-eviction.k8s.io/evictor", "priority": 100, "state": "Inactive"},
            ],
            "responders": [{"name": R}, {"name": "imperative-eviction.k8s.io/evictor"}],
        });
        if let Value::Object(m) = extra {
            for (k, v) in m {
                status[k] = v;
            }
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "slurm", "resourceVersion": rv.to_string(),
                "labels": {R: "responder"}},
            "spec": {"target": {"pod": {"name": pod, "uid": "u-1"}}},
            "status": status,
        }))
        .unwrap()
    }

    /// A story, one step a line: the pods that changed, and what n1's
    /// eviction reads after it.
    #[test]
    fn evictions_follow_the_pods_they_target() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let mut e = Evictions::new(R);
        let n1 = ("slurm".to_owned(), "n1".to_owned());
        let of = |e: &Evictions| {
            e.of("slurm", "n1", "u-1")
                .filter(|p| !p.over)
                .map(|p| (p.state, p.completed, p.name))
        };
        assert!(e.step(Init).is_empty());
        assert_eq!(e.step(InitDone), Vec::<PodRef>::new());
        // Created, not lockstep's turn; then its turn.
        assert_eq!(
            e.step(Apply(eviction("pod-1-n1", 5, "n1", "Inactive", json!({})))),
            std::slice::from_ref(&n1)
        );
        assert_eq!(
            of(&e),
            Some((ResponderState::Inactive, false, "pod-1-n1".to_owned()))
        );
        e.step(Apply(eviction("pod-1-n1", 6, "n1", "Active", json!({}))));
        assert_eq!(of(&e).map(|o| o.0), Some(ResponderState::Active));
        // lockstep completed.
        let done = json!({"responders": [{"name": R, "completionTime": "2026-12-04T03:00:00Z"}]});
        e.step(Apply(eviction("pod-1-n1", 7, "n1", "Completed", done)));
        assert_eq!(
            of(&e).map(|o| (o.0, o.1)),
            Some((ResponderState::Completed, true))
        );
        // The pod is gone: the Eviction is final, nothing under way.
        let evicted = json!({"conditions": [
            {"type": "TargetEvicted", "status": "True", "reason": "PodDeleted", "message": "", "lastTransitionTime": "2026-12-04T03:00:00Z"}]});
        e.step(Apply(eviction("pod-1-n1", 8, "n1", "Completed", evicted)));
        assert_eq!(of(&e), None);
        // A second eviction, canceled: final too.
        e.step(Apply(eviction("pod-2-n1", 9, "n1", "Active", json!({}))));
        assert_eq!(of(&e).map(|o| o.2), Some("pod-2-n1".to_owned()));
        let canceled = json!({"conditions": [
            {"type": "Failed", "status": "True", "reason": "CanceledDueToNoRequesters", "message": "", "lastTransitionTime": "2026-12-04T03:00:00Z"}]});
        e.step(Apply(eviction("pod-2-n1", 10, "n1", "Canceled", canceled)));
        assert_eq!(of(&e), None);
        // Another pod's eviction, deleted; a relist that finds none.
        let n2 = ("slurm".to_owned(), "n2".to_owned());
        assert_eq!(
            e.step(Apply(eviction("pod-1-n2", 11, "n2", "Active", json!({})))),
            std::slice::from_ref(&n2)
        );
        assert_eq!(
            e.step(Delete(eviction("pod-1-n2", 12, "n2", "Active", json!({})))),
            std::slice::from_ref(&n2)
        );
        e.step(Apply(eviction("pod-3-n1", 13, "n1", "Active", json!({}))));
        e.step(Init);
        e.step(InitApply(eviction(
            "pod-4-n2",
            14,
            "n2",
            "Inactive",
            json!({}),
        )));
        assert_eq!(e.step(InitDone), [n1, n2]);
        assert_eq!(
            e.of("slurm", "n1", "u-1"),
            None,
            "the relist has none of n1"
        );
        // A pod of the same name with another uid is another pod.
        assert_eq!(e.of("slurm", "n2", "u-other"), None);
        assert!(e.of("slurm", "n2", "u-1").is_some());
    }
}
