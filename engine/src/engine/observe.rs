use lockstep_schemas::{
    ConditionStatus, Domain, Event, IdentityChange, KubeNode, KubePod, KubeScaleTarget, Policy,
    SlurmJob, SlurmNode, SlurmPartition,
};

use super::Engine;
use crate::cause::Cause;
use crate::ctx::Ctx;
use crate::drain::{Ownership, SlurmSide};
use crate::flights::{Aspect, Owner};
use crate::model::{domain_index, pod_key, slurm_name_of_pod, KubeEntry, Origin, PodEntry, Seen};
use crate::model::{Name, Regain};
use crate::retired;
use crate::scaling;
use crate::stale::{self, ObjectKey};
use crate::timers::{Wake, WakeOf};
use crate::units::{after_s, ms};

impl Engine {
    /// Marks a Slurm node and the Kubernetes node under it for evaluation.
    pub(super) fn touch_slurm(&mut self, name: &str) {
        self.dirty.push(Wake::Slurm(name.to_owned()));
        if let Some(k) = self.model.placement(name, &self.policy) {
            self.dirty.push(Wake::Kube(k.to_owned()));
            if self.policy.maintenance.enabled || self.policy.drain_conditions_on() {
                self.dirty.push(Wake::Maint(k.to_owned()));
            }
        }
    }

    /// A Slurm node started or stopped running jobs: the drain conditions
    /// of the Kubernetes node under it may change (maintenance rows 4-5).
    pub(super) fn touch_drain_progress(&mut self, name: &str) {
        if self.policy.drain_conditions_on() {
            if let Some(k) = self.model.placement(name, &self.policy) {
                self.dirty.push(Wake::Maint(k.to_owned()));
            }
        }
    }

    /// Marks a Kubernetes node and the Slurm nodes on it for evaluation.
    pub(super) fn touch_kube(&mut self, name: &str) {
        let mut names = std::mem::take(&mut self.scratch.names);
        names.clear();
        self.model.slurm_nodes_on(name, &self.policy, &mut names);
        self.dirty.extend(names.drain(..).map(Wake::Slurm));
        self.scratch.names = names;
        self.dirty.push(Wake::Kube(name.to_owned()));
        if self.policy.maintenance.enabled
            || self.policy.drain_conditions_on()
            || self.maintained(name)
        {
            self.dirty.push(Wake::Maint(name.to_owned()));
        }
    }

    pub(super) fn touch_all(&mut self) {
        let mut names: Vec<String> = self.model.slurm_nodes.keys().map(Name::to_string).collect();
        names.extend(self.ctl.keys().map(Name::to_string));
        self.dirty.extend(names.into_iter().map(Wake::Slurm));
        let kube: Vec<String> = self.model.kube_nodes.keys().map(Name::to_string).collect();
        if self.policy.maintenance.enabled || self.policy.drain_conditions_on() {
            self.dirty.extend(kube.iter().cloned().map(Wake::Maint));
        }
        self.dirty.extend(kube.into_iter().map(Wake::Kube));
        let mut maint: Vec<String> = self.reservations.nodes().cloned().collect();
        maint.extend(self.flights.owners(Owner::KubeNode, Aspect::is_maintenance));
        maint.extend(self.timers.maint_names().map(str::to_owned));
        self.dirty.extend(maint.into_iter().map(Wake::Maint));
    }

    /// The object an event observes or deletes, and the version the model
    /// holds of it (`None`: not held).
    pub(super) fn held(&self, event: &Event) -> Option<(ObjectKey, Option<u64>)> {
        let m = &self.model;
        // A node's observation names it as `Text`, its deletion as `String`.
        let slurm_node = |name: &str| {
            let held = m.slurm_nodes.get(name).map(|s| s.obs.version);
            (ObjectKey::SlurmNode(name.to_owned()), held)
        };
        let kube_node = |name: &str| {
            let held = m.kube_nodes.get(name).map(|k| k.obs.version);
            (ObjectKey::KubeNode(name.to_owned()), held)
        };
        Some(match event {
            Event::SlurmNode(SlurmNode { name, .. }) => slurm_node(name),
            Event::SlurmNodeGone { name, .. } => slurm_node(name),
            Event::SlurmJob(SlurmJob { job_id, .. }) | Event::SlurmJobGone { job_id, .. } => (
                ObjectKey::SlurmJob(*job_id),
                m.jobs.get(job_id).map(|s| s.obs.version),
            ),
            Event::SlurmPartition(SlurmPartition { name, .. })
            | Event::SlurmPartitionGone { name, .. } => (
                ObjectKey::SlurmPartition(name.clone()),
                m.partitions.get(name).map(|s| s.obs.version),
            ),
            Event::KubeNode(KubeNode { name, .. }) => kube_node(name),
            Event::KubeNodeGone { name, .. } => kube_node(name),
            Event::KubePod(KubePod {
                namespace, name, ..
            })
            | Event::KubePodGone {
                namespace, name, ..
            } => {
                let key = pod_key(namespace, name);
                let held = m.pods.get(&key).map(|p| p.obs.version);
                (ObjectKey::Pod(key), held)
            }
            Event::KubeScaleTarget(KubeScaleTarget { target, .. })
            | Event::KubeScaleTargetGone { target, .. } => (
                ObjectKey::ScaleTarget(target.clone()),
                m.scale_targets.get(target).map(|t| t.obs.version),
            ),
            _ => return None,
        })
    }

    /// Whether an observation or deletion is older than what the model holds
    /// (or than the deletion of the object it observes): then it changes
    /// nothing. An observation that is applied to an object not held lifts
    /// its tombstone; a deletion that is applied leaves one.
    pub(super) fn stale(&mut self, event: &Event, ctx: &Ctx<'_>) -> bool {
        let now_ms = ctx.now_ms;
        let version = event.version();
        // The common case first, without building the object's key: an
        // observation of an object held. Only row 2 can apply to it; there
        // is no tombstone to read or lift.
        let observed_held = match event {
            Event::SlurmNode(SlurmNode { name, .. }) => Some(
                self.model
                    .slurm_nodes
                    .get(name.as_str())
                    .map(|s| s.obs.version),
            ),
            Event::SlurmJob(SlurmJob { job_id, .. }) => {
                Some(self.model.jobs.get(job_id).map(|s| s.obs.version))
            }
            Event::KubeNode(KubeNode { name, .. }) => Some(
                self.model
                    .kube_nodes
                    .get(name.as_str())
                    .map(|k| k.obs.version),
            ),
            _ => None,
        };
        if let Some(Some(held)) = observed_held {
            return stale::older_than_held(version, Some(held));
        }
        let Some((key, held)) = self.held(event) else {
            return false;
        };
        if stale::older_than_held(version, held) {
            return true;
        }
        let gone_from = match event {
            Event::SlurmNodeGone { .. } => Some(Domain::SlurmNodes),
            Event::SlurmJobGone { .. } => Some(Domain::SlurmJobs),
            Event::SlurmPartitionGone { .. } => Some(Domain::SlurmPartitions),
            Event::KubeNodeGone { .. } => Some(Domain::KubeNodes),
            Event::KubePodGone { .. } => Some(Domain::KubePods),
            Event::KubeScaleTargetGone { .. } => Some(Domain::KubeScaleTargets),
            _ => None,
        };
        let gone = gone_from.is_some();
        if let Some(domain) = gone_from {
            let listing = self.model.sync[domain_index(domain)].listing;
            if stale::inferred_outside_listing(version, listing, held) {
                return true;
            }
        }
        if held.is_none() && stale::buried(version, self.tombstones.version(&key, now_ms)) {
            // Deleted since: an observation, or an older deletion, of it.
            return true;
        }
        if gone {
            self.tombstones
                .bury(key, version.max(held.unwrap_or(0)), now_ms);
        } else if held.is_none() {
            self.tombstones.lift(&key);
        }
        false
    }

    pub(super) fn handle_event(&mut self, event: &Event, ctx: &Ctx<'_>) {
        if self.stale(event, ctx) {
            return;
        }
        match event {
            Event::SlurmNode(node) => self.observe_slurm_node(node, ctx),
            Event::SlurmNodeGone { name, .. } => self.remove_slurm_node(name, ctx),
            Event::SlurmJob(job) => {
                let gen = self.gen(Domain::SlurmJobs);
                let mut flipped = std::mem::take(&mut self.scratch.flipped);
                flipped.clear();
                self.model.upsert_job(job, gen, &mut flipped);
                self.jobs_flipped(&mut flipped, ctx);
                self.scratch.flipped = flipped;
                self.schedule_scaling(ctx);
            }
            Event::SlurmJobGone { job_id, .. } => self.remove_job(*job_id, ctx),
            Event::SlurmPartition(p) => {
                // No rule reads partitions yet; kept for the audit trail.
                let gen = self.gen(Domain::SlurmPartitions);
                self.model.partitions.insert(
                    p.name.clone(),
                    Seen {
                        obs: p.clone(),
                        gen,
                    },
                );
            }
            Event::SlurmPartitionGone { name, .. } => {
                self.model.partitions.remove(name);
            }
            Event::KubeNode(node) => self.observe_kube_node(node, ctx),
            Event::KubeNodeGone { name, .. } => self.remove_kube_node(name, ctx),
            Event::KubePod(pod) => self.observe_pod(pod, ctx),
            Event::KubePodGone {
                namespace, name, ..
            } => {
                self.remove_pod(&pod_key(namespace, name), ctx);
                self.scaling_needs_scan(ctx);
            }
            Event::KubeScaleTarget(t) => {
                let gen = self.gen(Domain::KubeScaleTargets);
                let same = self
                    .model
                    .scale_targets
                    .get(&t.target)
                    .is_some_and(|held| held.obs.same_but_key_and_version(t));
                self.model.scale_targets.insert(
                    t.target.clone(),
                    Seen {
                        obs: t.clone(),
                        gen,
                    },
                );
                if !same {
                    self.scaling_needs_scan(ctx);
                }
            }
            Event::KubeScaleTargetGone { target, .. } => {
                self.model.scale_targets.remove(target);
                self.scaling_needs_scan(ctx);
            }
            Event::SyncStarted { domain } => {
                let s = &mut self.model.sync[domain_index(*domain)];
                s.gen += 1;
                s.listing = true;
                if let Some(r) = &mut self.model.slurm_regain {
                    r.started(*domain);
                }
            }
            Event::SyncDone { domain } => {
                let listed = self.model.sync[domain_index(*domain)].listing;
                self.finish_sync(*domain, ctx);
                let regained = listed
                    && self
                        .model
                        .slurm_regain
                        .as_mut()
                        .is_some_and(|r| r.done(*domain));
                if regained {
                    self.model.slurm_regain = None;
                    self.set_visible(lockstep_schemas::Connector::Slurm, true, ctx);
                }
            }
            Event::ConnectorStatus {
                connector: lockstep_schemas::Connector::Slurm,
                visible: true,
                ..
            } if !self.model.slurm_visible => {
                // Seen again: trusted once complete listings are in.
                self.model.slurm_regain.get_or_insert_with(Regain::default);
            }
            Event::ConnectorStatus {
                connector, visible, ..
            } => {
                if *connector == lockstep_schemas::Connector::Slurm && !*visible {
                    self.model.slurm_regain = None;
                }
                self.set_visible(*connector, *visible, ctx);
            }
            Event::Tick => {}
            Event::ActionOutcome(o) => self.handle_outcome(o, ctx),
            Event::PolicyChanged(policy) => self.policy_changed(policy, ctx),
        }
    }

    /// Whether lockstep sees a connector's side; every rule looks again
    /// when that changes.
    fn set_visible(
        &mut self,
        connector: lockstep_schemas::Connector,
        visible: bool,
        ctx: &Ctx<'_>,
    ) {
        let flag = match connector {
            lockstep_schemas::Connector::Slurm => &mut self.model.slurm_visible,
            lockstep_schemas::Connector::Kubernetes => &mut self.model.kube_visible,
        };
        if *flag != visible {
            *flag = visible;
            self.touch_all();
            self.scaling_needs_scan(ctx);
        }
    }

    /// A Slurm node observed: the model takes it; the relevance filter
    /// ([`slurm_relevant_change`]) says which rules look again.
    fn observe_slurm_node(&mut self, node: &SlurmNode, ctx: &Ctx<'_>) {
        let gen = self.gen(Domain::SlurmNodes);
        // Reported by a poll after lockstep's last change of it (a newer
        // version: a copy of the one held, delivered again, is not): the
        // model's copy is current again (`NodeCtl::fresh_after`).
        debug_assert!(
            self.fresh.may_hold(&node.name)
                || self
                    .ctl
                    .get(node.name.as_str())
                    .is_none_or(|c| c.fresh_after.is_none()),
            "{} awaits a fresh observation outside the index",
            node.name
        );
        let waits = self.fresh.may_hold(&node.name)
            && self
                .ctl
                .get(node.name.as_str())
                .and_then(|c| c.fresh_after)
                .is_some_and(|after| after < ctx.seq);
        if waits {
            let newer = node.version == 0
                || self
                    .model
                    .slurm_nodes
                    .get(node.name.as_str())
                    .is_none_or(|held| node.version > held.obs.version);
            if newer {
                if let Some(c) = self.ctl.get_mut(node.name.as_str()) {
                    c.fresh_after = None;
                    c.fresh_written = false;
                    c.fresh_resumes_only = false;
                }
                self.fresh.follow(&node.name, false);
                self.touch_slurm(&node.name);
            }
        }
        match self.model.slurm_nodes.get_mut(node.name.as_str()) {
            // Only the version moved (a relist): nothing to decide.
            Some(seen) if seen.obs.same_but_key_and_version(node) => {
                seen.obs.version = node.version;
                seen.gen = gen;
            }
            Some(seen) => {
                // Jobs flip nodes between IDLE, MIXED and ALLOCATED
                // all the time; no rule reads that, so such a change
                // only updates the model.
                let relevant = crate::model::slurm_relevant_change(&seen.obs, node);
                let own = Ownership {
                    prefix: &self.policy.drain.reason_prefix,
                    earlier_prefixes: &self.retired.prefixes,
                    slurm_user: self.policy.drain.slurm_user.as_deref(),
                };
                let side_changed = SlurmSide::of(&seen.obs, &own) != SlurmSide::of(node, &own);
                let busy_changed = scaling::slurm_busy(&seen.obs) != scaling::slurm_busy(node);
                seen.obs.assign_from(node);
                seen.gen = gen;
                // A reason changed under a drain by somebody else: the
                // Kubernetes node's foreign drain condition names it.
                let foreign_news = relevant
                    && !self.policy.node_signals.foreign_drain_condition.is_empty()
                    && SlurmSide::of(node, &own).held_by_other();
                if side_changed || foreign_news {
                    self.touch_slurm(&node.name);
                } else if relevant || (busy_changed && self.follows_busy()) {
                    self.dirty.push(Wake::Slurm(node.name.to_string()));
                }
                if busy_changed {
                    self.update_busy(&node.name, ctx);
                    self.touch_drain_progress(&node.name);
                }
                // Drains and known nodes matter to scaling only for
                // victims and scale-in, which always scan.
                if relevant || busy_changed {
                    self.schedule_scaling(ctx);
                }
            }
            None => {
                self.model.slurm_nodes.insert(
                    node.name.as_str().into(),
                    Seen {
                        obs: node.clone(),
                        gen,
                    },
                );
                if self.model.jobs_on(&node.name) == 0 {
                    self.scaling
                        .follow_idle(&node.name, &self.model, ctx.now_ms);
                }
                self.update_busy(&node.name, ctx);
                self.touch_slurm(&node.name);
                self.schedule_scaling(ctx);
            }
        }
    }

    /// A Kubernetes node observed: its NotReady spell, the labels the policy
    /// started to read; the Slurm nodes on it look again.
    fn observe_kube_node(&mut self, node: &KubeNode, ctx: &Ctx<'_>) {
        let gen = self.gen(Domain::KubeNodes);
        let now = ctx.now_ms;
        let new = !self.model.kube_nodes.contains_key(node.name.as_str());
        if new {
            let taints = |a: &Aspect| matches!(a, Aspect::Taint(_));
            self.flights.adopt(Owner::KubeNode, &node.name, taints);
            self.model.kube_nodes.insert(
                node.name.as_str().into(),
                KubeEntry {
                    obs: node.clone(),
                    gen,
                    not_ready_since: None,
                    unseen_labels: Vec::new(),
                },
            );
        }
        let entry = self
            .model
            .kube_nodes
            .get_mut(node.name.as_str())
            .expect("inserted above");
        entry.gen = gen;
        // The same version is the same object: a copy that looked
        // for fewer labels was taken under an earlier policy (a late
        // re-delivery of it) and says less than the one held. Its device
        // faults come from other objects and carry their own version: a
        // newer one is news about the same Node. A copy that looked for
        // other labels than the held one (a policy edit dropped a key and
        // added one) says more of some and less of others: both are true.
        let same = !new
            && node.version != 0
            && node.version == entry.obs.version
            && node.devices.version <= entry.obs.devices.version;
        let merged = same
            .then(|| stale::merged_reads(node, &entry.obs))
            .flatten();
        if same
            && merged.is_none()
            && !stale::reads_at_least(&node.read_labels, &entry.obs.read_labels)
        {
            return;
        }
        let node = merged.as_ref().unwrap_or(node);
        let ready = node.ready == ConditionStatus::True;
        let spell_changed = ready == entry.not_ready_since.is_some();
        // The labels the policy started to read are usable once an
        // observation looked for them; one taken under the earlier
        // policy (a stale re-delivery) did not, and changes nothing.
        let before = entry.unseen_labels.len();
        match &node.read_labels {
            Some(read) => entry.unseen_labels.retain(|l| !read.contains(l)),
            None => entry.unseen_labels.clear(),
        }
        let labels_seen = entry.unseen_labels.len() != before;
        // A node seen for the first time is news even though its
        // entry was just made from it: the Slurm nodes on it must
        // be looked at with its labels and cordon.
        if !new && entry.obs.same_but_key_and_version(node) && !spell_changed && !labels_seen {
            entry.obs.version = node.version;
            return;
        }
        let reboot = self.policy.health.return_after_reboot;
        let change = (!new)
            .then(|| entry.obs.identity.changed(&node.identity, reboot))
            .flatten();
        entry.obs.clone_from(node);
        if let Some(change) = change {
            self.returning(&node.name, change, now);
        }
        // Its host is back once a node of that name is Ready.
        if ready {
            self.model.kube_gone.remove(node.name.as_str());
        }
        let entry = self
            .model
            .kube_nodes
            .get_mut(node.name.as_str())
            .expect("inserted above");
        if ready {
            entry.not_ready_since = None;
        } else if entry.not_ready_since.is_none() {
            entry.not_ready_since = Some(Origin {
                ms: now,
                seq: ctx.seq,
                event: ctx.event.clone(),
            });
        }
        self.touch_kube(&node.name);
    }

    /// A pod observed: re-indexed to its Slurm node; slots of a pod seen
    /// again are adopted.
    fn observe_pod(&mut self, pod: &KubePod, ctx: &Ctx<'_>) {
        let gen = self.gen(Domain::KubePods);
        let key = pod_key(&pod.namespace, &pod.name);
        let old = match self.model.pods.get_mut(&key) {
            Some(e) if e.obs.same_but_key_and_version(pod) => {
                e.obs.version = pod.version;
                e.gen = gen;
                return;
            }
            Some(e) => {
                e.gen = gen;
                Some(e.obs.clone())
            }
            None => None,
        };
        if let Some(old) = &old {
            self.unindex_pod(&key, old);
            // Another pod of the same name (a StatefulSet's replacement):
            // the one held went without lockstep seeing it go (pod garbage
            // collection after its node was deleted, a delete while the
            // watch was down), and its slurmd with it.
            if old.uid != pod.uid {
                self.note_pod_lost(old, ctx);
            }
        }
        if old.is_none() {
            self.flights.adopt(Owner::Pod, &key, Aspect::shown_on_pod);
            self.model.pods.insert(
                key.clone(),
                PodEntry {
                    obs: pod.clone(),
                    gen,
                },
            );
        } else if let Some(entry) = self.model.pods.get_mut(&key) {
            entry.obs.clone_from(pod);
        }
        let pod = pod.clone();
        self.index_pod(&key, &pod);
        self.scaling_needs_scan(ctx);
    }

    /// A new policy: names it retires, labels it starts to read, indexes;
    /// every node looks again.
    fn policy_changed(&mut self, policy: &Policy, ctx: &Ctx<'_>) {
        if self.pinned || *policy == self.policy {
            return;
        }
        let old = std::mem::replace(&mut self.policy, policy.clone());
        self.retired.policy_changed(&old, &self.policy);
        let added = retired::newly_read_labels(&old, &self.policy);
        if !added.is_empty() {
            for entry in self.model.kube_nodes.values_mut() {
                for l in &added {
                    if !entry.unseen_labels.contains(l) {
                        entry.unseen_labels.push(l.clone());
                    }
                }
            }
        }
        self.model.rebuild_indexes(&self.policy);
        self.scaling.rebuild_busy(&self.model, &self.policy);
        self.touch_all();
        self.scaling_needs_scan(ctx);
    }

    pub(super) fn gen(&self, d: Domain) -> u32 {
        self.model.sync[domain_index(d)].gen
    }

    pub(super) fn index_pod(&mut self, key: &str, pod: &lockstep_schemas::KubePod) {
        self.model.index_pod(key, pod, &self.policy, true);
        if let Some(s) = slurm_name_of_pod(pod, &self.policy) {
            self.touch_slurm(s);
        }
    }

    /// Removes a pod's claim; touches its Slurm node and the node it was on.
    pub(super) fn unindex_pod(&mut self, key: &str, pod: &lockstep_schemas::KubePod) {
        if let Some(s) = slurm_name_of_pod(pod, &self.policy) {
            let s = s.to_owned();
            self.touch_slurm(&s);
            self.model.index_pod(key, pod, &self.policy, false);
            self.touch_slurm(&s);
        }
    }

    /// Forgets a pod that is gone, however it went (a delete observed from
    /// its start, a force delete, a relist that no longer lists it).
    pub(super) fn remove_pod(&mut self, key: &str, ctx: &Ctx<'_>) {
        if let Some(entry) = self.model.pods.get(key) {
            let pod = entry.obs.clone();
            self.unindex_pod(key, &pod);
            self.model.pods.remove(key);
            let timeout_ms = ms(self.policy.actions.timeout_s);
            let shown = Aspect::shown_on_pod;
            self.flights
                .park(Owner::Pod, key, shown, ctx.now_ms, timeout_ms);
            self.note_pod_lost(&pod, ctx);
            if let Some(kube) = &pod.node_name {
                self.forget_gone_kube_node(kube);
            }
            self.scaling_needs_scan(ctx);
        }
    }

    /// A pod gone without a `deleting` phase seen first (a force delete, a
    /// delete while the watch was down) is as much a loss as any other: its
    /// Slurm node's slurmd is gone with it. Drain row 4 (`drain.pod_missing`)
    /// holds while a pod loss is among the causes before; this makes it one,
    /// dated by the event that showed the pod gone.
    pub(super) fn note_pod_lost(&mut self, pod: &lockstep_schemas::KubePod, ctx: &Ctx<'_>) {
        let policy = &self.policy;
        if policy.mapping.mode != lockstep_schemas::MappingMode::Pod
            || !policy.drain.on_pod_disruption
        {
            return;
        }
        let Some(slurm) = slurm_name_of_pod(pod, policy) else {
            return;
        };
        let Some(ctl) = self.ctl.get_mut(slurm) else {
            return;
        };
        if !ctl.causes.iter().any(|(c, _)| c.is_pod_loss()) {
            ctl.causes.push((
                Cause::Drain(crate::cause::DrainCause::PodMissing),
                Origin {
                    ms: ctx.now_ms,
                    seq: ctx.seq,
                    event: ctx.event.clone(),
                },
            ));
        }
    }

    pub(super) fn remove_slurm_node(&mut self, name: &str, ctx: &Ctx<'_>) {
        if self.model.slurm_nodes.remove(name).is_some() {
            self.update_busy(name, ctx);
            self.touch_slurm(name);
            if let Some(kube) = self.model.placement(name, &self.policy) {
                let kube = kube.to_owned();
                self.forget_gone_kube_node(&kube);
            }
            self.schedule_scaling(ctx);
        }
    }

    /// Forgets a Kubernetes node that was deleted (or is missing from a
    /// relist) and remembers that its host is gone (health row 6).
    pub(super) fn remove_kube_node(&mut self, name: &str, ctx: &Ctx<'_>) {
        if self.model.kube_nodes.contains_key(name) {
            self.returning(name, IdentityChange::Deleted, ctx.now_ms);
        }
        if self.model.kube_nodes.remove(name).is_some() {
            self.timers.set(WakeOf::Kube(name), None);
            let timeout_ms = ms(self.policy.actions.timeout_s);
            let taints = |a: &Aspect| matches!(a, Aspect::Taint(_));
            self.flights
                .park(Owner::KubeNode, name, taints, ctx.now_ms, timeout_ms);
            let gone = &mut self.model.kube_gone;
            gone.entry(name.to_owned()).or_insert_with(|| Origin {
                ms: ctx.now_ms,
                seq: ctx.seq,
                event: ctx.event.clone(),
            });
            if gone.len() > crate::model::KUBE_NODES_GONE_MAX {
                let oldest = gone
                    .iter()
                    .min_by_key(|(n, o)| (o.seq, (*n).clone()))
                    .map(|(n, _)| n.clone());
                if let Some(n) = oldest {
                    gone.remove(&n);
                }
            }
            self.touch_kube(name);
        }
    }

    /// The Kubernetes node `kube` came back as a different machine (or its
    /// Node is gone): a resume of lockstep's drains of the Slurm nodes on it
    /// waits for the return condition (health table, `health.return_gate`).
    fn returning(&mut self, kube: &str, change: IdentityChange, now_ms: u64) {
        if self.policy.health.return_condition.is_empty() {
            return;
        }
        let mut names = std::mem::take(&mut self.scratch.names);
        names.clear();
        self.model.slurm_nodes_on(kube, &self.policy, &mut names);
        for n in &names {
            // A Slurm node never evaluated has no drain of lockstep's.
            let Some(ctl) = self.ctl.get_mut(n.as_str()) else {
                continue;
            };
            let mut gate = crate::health::Gate {
                cluster: &mut self.damping,
                node: &mut ctl.health,
                policy: &self.policy.health,
                now_ms,
            };
            gate.returning(change);
        }
        self.scratch.names = names;
    }

    /// A deleted Kubernetes node is forgotten once no Slurm node is on it:
    /// nothing can be kept out for it any more.
    pub(super) fn forget_gone_kube_node(&mut self, kube: &str) {
        if !self.model.kube_gone.contains_key(kube) {
            return;
        }
        let mut names = std::mem::take(&mut self.scratch.names);
        names.clear();
        self.model.slurm_nodes_on(kube, &self.policy, &mut names);
        let host_mode = self.policy.mapping.mode == lockstep_schemas::MappingMode::Host;
        let empty = if host_mode {
            !self.model.slurm_nodes.contains_key(kube)
        } else {
            names.is_empty()
        };
        self.scratch.names = names;
        if empty {
            self.model.kube_gone.remove(kube);
        }
    }

    pub(super) fn remove_job(&mut self, job_id: u64, ctx: &Ctx<'_>) {
        let mut flipped = std::mem::take(&mut self.scratch.flipped);
        flipped.clear();
        self.model.remove_job(job_id, &mut flipped);
        self.jobs_flipped(&mut flipped, ctx);
        self.scratch.flipped = flipped;
        self.schedule_scaling(ctx);
    }

    /// Nodes whose jobs went from none to some or back: their idle clock,
    /// and their busy label.
    pub(super) fn jobs_flipped(&mut self, flipped: &mut Vec<Name>, ctx: &Ctx<'_>) {
        let now_ms = ctx.now_ms;
        // The busy label follows a node's jobs, and so does the report on an
        // eviction lockstep answers (it completes once no job runs).
        let label = self.follows_busy();
        for node in flipped.drain(..) {
            self.scaling.follow_idle(&node, &self.model, now_ms);
            self.update_busy(&node, ctx);
            self.touch_drain_progress(&node);
            if label {
                self.dirty.push(Wake::Slurm(node.into()));
            }
        }
    }

    /// Whether a Slurm node's evaluation reads whether it is busy: the busy
    /// label, and the report on an eviction (`evict`).
    fn follows_busy(&self) -> bool {
        !self.policy.scaling.busy_label.is_empty()
            || !self.policy.drain.eviction_responder.is_empty()
    }

    /// Scaling's busy count of `node` follows the model. A scale-in victim
    /// that took a job (its drain lifted by somebody) has scaling look
    /// again now: its controller may remove the pod at any moment.
    pub(super) fn update_busy(&mut self, node: &str, ctx: &Ctx<'_>) {
        if self.scaling.follow_busy(node, &self.model, &self.policy) {
            self.timers.set(WakeOf::Scale, Some(ctx.now_ms));
        }
    }

    /// Something scaling reads beyond job counts changed: the next
    /// evaluation scans the targets' pods.
    pub(super) fn scaling_needs_scan(&mut self, ctx: &Ctx<'_>) {
        self.scaling.scan_needed = true;
        self.schedule_scaling(ctx);
    }

    /// Scaling looks again within `evaluate_every_s`; changes in between are
    /// taken together.
    pub(super) fn schedule_scaling(&mut self, ctx: &Ctx<'_>) {
        let now_ms = ctx.now_ms;
        if self.policy.scaling.targets.is_empty() {
            return;
        }
        let at = after_s(now_ms, self.policy.scaling.evaluate_every_s);
        if self.timers.get(WakeOf::Scale).is_some_and(|t| t <= at) {
            return;
        }
        self.timers.set(WakeOf::Scale, Some(at));
    }

    /// Everything of the domain not listed since `SyncStarted` is gone.
    pub(super) fn finish_sync(&mut self, domain: Domain, ctx: &Ctx<'_>) {
        if domain == Domain::SlurmNodes {
            // Level-triggered after every relist (after a restart, a restore,
            // a lost watch): each drain lockstep owns is looked at again, so
            // one whose cause no longer holds is resumed even when nothing
            // else about its node changed.
            let own = self.ownership();
            let owned: Vec<String> = self
                .model
                .slurm_nodes
                .iter()
                .filter(|(_, s)| SlurmSide::of(&s.obs, &own).owned_out())
                .map(|(n, _)| n.to_string())
                .collect();
            self.dirty.extend(owned.into_iter().map(Wake::Slurm));
        }
        let state = self.model.sync[domain_index(domain)];
        if !state.listing {
            // A log cut in the middle of a listing: we did not see its start,
            // so we cannot tell what was listed. Keep everything.
            return;
        }
        self.model.sync[domain_index(domain)].listing = false;
        let gen = state.gen;
        fn stale<'m, K: Clone + Ord + 'm, V: 'm>(
            m: impl IntoIterator<Item = (&'m K, &'m V)>,
            gen: u32,
            g: impl Fn(&V) -> u32,
        ) -> Vec<K> {
            let mut v: Vec<K> = m
                .into_iter()
                .filter(|(_, e)| g(e) < gen)
                .map(|(k, _)| k.clone())
                .collect();
            v.sort();
            v
        }
        match domain {
            // Gone by absence: the version last held dates the deletion.
            Domain::SlurmNodes => {
                for n in stale(&self.model.slurm_nodes, gen, |e| e.gen) {
                    let v = self.model.slurm_nodes[n.as_str()].obs.version;
                    self.tombstones
                        .bury(ObjectKey::SlurmNode(n.to_string()), v, ctx.now_ms);
                    self.remove_slurm_node(&n, ctx);
                }
            }
            Domain::SlurmJobs => {
                for j in stale(&self.model.jobs, gen, |e| e.gen) {
                    let v = self.model.jobs[&j].obs.version;
                    self.tombstones.bury(ObjectKey::SlurmJob(j), v, ctx.now_ms);
                    self.remove_job(j, ctx);
                }
            }
            Domain::SlurmPartitions => {
                for p in stale(&self.model.partitions, gen, |e| e.gen) {
                    let v = self.model.partitions[&p].obs.version;
                    self.tombstones
                        .bury(ObjectKey::SlurmPartition(p.clone()), v, ctx.now_ms);
                    self.model.partitions.remove(&p);
                }
            }
            Domain::KubeNodes => {
                for n in stale(&self.model.kube_nodes, gen, |e| e.gen) {
                    let v = self.model.kube_nodes[n.as_str()].obs.version;
                    self.tombstones
                        .bury(ObjectKey::KubeNode(n.to_string()), v, ctx.now_ms);
                    self.remove_kube_node(&n, ctx);
                }
            }
            Domain::KubePods => {
                for k in stale(&self.model.pods, gen, |e| e.gen) {
                    let v = self.model.pods[&k].obs.version;
                    self.tombstones
                        .bury(ObjectKey::Pod(k.clone()), v, ctx.now_ms);
                    self.remove_pod(&k, ctx);
                }
            }
            Domain::KubeScaleTargets => {
                for t in stale(&self.model.scale_targets, gen, |e| e.gen) {
                    let v = self.model.scale_targets[&t].obs.version;
                    self.tombstones
                        .bury(ObjectKey::ScaleTarget(t.clone()), v, ctx.now_ms);
                    self.model.scale_targets.remove(&t);
                    self.scaling_needs_scan(ctx);
                }
            }
        }
    }
}
