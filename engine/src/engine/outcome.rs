#[allow(clippy::wildcard_imports)]
use super::*;

impl Engine {
    pub(super) fn handle_outcome(&mut self, o: &lockstep_schemas::ActionOutcome, now_ms: u64) {
        let policy = &self.policy.actions;
        if let Some(slot) = self.orphans.get_mut(&o.target) {
            slot.handle_outcome(&o.action_id, &o.result, now_ms, policy);
            if slot.pending().is_none() {
                self.orphans.remove(&o.target);
            }
            return;
        }
        match &o.target {
            Target::SlurmNodeState { node } => {
                if let Some(c) = self.ctl.get_mut(node) {
                    if c.state_slot
                        .handle_outcome(&o.action_id, &o.result, now_ms, policy)
                    {
                        self.touch_slurm(node);
                    }
                }
            }
            Target::PodCondition {
                namespace,
                pod,
                condition,
            } => self.pod_slot_outcome(namespace, pod, condition, o, now_ms),
            Target::NodeTaint { node, key } => {
                let Some(entry) = self.model.kube_nodes.get_mut(node) else {
                    return;
                };
                let Some((_, slot)) = entry.taint_slots.iter_mut().find(|(k, _)| k == key) else {
                    return;
                };
                if slot.handle_outcome(&o.action_id, &o.result, now_ms, policy) {
                    self.dirty.push(Wake::Kube(node.clone()));
                }
            }
            Target::SlurmNodeFeatures { node } | Target::SlurmNodeTopology { node } => {
                if let Some(c) = self.ctl.get_mut(node) {
                    let slot = match &o.target {
                        Target::SlurmNodeFeatures { .. } => &mut c.features_slot,
                        _ => &mut c.topology_slot,
                    };
                    if slot.handle_outcome(&o.action_id, &o.result, now_ms, policy) {
                        self.touch_slurm(node);
                    }
                }
            }
            Target::PodLabel {
                namespace,
                pod,
                key,
            } => self.pod_slot_outcome(namespace, pod, &format!("label:{key}"), o, now_ms),
            Target::Pod { namespace, pod } => {
                let pk = pod_key(namespace, pod);
                let mut changed = false;
                for v in self.victims.values_mut().filter(|v| v.pod_key == pk) {
                    changed |=
                        v.delete_slot
                            .handle_outcome(&o.action_id, &o.result, now_ms, policy);
                }
                if changed {
                    self.schedule_scaling(now_ms);
                }
            }
            Target::Scale { target } => {
                if let Some(c) = self.scale.get_mut(target) {
                    if c.slot
                        .handle_outcome(&o.action_id, &o.result, now_ms, policy)
                    {
                        self.schedule_scaling(now_ms);
                    }
                }
            }
            Target::SlurmReservation { .. } => {
                let found = self.maintenance.iter_mut().find(|(_, m)| {
                    m.reservation_slot
                        .current
                        .as_ref()
                        .is_some_and(|c| c.id == o.action_id)
                });
                let Some((kube, m)) = found else { return };
                let action = m
                    .reservation_slot
                    .current
                    .as_ref()
                    .map(|c| c.action.clone());
                if m.reservation_slot
                    .handle_outcome(&o.action_id, &o.result, now_ms, policy)
                {
                    // Slurm's word is the only observation of a reservation.
                    if matches!(
                        o.result,
                        OutcomeResult::Succeeded | OutcomeResult::AlreadyDone
                    ) {
                        m.reserved = match action {
                            Some(a @ Action::SlurmReserve { .. }) => Some(a),
                            _ => None,
                        };
                    }
                    let kube = kube.clone();
                    self.dirty.push(Wake::Maint(kube));
                }
            }
            Target::NodeCondition { node, condition } => {
                let Some(m) = self.maintenance.get_mut(node) else {
                    return;
                };
                let Some((_, slot)) = m.condition_slots.iter_mut().find(|(k, _)| k == condition)
                else {
                    return;
                };
                if slot.handle_outcome(&o.action_id, &o.result, now_ms, policy) {
                    self.dirty.push(Wake::Maint(node.clone()));
                }
            }
        }
    }

    /// Records an outcome in one of a pod's slots (a condition type, or
    /// `label:<key>`), and has its Slurm node looked at again.
    pub(super) fn pod_slot_outcome(
        &mut self,
        namespace: &str,
        pod: &str,
        slot_key: &str,
        o: &lockstep_schemas::ActionOutcome,
        now_ms: u64,
    ) {
        let Some(entry) = self.model.pods.get_mut(&pod_key(namespace, pod)) else {
            return;
        };
        let Some((_, slot)) = entry
            .condition_slots
            .iter_mut()
            .find(|(k, _)| k == slot_key)
        else {
            return;
        };
        if slot.handle_outcome(&o.action_id, &o.result, now_ms, &self.policy.actions) {
            let pod = entry.obs.clone();
            if let Some(s) = slurm_name_of_pod(&pod, &self.policy) {
                self.touch_slurm(s);
            }
        }
    }
}
