//! Which DRA devices of each Kubernetes node device taints mark faulty:
//! the taints on the devices of its ResourceSlices, and those that
//! DeviceTaintRules put on them (`resource.k8s.io/v1`).
//!
//! Pure: the observer feeds it the two watchers' events, already reduced,
//! and asks which nodes' faults changed. A node's faults travel on its
//! `KubeNode` observation ([`NodeDevices`]), versioned by the newest
//! `resourceVersion` among the slices and rules (an etcd revision, so
//! ordered across kinds) when they last changed.
//!
//! A listing (`Init` .. `InitDone`) of either kind replaces what was known
//! of it at its end, so a taint removed while the watch was down is gone
//! after the next listing.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::resource::v1::{DeviceTaint, DeviceTaintRule, ResourceSlice};
use kube::runtime::watcher;
use lockstep_schemas::NodeDevices;

/// A device taint that takes a device out: NoSchedule or NoExecute (the
/// effect `None` is informational).
fn faulting(t: &DeviceTaint) -> Option<String> {
    matches!(t.effect.as_str(), "NoSchedule" | "NoExecute").then(|| {
        format!(
            "{}={}:{}",
            t.key,
            t.value.as_deref().unwrap_or_default(),
            t.effect
        )
    })
}

/// What lockstep keeps of a ResourceSlice: its devices, the node of each,
/// and their faulting taints.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slice {
    driver: String,
    pool: String,
    /// (device, its node, its faulting taints); devices of no one node
    /// (network-attached) are left out.
    devices: Vec<(String, String, Vec<String>)>,
}

impl Slice {
    /// The nodes its devices are on.
    fn nodes(&self) -> BTreeSet<&String> {
        self.devices.iter().map(|(_, node, _)| node).collect()
    }

    fn of(s: &ResourceSlice) -> Self {
        let spec = &s.spec;
        let slice_node = spec.node_name.clone();
        let devices = spec
            .devices
            .iter()
            .flatten()
            .filter_map(|d| {
                let node = d.node_name.clone().or_else(|| slice_node.clone())?;
                let taints = d.taints.iter().flatten().filter_map(faulting).collect();
                Some((d.name.clone(), node, taints))
            })
            .collect();
        Self {
            driver: spec.driver.clone(),
            pool: spec.pool.name.clone(),
            devices,
        }
    }
}

/// What lockstep keeps of a DeviceTaintRule: whom it selects (unset: any)
/// and its taint, if it takes devices out.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    driver: Option<String>,
    pool: Option<String>,
    device: Option<String>,
    taint: Option<String>,
}

impl Rule {
    fn of(r: &DeviceTaintRule) -> Self {
        let sel = r.spec.device_selector.as_ref();
        Self {
            driver: sel.and_then(|s| s.driver.clone()),
            pool: sel.and_then(|s| s.pool.clone()),
            device: sel.and_then(|s| s.device.clone()),
            taint: faulting(&r.spec.taint),
        }
    }

    fn selects(&self, driver: &str, pool: &str, device: &str) -> bool {
        let ok = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        ok(&self.driver, driver) && ok(&self.pool, pool) && ok(&self.device, device)
    }
}

/// Objects of one kind by name, and the listing in progress.
#[derive(Debug)]
struct Known<T> {
    by_name: HashMap<String, T>,
    listing: Option<HashMap<String, T>>,
}

impl<T> Default for Known<T> {
    fn default() -> Self {
        Self {
            by_name: HashMap::new(),
            listing: None,
        }
    }
}

/// What one watcher event changed of what is known.
enum Changed<T> {
    Nothing,
    /// One object, named, changed; what was known of it before (`None`:
    /// it is new). What is known now is in `by_name` (absent: deleted).
    One(String, Option<T>),
    /// A listing replaced everything.
    All,
}

impl<T: PartialEq> Known<T> {
    /// Applies one watcher event.
    fn step<K: kube::Resource>(
        &mut self,
        e: watcher::Event<K>,
        of: impl Fn(&K) -> T,
    ) -> Changed<T> {
        let name = |o: &K| o.meta().name.clone();
        match e {
            watcher::Event::Init => {
                self.listing = Some(HashMap::new());
                Changed::Nothing
            }
            watcher::Event::InitApply(o) => {
                if let (Some(l), Some(n)) = (self.listing.as_mut(), name(&o)) {
                    l.insert(n, of(&o));
                }
                Changed::Nothing
            }
            watcher::Event::InitDone => {
                self.by_name = self.listing.take().unwrap_or_default();
                Changed::All
            }
            watcher::Event::Apply(o) => match name(&o) {
                Some(n) => {
                    let new = of(&o);
                    match self.by_name.insert(n.clone(), new) {
                        Some(old) if Some(&old) == self.by_name.get(&n) => Changed::Nothing,
                        old => Changed::One(n, old),
                    }
                }
                None => Changed::Nothing,
            },
            watcher::Event::Delete(o) => match name(&o) {
                Some(n) => match self.by_name.remove(&n) {
                    Some(old) => Changed::One(n, Some(old)),
                    None => Changed::Nothing,
                },
                None => Changed::Nothing,
            },
        }
    }
}

/// The device faults of every node, from the slices and rules known.
///
/// A slice that changes re-derives the nodes of its devices only; a rule,
/// which may select devices anywhere, and a listing re-derive every node.
#[derive(Debug, Default)]
pub(crate) struct Devices {
    slices: Known<Slice>,
    rules: Known<Rule>,
    /// The slices with devices on each node, by name.
    slices_on: HashMap<String, BTreeSet<String>>,
    /// The newest resourceVersion seen of either kind.
    revision: u64,
    /// The faults last derived, per node (nodes never faulty are absent).
    faults: BTreeMap<String, NodeDevices>,
}

impl Devices {
    /// A ResourceSlice watcher event; the nodes whose faults changed.
    pub(crate) fn slice(&mut self, e: watcher::Event<ResourceSlice>) -> Vec<String> {
        self.see(&e);
        match self.slices.step(e, Slice::of) {
            Changed::Nothing => Vec::new(),
            Changed::All => {
                self.slices_on.clear();
                for (name, s) in &self.slices.by_name {
                    index(&mut self.slices_on, name, s, true);
                }
                self.derive_all()
            }
            Changed::One(name, old) => {
                let mut nodes = BTreeSet::new();
                if let Some(old) = &old {
                    index(&mut self.slices_on, &name, old, false);
                    nodes.extend(old.nodes().into_iter().cloned());
                }
                if let Some(new) = self.slices.by_name.get(&name) {
                    index(&mut self.slices_on, &name, new, true);
                    nodes.extend(new.nodes().into_iter().cloned());
                }
                nodes.into_iter().filter(|n| self.derive(n)).collect()
            }
        }
    }

    /// A DeviceTaintRule watcher event; the nodes whose faults changed.
    pub(crate) fn rule(&mut self, e: watcher::Event<DeviceTaintRule>) -> Vec<String> {
        self.see(&e);
        match self.rules.step(e, Rule::of) {
            Changed::Nothing => Vec::new(),
            Changed::All | Changed::One(..) => self.derive_all(),
        }
    }

    /// The device faults of `node` as last derived.
    pub(crate) fn of(&self, node: &str) -> NodeDevices {
        self.faults.get(node).cloned().unwrap_or_default()
    }

    fn see<K: kube::Resource>(&mut self, e: &watcher::Event<K>) {
        let o = match e {
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                o
            }
            _ => return,
        };
        let v = o
            .meta()
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        self.revision = self.revision.max(v);
    }

    /// Derives every node's faults again; the nodes whose faults changed,
    /// in name order.
    fn derive_all(&mut self) -> Vec<String> {
        let nodes: BTreeSet<String> = self
            .slices_on
            .keys()
            .chain(self.faults.keys())
            .cloned()
            .collect();
        nodes.into_iter().filter(|n| self.derive(n)).collect()
    }

    /// Derives `node`'s faults again; whether they changed. Changed ones
    /// are versioned with the newest revision.
    fn derive(&mut self, node: &str) -> bool {
        let mut now = BTreeSet::new();
        for s in self
            .slices_on
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|name| self.slices.by_name.get(name))
        {
            for (device, _, taints) in s.devices.iter().filter(|(_, n, _)| n == node) {
                let ruled = self
                    .rules
                    .by_name
                    .values()
                    .filter(|r| r.selects(&s.driver, &s.pool, device))
                    .filter_map(|r| r.taint.as_deref());
                for t in taints.iter().map(String::as_str).chain(ruled) {
                    now.insert(format!("{}/{}/{device} {t}", s.driver, s.pool));
                }
            }
        }
        let faults: Vec<String> = now.into_iter().collect();
        let before = self.faults.get(node).map_or(&[][..], |d| &d.faults[..]);
        if before == faults.as_slice() {
            return false;
        }
        // Cleared faults are kept, empty, with the revision that cleared
        // them: the node's next observation carries that news.
        self.faults.insert(
            node.to_owned(),
            NodeDevices {
                faults,
                version: self.revision,
            },
        );
        true
    }
}

/// Adds (or removes) slice `name` to (from) the nodes of its devices.
fn index(on: &mut HashMap<String, BTreeSet<String>>, name: &str, s: &Slice, add: bool) {
    let name = name.to_owned();
    for node in s.nodes() {
        super::multimap::link(on, node, &name, add);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(name: &str, rv: u64, node: &str, devices: serde_json::Value) -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "resourceVersion": rv.to_string()},
            "spec": {
                "driver": "gpu.nvidia.com", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }))
        .unwrap()
    }

    fn rule(name: &str, rv: u64, device: &str, effect: &str) -> DeviceTaintRule {
        serde_json::from_value(json!({
            "metadata": {"name": name, "resourceVersion": rv.to_string()},
            "spec": {
                "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "k1", "device": device},
                "taint": {"key": "ops/nvlink", "value": "down", "effect": effect},
            },
        }))
        .unwrap()
    }

    /// A story, one step a line: what changes, the nodes whose faults
    /// changed, and k1's faults after it.
    #[test]
    fn faults_follow_slices_and_rules() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let mut d = Devices::default();
        let xid = json!([
            {"name": "gpu-0", "taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]},
            {"name": "gpu-1"},
        ]);
        let clean = json!([{"name": "gpu-0"}, {"name": "gpu-1"}]);
        let info = json!([{"name": "gpu-0", "taints": [{"key": "note", "effect": "None"}]}]);
        let f0 = "gpu.nvidia.com/k1/gpu-0 gpu.nvidia.com/xid=79:NoSchedule";
        let f1 = "gpu.nvidia.com/k1/gpu-1 ops/nvlink=down:NoExecute";
        // The first listing of slices: k1's gpu-0 is tainted.
        assert!(d.slice(Init).is_empty());
        assert!(d
            .slice(InitApply(slice("s1", 5, "k1", xid.clone())))
            .is_empty());
        assert!(d
            .slice(InitApply(slice("s2", 6, "k2", clean.clone())))
            .is_empty());
        assert_eq!(d.slice(InitDone), ["k1"]);
        assert_eq!(d.of("k1").faults, [f0]);
        assert_eq!(d.of("k1").version, 6);
        assert!(d.of("k2").is_empty());
        // A rule taints gpu-1; an informational one (effect None) nothing.
        assert_eq!(d.rule(Apply(rule("r1", 9, "gpu-1", "NoExecute"))), ["k1"]);
        assert_eq!(d.of("k1").faults, [f0, f1]);
        assert_eq!(d.of("k1").version, 9);
        assert!(d.rule(Apply(rule("r2", 10, "gpu-0", "None"))).is_empty());
        // The driver clears gpu-0's taint; the rule goes.
        assert_eq!(d.slice(Apply(slice("s1", 11, "k1", clean.clone()))), ["k1"]);
        assert_eq!(d.of("k1").faults, [f1]);
        assert_eq!(d.rule(Delete(rule("r1", 12, "gpu-1", "NoExecute"))), ["k1"]);
        assert!(d.of("k1").faults.is_empty());
        // A status-only change of a slice changes nothing.
        assert!(d.slice(Apply(slice("s1", 13, "k1", clean))).is_empty());
        assert!(d.slice(Apply(slice("s1", 14, "k1", info))).is_empty());
        // A taint put on while the watch was down: the relist finds it, and
        // a slice deleted meanwhile takes its taints with it.
        d.slice(Apply(slice("s2", 15, "k2", xid.clone())));
        assert_eq!(d.of("k2").faults.len(), 1);
        d.slice(Init);
        d.slice(InitApply(slice("s1", 20, "k1", xid)));
        assert_eq!(d.slice(InitDone), ["k1", "k2"]);
        assert_eq!(d.of("k1").faults, [f0]);
        assert!(d.of("k2").faults.is_empty());
    }
}
