use lockstep_schemas::{Action, ActionKind, OutcomeResult, Target};

use super::Engine;
use crate::ctx::Ctx;
use crate::flights::{Aspect, Owner, OwnerOf};
use crate::model::slurm_name_of_pod;
use crate::timers::Wake;

impl Engine {
    /// Whether the model's copy of Slurm node `name` is what the Slurm
    /// actuator's "already done" of lockstep's last drain or down of it
    /// found: that state with exactly that reason (a resume: never). Stricter
    /// than [`crate::drain::SlurmSide::see`], which also takes somebody
    /// else's drain, or lockstep's reason with slurmctld's words appended, as
    /// showing the drain: such a copy differs from what the actuator found.
    fn copy_shows_state_action(&self, name: &str) -> bool {
        let Some(seen) = self.model.slurm_nodes.get(name) else {
            return false;
        };
        match self.flights.state_action(name) {
            Some(Action::SlurmDrain { reason, .. }) => seen.obs.drained_with(reason),
            Some(Action::SlurmDown { reason, .. }) => seen.obs.down_with(reason),
            _ => false,
        }
    }

    /// Records an actuator's outcome in the slot of its target, and has the
    /// evaluation that wants the target look again when the slot changed:
    /// an action that waits for the outcome of the one before it (never two
    /// in flight on one target) goes out then, not at the timeout. A
    /// reservation's outcome is also Slurm's only word on it: lockstep's
    /// record of the reservation follows.
    pub(super) fn handle_outcome(&mut self, o: &lockstep_schemas::ActionOutcome, ctx: &Ctx<'_>) {
        let now_ms = ctx.now_ms;
        let reservation = match &o.target {
            Target::SlurmReservation { .. } => self.reservation_in_flight(o),
            _ => None,
        };
        let Some(owner) = self.flights.outcome(o, now_ms, &self.policy.actions) else {
            return;
        };
        match owner {
            OwnerOf::Named(Owner::SlurmNode, node, aspect) => {
                if aspect == Aspect::State {
                    let shown = self.copy_shows_state_action(&node);
                    if let Some(c) = self.ctl.get_mut(node.as_str()) {
                        if c.fresh_after.is_some() {
                            let found = o.result == OutcomeResult::AlreadyDone;
                            let resumed_only = c.fresh_resumes_only && shown;
                            if found && (!c.fresh_written || resumed_only) {
                                // Found in place, and nothing of lockstep's
                                // that could have made it written since the
                                // model's copy was taken: the copy shows the
                                // node as it is (the poller reports only
                                // changes, so no later one may ever come).
                                c.fresh_after = None;
                            } else {
                                // Only an observation after the change was
                                // made shows it.
                                c.fresh_after = Some(ctx.seq);
                                if !found {
                                    let resume = o.kind == ActionKind::SlurmResume;
                                    c.fresh_resumes_only =
                                        resume && (!c.fresh_written || c.fresh_resumes_only);
                                    c.fresh_written = true;
                                }
                            }
                        }
                        self.fresh.follow(&node, c.fresh_after.is_some());
                    }
                }
                self.touch_slurm(&node);
            }
            OwnerOf::Named(Owner::Pod, _, aspect) if aspect.is_scaling() => {
                self.schedule_scaling(ctx);
            }
            OwnerOf::Scale => self.schedule_scaling(ctx),
            OwnerOf::Named(Owner::Pod, key, _) => {
                let Some(entry) = self.model.pods.get(&key) else {
                    return;
                };
                if let Some(s) = slurm_name_of_pod(&entry.obs, &self.policy) {
                    let s = s.to_owned();
                    self.touch_slurm(&s);
                }
            }
            // Taints, `[node_signals]`' condition and annotation, and what
            // is retired: the node's own evaluation (`eval_kube`).
            OwnerOf::Named(Owner::KubeNode, node, aspect) if !aspect.is_maintenance() => {
                self.dirty.push(Wake::Kube(node));
            }
            OwnerOf::Named(Owner::KubeNode, node, aspect) => {
                if aspect == Aspect::Reservation
                    && matches!(
                        o.result,
                        OutcomeResult::Succeeded | OutcomeResult::AlreadyDone
                    )
                {
                    self.reservations.confirmed(node.clone(), reservation);
                }
                self.dirty.push(Wake::Maint(node));
            }
        }
    }

    /// The reservation action an outcome answers, while it is in flight.
    fn reservation_in_flight(&self, o: &lockstep_schemas::ActionOutcome) -> Option<Action> {
        self.flights
            .slots()
            .filter_map(|s| s.current.as_ref())
            .find(|c| c.id == o.action_id)
            .map(|c| c.action.clone())
    }
}
