//! Slinky's slurm-operator beside lockstep, when the setup runs it, as
//! `../shared/slinky/README.md` describes v1.2.1:
//!
//! - A cordon of a Kubernetes node: about 1-3 s later (its Node watch
//!   enqueues at once, its slurm-client refreshes the node list in 1 s
//!   batches) it drains the Slurm node of each worker pod on it, reason
//!   `slurm-operator: Node (X) was cordoned, Pod (ns/p) must be cordoned`,
//!   but never when the node already carries a reason that is not its own.
//! - An uncordon: it undrains, only drains whose reason has its prefix
//!   `slurm-operator: ` (or no reason). Its sync is level-triggered, as a
//!   Kubernetes controller's is: a worker pod turning Ready on a node that
//!   is not cordoned is synced the same way (so the drain left under its
//!   preStop reason once slurmctld returns the node from DOWN is lifted).
//! - A terminating worker pod's preStop hook runs `scontrol update
//!   nodename=$(hostname) state=down reason='slurm-operator: Pod is
//!   terminating'` (not for a pod deleted with grace period 0, and not on a
//!   host whose kubelet is gone: nothing runs the hook there).
//!
//! Every slurmd pod of the world is one of its worker pods (the Slurm node
//! name is the pod's hostname). It talks to slurmrestd, so while slurmrestd
//! does not answer its writes fail and it tries again (a requeue); the hook
//! talks to slurmctld through scontrol. Nothing else is modelled: the
//! README says nothing more of what it does to Slurm nodes.
//!
//! It never reads lockstep's state; lockstep's doings reach it only through
//! Kubernetes and Slurm.

use super::kube::Containers;
use super::schedule::{ADMIN_USER, NAMESPACE, SLINKY_PREFIX, SLURM_USER};
use super::{Actor, Ev, World};

/// Its reaction to a cordon or uncordon (virtual ms).
const SYNC_DELAY_MS: (u64, u64) = (1_000, 3_000);
/// Its requeue after a failed write.
const REQUEUE_MS: u64 = 5_000;
/// How long the preStop hook takes to reach slurmctld.
pub(crate) const PRE_STOP_MS: u64 = 200;
/// The preStop hook's reason.
pub(crate) const TERMINATING_REASON: &str = "slurm-operator: Pod is terminating";

impl World {
    /// A Kubernetes node was cordoned or uncordoned: Slinky's Node watch
    /// enqueues the worker pods on it.
    pub(crate) fn slinky_node_changed(&mut self, node: &str) {
        if !self.setup.slinky {
            return;
        }
        let lat = self.rng.between(SYNC_DELAY_MS);
        self.at(
            lat,
            Ev::SlinkySync {
                node: node.to_owned(),
            },
        );
    }

    /// Slinky syncs the worker pods on `node` with the node's cordon as it
    /// is now.
    pub(crate) fn slinky_sync(&mut self, node: &str) {
        let Some(n) = self.kube.nodes.get(node) else {
            return;
        };
        if self.slurm.restd_down {
            self.at(
                REQUEUE_MS,
                Ev::SlinkySync {
                    node: node.to_owned(),
                },
            );
            return;
        }
        let cordoned = n.unschedulable;
        for pod in self.pods_on(node) {
            let Some(sn) = self.slurm.nodes.get(&pod) else {
                continue;
            };
            let reason = sn.reason.as_ref().map(|r| r.0.as_str());
            let own_or_none = reason.is_none_or(|r| r.starts_with(SLINKY_PREFIX));
            if !own_or_none {
                continue;
            }
            if cordoned {
                let want = format!(
                    "{SLINKY_PREFIX}Node ({node}) was cordoned, Pod ({NAMESPACE}/{pod}) must be cordoned"
                );
                if sn.drain.is_some() && reason == Some(want.as_str()) {
                    continue;
                }
                self.drain_node(&pod, &want, SLURM_USER, &Actor::Slinky);
            } else if sn.drain.is_some() {
                self.undrain_node(&pod);
            }
        }
    }

    /// A worker pod's graceful deletion began: its preStop hook will run.
    pub(crate) fn slinky_pod_terminating(&mut self, uid: &str) {
        if self.setup.slinky {
            self.at(
                PRE_STOP_MS,
                Ev::PreStop {
                    uid: uid.to_owned(),
                },
            );
        }
    }

    /// The preStop hook sets the pod's Slurm node DOWN. Jobs it kills are
    /// killed by whoever deleted the pod.
    pub(crate) fn pre_stop(&mut self, uid: &str) {
        let Some(p) = self.kube.pods.values().find(|p| p.uid == uid) else {
            return;
        };
        if p.containers != Containers::Running {
            return;
        }
        let Some((at, by)) = p.deletion.clone() else {
            return;
        };
        let name = p.name.clone();
        // The hook's scontrol runs as root inside the slurmd container.
        self.down_node(
            &name,
            TERMINATING_REASON,
            ADMIN_USER,
            &Actor::Slinky,
            Some((
                &by,
                "its pod was deleted; the preStop hook set its node DOWN",
                at,
            )),
        );
    }
}
