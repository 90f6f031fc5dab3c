//! The joined node model: what the log says Slurm and Kubernetes look like,
//! with the indexes that join a Slurm node to its pod and Kubernetes node.
//!
//! The model only records observations; actions in flight are in `flights`.
//! It decides nothing: the rules read it through [`NodeView`]. It also holds
//! the relevance filter ([`slurm_relevant_change`]): which changes of an
//! observation any rule reads.

use std::collections::{BTreeMap, BTreeSet};

use lockstep_schemas::{
    Domain, EventId, KubeNode, KubePod, KubeScaleTarget, MappingMode, Policy, ScaleTargetRef,
    SlurmBaseState, SlurmJob, SlurmJobState, SlurmNode, SlurmPartition,
};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::cow::CowMap;
use crate::sorted;

/// A name as the key of a large table: names of up to 24 bytes (every
/// node name seen in practice) are held inside the key itself, so a look-up
/// compares them without reading another allocation, which a busy cluster's
/// tables would mostly find out of cache. The same type as the observations'
/// own inline strings, so a key is made from them without a conversion.
pub(crate) type Name = lockstep_schemas::Text;

/// An observed object and the sync generation in which it was last listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Seen<T> {
    pub obs: T,
    pub gen: u32,
}

/// Where a condition started: log time and the event that made it true.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Origin {
    pub ms: u64,
    pub seq: u64,
    pub event: EventId,
}

/// A pod as last observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PodEntry {
    pub obs: KubePod,
    pub gen: u32,
}

#[cfg(test)]
impl PodEntry {
    /// The entry of a pod first seen as `obs`.
    pub fn of(obs: KubePod) -> Self {
        Self { obs, gen: 0 }
    }
}

/// A Kubernetes node, and since when it is not Ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KubeEntry {
    pub obs: KubeNode,
    pub gen: u32,
    /// Log time of the first observation in the current NotReady/Unknown spell.
    pub not_ready_since: Option<Origin>,
    /// Labels the policy started to read since this node was last observed
    /// (`retired::newly_read_labels`): not acted on until it is observed again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unseen_labels: Vec<String>,
}

#[cfg(test)]
impl KubeEntry {
    /// The entry of a node first seen as `obs`, in no NotReady spell.
    pub fn of(obs: KubeNode) -> Self {
        Self {
            obs,
            gen: 0,
            not_ready_since: None,
            unseen_labels: Vec::new(),
        }
    }
}

/// What lockstep waits for after it sees Slurm again: a complete listing of
/// its nodes and of its jobs, each started after sight came back. What it
/// held from before the blackout may be wrong in every way (an admin drained,
/// resumed or took over a drain meanwhile), and a diff is only as good as the
/// snapshot it is taken against; so no rule acts on Slurm until both
/// listings have been applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Regain {
    pub nodes: Relist,
    pub jobs: Relist,
}

/// One domain's listing after sight came back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Relist {
    /// No listing has started since.
    #[default]
    Awaited,
    /// A listing started since (its `SyncStarted` was applied).
    Listing,
    /// A listing that started since is complete.
    Listed,
}

impl Regain {
    /// The listing of `domain` started (`SyncStarted`).
    pub fn started(&mut self, domain: Domain) {
        if let Some(r) = self.of(domain) {
            if *r == Relist::Awaited {
                *r = Relist::Listing;
            }
        }
    }

    /// The listing of `domain` ended (`SyncDone`); whether every awaited
    /// listing is now in.
    pub fn done(&mut self, domain: Domain) -> bool {
        if let Some(r) = self.of(domain) {
            if *r == Relist::Listing {
                *r = Relist::Listed;
            }
        }
        self.nodes == Relist::Listed && self.jobs == Relist::Listed
    }

    fn of(&mut self, domain: Domain) -> Option<&mut Relist> {
        match domain {
            Domain::SlurmNodes => Some(&mut self.nodes),
            Domain::SlurmJobs => Some(&mut self.jobs),
            _ => None,
        }
    }
}

/// A full listing in progress.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SyncState {
    /// Generation of the current or last listing.
    pub gen: u32,
    /// Whether a listing is in progress.
    pub listing: bool,
}

/// Everything observed, plus derived join indexes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Model {
    pub slurm_nodes: CowMap<Name, Seen<SlurmNode>>,
    pub jobs: CowMap<u64, Seen<SlurmJob>>,
    #[serde(with = "sorted")]
    pub partitions: FxHashMap<String, Seen<SlurmPartition>>,
    pub kube_nodes: CowMap<Name, KubeEntry>,
    /// Key: `namespace/name`.
    pub pods: CowMap<String, PodEntry>,
    #[serde(with = "sorted")]
    pub scale_targets: FxHashMap<ScaleTargetRef, Seen<KubeScaleTarget>>,
    /// Indexed by [`domain_index`].
    pub sync: [SyncState; 6],
    pub slurm_visible: bool,
    pub kube_visible: bool,
    /// lockstep lost sight of Slurm and has seen it again, and the complete
    /// listings that must be applied before it trusts what it holds are not
    /// all in yet: Slurm stays invisible to the rules until they are
    /// ([`Regain`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_regain: Option<Regain>,
    /// Kubernetes nodes deleted (or missing from a relist) and not Ready
    /// again since, with the event that showed them gone. Bounded: an entry
    /// goes when a node of that name is Ready, when no Slurm node is on it
    /// any more, and past [`KUBE_NODES_GONE_MAX`] (the oldest first).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kube_gone: BTreeMap<String, Origin>,

    // Derived from the above and the policy; rebuilt on restore and on a
    // mapping change, so neither serialized nor hashed.
    /// Slurm node -> keys of the pods that claim it, sorted.
    #[serde(skip)]
    pod_claims: FxHashMap<Name, Vec<String>>,
    /// Kubernetes node -> Slurm nodes whose pod runs on it (pod mode).
    #[serde(skip)]
    on_kube_node: FxHashMap<Name, BTreeSet<String>>,
    /// Slurm node -> the Kubernetes node in `on_kube_node` it is filed under.
    #[serde(skip)]
    placed_on: FxHashMap<Name, String>,
    /// Slurm node -> jobs holding it.
    #[serde(skip)]
    running_jobs: FxHashMap<Name, u32>,
    /// Partition -> nodes wanted by pending jobs that more nodes can help.
    #[serde(skip)]
    pending_nodes: FxHashMap<Name, u64>,
    /// The policy's unscalable pending reasons, as the index was built with.
    #[serde(skip)]
    unscalable: Vec<String>,
}

/// Deleted Kubernetes nodes remembered at most (see [`Model::kube_gone`]).
pub(crate) const KUBE_NODES_GONE_MAX: usize = 65_536;

pub(crate) const fn domain_index(d: Domain) -> usize {
    match d {
        Domain::SlurmNodes => 0,
        Domain::SlurmJobs => 1,
        Domain::SlurmPartitions => 2,
        Domain::KubeNodes => 3,
        Domain::KubePods => 4,
        Domain::KubeScaleTargets => 5,
    }
}

/// `namespace/name`.
pub(crate) fn pod_key(namespace: &str, name: &str) -> String {
    let mut k = String::with_capacity(namespace.len() + name.len() + 1);
    k.push_str(namespace);
    k.push('/');
    k.push_str(name);
    k
}

/// The Slurm node a pod runs, under the policy's mapping.
pub(crate) fn slurm_name_of_pod<'a>(pod: &'a KubePod, policy: &Policy) -> Option<&'a str> {
    match policy.mapping.mode {
        MappingMode::Host => None,
        MappingMode::Pod => match &policy.mapping.node_name_label {
            Some(label) => pod.labels.get(label).map(String::as_str),
            None => Some(pod.name.as_str()),
        },
    }
}

/// Counts a job that holds its nodes in (or out of) the per-node counts,
/// noting nodes that go from idle to busy or back.
fn hold(running: &mut FxHashMap<Name, u32>, job: &SlurmJob, add: bool, flipped: &mut Vec<Name>) {
    if !job.state.holds_nodes() {
        return;
    }
    for node in &job.nodes {
        if add {
            match running.get_mut(node.as_str()) {
                Some(n) => *n += 1,
                None => {
                    running.insert(node.as_str().into(), 1);
                    flipped.push(node.clone());
                }
            }
        } else if let Some(n) = running.get_mut(node.as_str()) {
            *n -= 1;
            if *n == 0 {
                running.remove(node.as_str());
                flipped.push(node.clone());
            }
        }
    }
}

/// Counts a pending job's node demand in (or out of) its partition's total.
fn demand(pending: &mut FxHashMap<Name, u64>, unscalable: &[String], job: &SlurmJob, add: bool) {
    if !scalable(job, unscalable) {
        return;
    }
    let n = u64::from(job.node_count.max(1));
    if add {
        match pending.get_mut(&job.partition) {
            Some(total) => *total += n,
            None => {
                pending.insert(job.partition.clone(), n);
            }
        }
    } else if let Some(total) = pending.get_mut(&job.partition) {
        *total = total.saturating_sub(n);
        if *total == 0 {
            pending.remove(&job.partition);
        }
    }
}

/// One Slurm node joined with its pod and Kubernetes node. (Tests start
/// from the default: nothing joined.)
#[cfg_attr(test, derive(Default))]
pub(crate) struct NodeView<'a> {
    pub slurm: Option<&'a SlurmNode>,
    pub pod_key: Option<&'a str>,
    pub pod: Option<&'a PodEntry>,
    pub kube_name: Option<&'a str>,
    pub kube: Option<&'a KubeEntry>,
    /// The Kubernetes node under it was deleted: since when.
    pub kube_gone: Option<&'a Origin>,
}

impl Model {
    pub fn new() -> Self {
        Self {
            slurm_visible: true,
            kube_visible: true,
            ..Self::default()
        }
    }

    /// A copy of what a snapshot holds, without the derived indexes (see
    /// [`crate::Engine::frozen`]). The large tables are shared, not copied.
    pub fn frozen(&self) -> Self {
        // Every field named, so that a field added later is not forgotten.
        let Self {
            slurm_nodes,
            jobs,
            partitions,
            kube_nodes,
            pods,
            scale_targets,
            sync,
            slurm_visible,
            kube_visible,
            slurm_regain,
            kube_gone,
            pod_claims: _,
            on_kube_node: _,
            placed_on: _,
            running_jobs: _,
            pending_nodes: _,
            unscalable: _,
        } = self;
        Self {
            slurm_nodes: slurm_nodes.clone(),
            jobs: jobs.clone(),
            partitions: partitions.clone(),
            kube_nodes: kube_nodes.clone(),
            pods: pods.clone(),
            scale_targets: scale_targets.clone(),
            sync: *sync,
            slurm_visible: *slurm_visible,
            kube_visible: *kube_visible,
            slurm_regain: *slurm_regain,
            kube_gone: kube_gone.clone(),
            ..Self::default()
        }
    }

    /// Joins one Slurm node with its pod and Kubernetes node.
    pub fn view<'a>(&'a self, name: &'a str, policy: &Policy) -> NodeView<'a> {
        let slurm = self.slurm_nodes.get(name).map(|s| &s.obs);
        let (pod_key, pod) = match self.pod_of(name) {
            Some((k, p)) => (Some(k), Some(p)),
            None => (None, None),
        };
        let kube_name = match policy.mapping.mode {
            MappingMode::Host => Some(name),
            MappingMode::Pod => pod.and_then(|p| p.obs.node_name.as_deref()),
        };
        let kube = kube_name.and_then(|k| self.kube_nodes.get(k));
        let kube_gone = kube_name.and_then(|k| self.kube_gone.get(k));
        NodeView {
            slurm,
            pod_key,
            pod,
            kube_name,
            kube,
            kube_gone,
        }
    }

    /// The pod that runs a Slurm node. When several claim it (a replacement
    /// starting while the old one terminates), the first not being deleted,
    /// by key, wins; the choice is deterministic.
    pub fn pod_of(&self, slurm: &str) -> Option<(&str, &PodEntry)> {
        let claims = self.pod_claims.get(slurm)?;
        let mut first = None;
        for key in claims {
            let Some(entry) = self.pods.get(key) else {
                continue;
            };
            if !entry.obs.deleting {
                return Some((key.as_str(), entry));
            }
            first.get_or_insert((key.as_str(), entry));
        }
        first
    }

    /// The Slurm nodes on a Kubernetes node, sorted.
    pub fn slurm_nodes_on(&self, kube: &str, policy: &Policy, out: &mut Vec<String>) {
        match policy.mapping.mode {
            MappingMode::Host => out.push(kube.to_owned()),
            MappingMode::Pod => {
                if let Some(set) = self.on_kube_node.get(kube) {
                    out.extend(set.iter().cloned());
                }
            }
        }
    }

    /// How many jobs hold a Slurm node.
    pub fn jobs_on(&self, slurm: &str) -> u32 {
        self.running_jobs.get(slurm).copied().unwrap_or(0)
    }

    /// Adds or removes a pod's claim and placement in the indexes.
    pub fn index_pod(&mut self, key: &str, pod: &KubePod, policy: &Policy, add: bool) {
        let Some(slurm) = slurm_name_of_pod(pod, policy) else {
            return;
        };
        if add {
            let claims = self.pod_claims.entry(slurm.into()).or_default();
            if let Err(i) = claims.binary_search_by(|k| k.as_str().cmp(key)) {
                claims.insert(i, key.to_owned());
            }
        } else if let Some(claims) = self.pod_claims.get_mut(slurm) {
            claims.retain(|k| k != key);
            if claims.is_empty() {
                self.pod_claims.remove(slurm);
            }
        }
        self.reindex_placement(slurm, policy);
    }

    /// Re-derives which Kubernetes node a Slurm node runs on (pod mode: the
    /// node of the pod that wins its claims).
    fn reindex_placement(&mut self, slurm: &str, policy: &Policy) {
        if let Some(old) = self.placed_on.remove(slurm) {
            if let Some(set) = self.on_kube_node.get_mut(old.as_str()) {
                set.remove(slurm);
                if set.is_empty() {
                    self.on_kube_node.remove(old.as_str());
                }
            }
        }
        if policy.mapping.mode != MappingMode::Pod {
            return;
        }
        let node = self
            .pod_of(slurm)
            .and_then(|(_, p)| p.obs.node_name.clone());
        if let Some(node) = node {
            self.on_kube_node
                .entry(node.as_str().into())
                .or_default()
                .insert(slurm.to_owned());
            self.placed_on.insert(slurm.into(), node);
        }
    }

    /// The Kubernetes node a Slurm node runs on, if known.
    pub fn placement<'a>(&'a self, slurm: &'a str, policy: &Policy) -> Option<&'a str> {
        match policy.mapping.mode {
            MappingMode::Host => Some(slurm),
            MappingMode::Pod => self.placed_on.get(slurm).map(String::as_str),
        }
    }

    /// Records a job observation: its hold on its nodes and its pending
    /// demand. Nodes that became busy or idle are pushed to `flipped`.
    pub fn upsert_job(&mut self, job: &SlurmJob, gen: u32, flipped: &mut Vec<Name>) {
        match self.jobs.get_mut(&job.job_id) {
            Some(seen) => {
                seen.gen = gen;
                if seen.obs.same_but_key_and_version(job) {
                    seen.obs.version = job.version;
                    return;
                }
                hold(&mut self.running_jobs, &seen.obs, false, flipped);
                demand(&mut self.pending_nodes, &self.unscalable, &seen.obs, false);
                seen.obs.assign_from(job);
            }
            None => {
                self.jobs.insert(
                    job.job_id,
                    Seen {
                        obs: job.clone(),
                        gen,
                    },
                );
            }
        }
        hold(&mut self.running_jobs, job, true, flipped);
        demand(&mut self.pending_nodes, &self.unscalable, job, true);
    }

    /// Forgets a job. Nodes that became idle are pushed to `flipped`.
    pub fn remove_job(&mut self, job_id: u64, flipped: &mut Vec<Name>) {
        if let Some(seen) = self.jobs.remove(&job_id) {
            hold(&mut self.running_jobs, &seen.obs, false, flipped);
            demand(&mut self.pending_nodes, &self.unscalable, &seen.obs, false);
        }
    }

    /// Slurm nodes some job holds.
    pub fn nodes_with_jobs(&self) -> impl Iterator<Item = String> + '_ {
        self.running_jobs.keys().map(Name::to_string)
    }

    /// Nodes wanted by a partition's pending jobs that more nodes can help.
    pub fn pending_nodes(&self, partition: &str) -> u64 {
        self.pending_nodes.get(partition).copied().unwrap_or(0)
    }

    /// Rebuilds every derived index from the observations.
    pub fn rebuild_indexes(&mut self, policy: &Policy) {
        self.pod_claims.clear();
        self.on_kube_node.clear();
        self.placed_on.clear();
        self.running_jobs.clear();
        self.pending_nodes.clear();
        self.unscalable
            .clone_from(&policy.scaling.unscalable_pending_reasons);
        let mut keys: Vec<String> = self.pods.keys().cloned().collect();
        keys.sort_unstable();
        for key in &keys {
            let pod = self.pods[key].obs.clone();
            if let Some(slurm) = slurm_name_of_pod(&pod, policy) {
                self.pod_claims
                    .entry(slurm.into())
                    .or_default()
                    .push(key.clone());
            }
        }
        let slurm: Vec<String> = self.pod_claims.keys().map(Name::to_string).collect();
        for s in slurm {
            self.reindex_placement(&s, policy);
        }
        let mut flipped = Vec::new();
        for seen in self.jobs.values() {
            hold(&mut self.running_jobs, &seen.obs, true, &mut flipped);
            demand(&mut self.pending_nodes, &self.unscalable, &seen.obs, true);
        }
    }
}
/// The relevance filter: whether two observations of a Slurm node differ in
/// anything a rule reads.
/// Every rule that starts reading another field of [`SlurmNode`] must add it
/// here; a change that differs only in the rest (IDLE, MIXED and ALLOCATED
/// as jobs come and go) needs no evaluation.
pub(crate) fn slurm_relevant_change(a: &SlurmNode, b: &SlurmNode) -> bool {
    (a.state == SlurmBaseState::Down) != (b.state == SlurmBaseState::Down)
        || a.flags != b.flags
        || a.reason != b.reason
        || a.reason_user != b.reason_user
        || a.features != b.features
        || a.topology != b.topology
        || a.partitions != b.partitions
}

/// Whether a pending job is demand that more nodes can meet.
pub(crate) fn scalable(job: &SlurmJob, unscalable_reasons: &[String]) -> bool {
    job.state == SlurmJobState::Pending
        && !job
            .pending_reason
            .as_deref()
            .is_some_and(|r| unscalable_reasons.iter().any(|u| r.starts_with(u.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_reasons_that_nodes_cannot_fix_do_not_count() {
        let reasons: Vec<String> = ["Dependency", "JobHeld", "QOS"].map(str::to_owned).to_vec();
        let job = |state: SlurmJobState, reason: Option<&str>| SlurmJob {
            job_id: 1,
            state,
            partition: "p".into(),
            nodes: vec![],
            node_count: 1,
            pending_reason: reason.map(str::to_owned),
            version: 0,
        };
        assert!(scalable(
            &job(SlurmJobState::Pending, Some("Resources")),
            &reasons
        ));
        assert!(scalable(&job(SlurmJobState::Pending, None), &reasons));
        assert!(!scalable(
            &job(SlurmJobState::Pending, Some("Dependency")),
            &reasons
        ));
        assert!(!scalable(
            &job(SlurmJobState::Pending, Some("JobHeldUser")),
            &reasons
        ));
        assert!(!scalable(
            &job(SlurmJobState::Pending, Some("QOSMaxJobsPerUserLimit")),
            &reasons
        ));
        assert!(!scalable(&job(SlurmJobState::Running, None), &reasons));
    }
}
