//! slurmctld as the world sees it: nodes, their slurmds, jobs and the
//! scheduler.
//!
//! What it follows (slurm.conf(5), scontrol(1), sinfo(1)):
//!
//! - Nodes are dynamic (`slurmd -Z`, as in Slinky): a node appears when its
//!   slurmd first registers and stays known after its slurmd is gone. Base
//!   states IDLE / ALLOCATED / DOWN; flags DRAIN, COMPLETING, NOT_RESPONDING.
//!   A drained node with jobs is DRAINING (ALLOCATED+DRAIN) until they end,
//!   then DRAINED (IDLE+DRAIN).
//! - `scontrol update state=drain reason=R` sets DRAIN with the reason and
//!   the user who ran it (reason_uid, `reason_set_by_user`), replacing any
//!   earlier reason; `state=resume` clears DRAIN and DOWN and the reason; a
//!   resumed node whose slurmd still does not answer goes DOWN again after
//!   SlurmdTimeout.
//! - slurmctld pings every node (every SlurmdTimeout / 3): one that does not
//!   answer is NOT_RESPONDING; one that has not answered for SlurmdTimeout is
//!   set DOWN with reason "Not responding" by the SlurmUser, unless it
//!   already has a reason, and its jobs are killed (NODE_FAIL). A node that
//!   answers again is no longer NOT_RESPONDING.
//! - ReturnToService: on registration with a valid configuration a DOWN node
//!   returns to service if it was set DOWN for not responding (1) or for any
//!   reason (2). DRAIN is kept either way.
//! - A slurmd that registers anew (a new process: the pod was replaced or
//!   its containers restarted) does not have the jobs slurmctld thinks run
//!   on the node: they are killed (NODE_FAIL).
//! - Jobs: PENDING (reason `Resources` for the first that does not fit,
//!   `Priority` behind it) -> RUNNING on whole nodes, lowest node first ->
//!   COMPLETING (the nodes COMPLETING during the epilog) -> COMPLETED; a
//!   finished job stays in the job table for MinJobAge.
//!
//! It never decides anything for lockstep; lockstep changes it only through
//! its actuator (`actuate`).

use std::collections::{BTreeMap, BTreeSet};

use lockstep_schemas::{SlurmBaseState, SlurmJobState};

use super::observe::Lane;
use super::schedule::{self, PodRef, ADMIN_REASONS, ADMIN_USER, SLURM_USER};
use super::{Actor, Ev, JobKill, Ms, World};

/// Why a node is DOWN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DownWhy {
    /// slurmctld: no answer for SlurmdTimeout.
    NotResponding,
    /// `scontrol update state=down`.
    Explicit,
}

/// The slurmd serving a node.
#[derive(Debug, Clone)]
pub(crate) struct Slurmd {
    pub instance: u64,
    pub alive: bool,
    /// A network blip: alive but not answering; who caused it, since when.
    pub blip: Option<(Actor, Ms)>,
    /// Who killed it, how, and when.
    pub died_by: Option<(Actor, String, Ms)>,
}

/// A Slurm node.
#[derive(Debug, Clone)]
pub(crate) struct SNode {
    pub name: String,
    pub partition: String,
    pub base: SlurmBaseState,
    /// DRAIN: who set it, when.
    pub drain: Option<(Actor, Ms)>,
    /// lockstep drained over someone else's drain: whose, set when, and
    /// whether lockstep's actuator could have seen it (it was there when
    /// the actuator read the node).
    pub covers_foreign: Option<(Actor, Ms, bool)>,
    /// DOWN: who, why, when.
    pub down: Option<(Actor, DownWhy, Ms)>,
    /// Reason and the user who set it.
    pub reason: Option<(String, String)>,
    pub not_responding: bool,
    pub completing: u32,
    pub features: Vec<String>,
    /// Features as slurmd registered them (not lockstep's).
    pub base_features: Vec<String>,
    pub topology: Option<String>,
    pub jobs: BTreeSet<u64>,
    pub slurmd: Option<Slurmd>,
    pub last_response_ms: Ms,
    /// Unhealthy (DOWN or NOT_RESPONDING) now or until when, if ever.
    pub unhealthy_until_ms: Option<Ms>,
}

impl SNode {
    /// Whether the scheduler may start a job on it now.
    pub fn schedulable(&self) -> bool {
        self.base == SlurmBaseState::Idle
            && self.drain.is_none()
            && !self.not_responding
            && self.completing == 0
            && self.jobs.is_empty()
    }

    /// DOWN or NOT_RESPONDING.
    pub fn unhealthy(&self) -> bool {
        self.base == SlurmBaseState::Down || self.not_responding
    }

    /// Whether it was unhealthy at some time at or after `since`
    /// (`unhealthy_until_ms` is `Ms::MAX` while it is).
    pub fn unhealthy_since(&self, since: Ms) -> bool {
        self.unhealthy() || self.unhealthy_until_ms.is_some_and(|t| t >= since)
    }

    /// In service: responding, not DOWN, not drained.
    pub fn usable(&self) -> bool {
        self.base != SlurmBaseState::Down && self.drain.is_none() && !self.not_responding
    }
}

/// A job.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub id: u64,
    pub partition: String,
    pub node_count: u32,
    pub run_ms: u64,
    pub state: SlurmJobState,
    pub nodes: Vec<String>,
    pub pending_reason: Option<String>,
    pub started_ms: Option<Ms>,
}

/// slurmctld's state.
#[derive(Debug, Default)]
pub(crate) struct Slurm {
    pub nodes: BTreeMap<String, SNode>,
    pub jobs: BTreeMap<u64, Job>,
    next_job: u64,
    /// Something changed since the last poll, per lane of lockstep's
    /// observer ([`super::observe::Lane`]).
    pub dirty: [bool; 2],
    pub poll_due: [bool; 2],
    sched_due: bool,
    /// Administrator resumes, per node: when.
    pub admin_resumes: Vec<(String, Ms)>,
    /// slurmrestd does not answer (lockstep's poller and actuator fail).
    pub restd_down: bool,
}

/// Node names in the order slurmctld's node table has them: `cpu-2` before `cpu-10`.
pub(crate) fn node_order(name: &str) -> (String, usize, String) {
    let (stem, num) = name.rsplit_once('-').unwrap_or((name, ""));
    (stem.to_owned(), num.len(), num.to_owned())
}

impl World {
    /// Something in slurmctld changed: lockstep's next poll reports it and
    /// the scheduler looks again.
    pub(crate) fn slurm_changed(&mut self) {
        // Every change goes through here at the moment it is made, so the
        // end of an unhealthy spell is recorded when it ends.
        for n in self.slurm.nodes.values_mut() {
            if n.unhealthy() || n.unhealthy_until_ms.is_some_and(|t| t == Ms::MAX) {
                n.unhealthy_until_ms = Some(if n.unhealthy() { Ms::MAX } else { self.now });
            }
            // A spell out of service ends when the node is back in it.
            if n.drain.is_none() && n.down.is_none() {
                self.facts.reason_writes.remove(&n.name);
            }
        }
        for lane in Lane::ALL {
            self.slurm.dirty[lane.index()] = true;
            self.slurm_poll_soon(lane);
        }
        if !self.slurm.sched_due {
            self.slurm.sched_due = true;
            self.at(500, Ev::SlurmSchedule);
        }
    }

    /// Schedules the lane's next poll unless one is due.
    pub(crate) fn slurm_poll_soon(&mut self, lane: Lane) {
        if std::mem::replace(&mut self.slurm.poll_due[lane.index()], true) {
            return;
        }
        let delay = match lane {
            Lane::Nodes => {
                let p = self.cfg.slurm_poll_interval_ms;
                (self.now / p + 1) * p - self.now + 20
            }
            Lane::Jobs if self.setup.slurm_lanes => {
                self.lane_rng.between(self.cfg.slurm_jobs_lane_ms)
            }
            // One poll: both at the nodes' instant, the nodes first.
            Lane::Jobs => {
                let p = self.cfg.slurm_poll_interval_ms;
                (self.now / p + 1) * p - self.now + 20
            }
        };
        self.at(delay, Ev::SlurmPoll(lane));
    }

    pub(crate) fn poll_done(&mut self, lane: Lane) {
        self.slurm.poll_due[lane.index()] = false;
        self.slurm.dirty[lane.index()] = false;
    }

    /// A slurmd registers: a new dynamic node, or a known one again.
    pub(crate) fn slurm_register_node(&mut self, name: &str, partition: &str, instance: u64) {
        let now = self.now;
        let rts = self.setup.return_to_service;
        let node = self
            .slurm
            .nodes
            .entry(name.to_owned())
            .or_insert_with(|| SNode {
                name: name.to_owned(),
                partition: partition.to_owned(),
                base: SlurmBaseState::Idle,
                drain: None,
                covers_foreign: None,
                down: None,
                reason: None,
                not_responding: false,
                completing: 0,
                features: vec![partition.to_owned()],
                base_features: vec![partition.to_owned()],
                topology: None,
                jobs: BTreeSet::new(),
                slurmd: None,
                last_response_ms: now,
                unhealthy_until_ms: None,
            });
        let old = node.slurmd.take();
        let orphaned: Vec<u64> = node.jobs.iter().copied().collect();
        node.slurmd = Some(Slurmd {
            instance,
            alive: true,
            blip: None,
            died_by: None,
        });
        node.not_responding = false;
        node.last_response_ms = now;
        Self::return_to_service(node, rts);
        // The new slurmd does not run the jobs slurmctld thinks run here.
        if !orphaned.is_empty() {
            let (by, how, at) = old.and_then(|s| s.died_by).unwrap_or((
                Actor::Slurmctld,
                "slurmd restarted".to_owned(),
                now,
            ));
            for job in orphaned {
                let how = format!("{how}; slurmd registered without it");
                self.kill_job(job, name, &by, &how, at);
            }
        }
        self.slurm_changed();
    }

    fn return_to_service(node: &mut SNode, rts: u8) {
        let Some((_, why, _)) = &node.down else {
            return;
        };
        if rts == 2 || (rts == 1 && *why == DownWhy::NotResponding) {
            node.down = None;
            node.base = if node.jobs.is_empty() {
                SlurmBaseState::Idle
            } else {
                SlurmBaseState::Allocated
            };
            if node.drain.is_none() {
                node.reason = None;
            }
        }
    }

    /// The pod's slurmd registers, if the pod still runs that instance.
    pub(crate) fn slurmd_register(&mut self, uid: &str, instance: u64) {
        let Some(p) = self.kube.pods.values().find(|p| p.uid == uid) else {
            return;
        };
        if p.instance != instance || p.containers != super::kube::Containers::Running {
            return;
        }
        let name = p.name.clone();
        let partition = self.kube.sets[p.set].partition.clone();
        self.slurm_register_node(&name, &partition, instance);
    }

    /// slurmd of a node stopped (its container stopped).
    pub(crate) fn slurmd_stopped(&mut self, name: &str, instance: u64, by: &Actor, how: &str) {
        let Some(n) = self.slurm.nodes.get_mut(name) else {
            return;
        };
        if let Some(s) = &mut n.slurmd {
            if s.instance == instance && s.alive {
                s.alive = false;
                s.died_by = Some((by.clone(), how.to_owned(), self.now));
            }
        }
    }

    /// slurmd stops answering for a while (or answers again).
    pub(crate) fn slurmd_blip(&mut self, name: &str, by: Option<&Actor>) -> bool {
        let Some(s) = self
            .slurm
            .nodes
            .get_mut(name)
            .and_then(|n| n.slurmd.as_mut())
        else {
            return false;
        };
        if let Some(by) = by {
            if !s.alive || s.blip.is_some() {
                return false;
            }
            s.blip = Some((by.clone(), self.now));
        } else {
            s.blip = None;
        }
        true
    }

    /// slurmctld's ping cycle.
    pub(crate) fn ping(&mut self) {
        let now = self.now;
        let timeout = self.cfg.slurmd_timeout_ms;
        let rts = self.setup.return_to_service;
        let mut changed = false;
        let mut kills: Vec<(u64, String, Actor, String, Ms)> = Vec::new();
        for n in self.slurm.nodes.values_mut() {
            let Some(s) = &n.slurmd else {
                continue;
            };
            if s.alive && s.blip.is_none() {
                n.last_response_ms = now;
                if n.not_responding {
                    n.not_responding = false;
                    changed = true;
                }
                if matches!(n.down, Some((_, DownWhy::NotResponding, _))) {
                    // slurmctld asks a node that answers again to register.
                    Self::return_to_service(n, rts);
                    changed = true;
                }
                continue;
            }
            if !n.not_responding {
                n.not_responding = true;
                changed = true;
            }
            if now - n.last_response_ms >= timeout && n.base != SlurmBaseState::Down {
                n.base = SlurmBaseState::Down;
                n.down = Some((Actor::Slurmctld, DownWhy::NotResponding, now));
                if n.reason.is_none() {
                    n.reason = Some(("Not responding".to_owned(), SLURM_USER.to_owned()));
                }
                changed = true;
                let (by, how, at) = match (&s.died_by, &s.blip) {
                    (Some(d), _) => d.clone(),
                    (None, Some((b, t))) => (b.clone(), "slurmd did not answer".to_owned(), *t),
                    (None, None) => (Actor::Slurmctld, "slurmd did not answer".to_owned(), now),
                };
                for &job in &n.jobs {
                    let how = format!("{how}; node DOWN");
                    kills.push((job, n.name.clone(), by.clone(), how, at));
                }
            }
        }
        for (job, node, by, how, at) in kills {
            self.kill_job(job, &node, &by, &how, at);
        }
        if changed {
            self.slurm_changed();
        }
    }

    /// A job dies of its node (NODE_FAIL); what killed it happened at `cause_ms`.
    pub(crate) fn kill_job(&mut self, id: u64, node: &str, by: &Actor, how: &str, cause_ms: Ms) {
        let Some(job) = self.slurm.jobs.get_mut(&id) else {
            return;
        };
        if !job.state.holds_nodes() {
            return;
        }
        job.state = SlurmJobState::NodeFail;
        self.facts.last_job_change_ms = self.now;
        let started_ms = job.started_ms.unwrap_or(0);
        let nodes = job.nodes.clone();
        for n in &nodes {
            if let Some(sn) = self.slurm.nodes.get_mut(n) {
                sn.jobs.remove(&id);
                if sn.jobs.is_empty() && sn.base == SlurmBaseState::Allocated {
                    sn.base = SlurmBaseState::Idle;
                }
            }
        }
        self.facts.job_kills.push(JobKill {
            job: id,
            node: node.to_owned(),
            at_ms: self.now,
            started_ms,
            cause_ms,
            by: by.clone(),
            how: how.to_owned(),
        });
        self.at(self.cfg.min_job_age_ms, Ev::JobPurged { job: id });
        self.slurm_changed();
    }

    /// `sbatch`.
    pub(crate) fn submit(&mut self, fixed: bool, nodes: u8, run_s: u16) {
        self.slurm.next_job += 1;
        let id = 1000 + self.slurm.next_job;
        let partition = if fixed {
            schedule::FIXED_PARTITION
        } else {
            schedule::SCALED_PARTITION
        };
        self.slurm.jobs.insert(
            id,
            Job {
                id,
                partition: partition.to_owned(),
                node_count: u32::from(nodes.max(1)),
                run_ms: u64::from(run_s) * 1000,
                state: SlurmJobState::Pending,
                nodes: Vec::new(),
                pending_reason: Some("Resources".to_owned()),
                started_ms: None,
            },
        );
        self.slurm_changed();
    }

    /// The scheduler: start pending jobs that fit, in submission order.
    pub(crate) fn slurm_schedule(&mut self) {
        self.slurm.sched_due = false;
        let pending: Vec<u64> = self
            .slurm
            .jobs
            .values()
            .filter(|j| j.state == SlurmJobState::Pending)
            .map(|j| j.id)
            .collect();
        let mut blocked: BTreeSet<String> = BTreeSet::new();
        let mut changed = false;
        for id in pending {
            let job = &self.slurm.jobs[&id];
            let mut free: Vec<&SNode> = self
                .slurm
                .nodes
                .values()
                .filter(|n| n.partition == job.partition && n.schedulable())
                .collect();
            free.sort_by_key(|n| node_order(&n.name));
            let want = job.node_count as usize;
            let reason = if blocked.contains(&job.partition) {
                "Priority"
            } else {
                "Resources"
            };
            if free.len() < want {
                blocked.insert(job.partition.clone());
                let job = self.slurm.jobs.get_mut(&id).expect("listed");
                if job.pending_reason.as_deref() != Some(reason) {
                    job.pending_reason = Some(reason.to_owned());
                    changed = true;
                }
                continue;
            }
            let chosen: Vec<String> = free[..want].iter().map(|n| n.name.clone()).collect();
            for n in &chosen {
                let sn = self.slurm.nodes.get_mut(n).expect("listed");
                sn.jobs.insert(id);
                sn.base = SlurmBaseState::Allocated;
            }
            let job = self.slurm.jobs.get_mut(&id).expect("listed");
            job.state = SlurmJobState::Running;
            job.nodes = chosen;
            job.pending_reason = None;
            job.started_ms = Some(self.now);
            self.facts.last_job_change_ms = self.now;
            let run = job.run_ms;
            self.at(run, Ev::JobEnds { job: id });
            changed = true;
        }
        if changed {
            self.slurm_changed();
        }
    }

    pub(crate) fn job_ends(&mut self, id: u64) {
        let Some(job) = self.slurm.jobs.get_mut(&id) else {
            return;
        };
        if job.state != SlurmJobState::Running {
            return;
        }
        job.state = SlurmJobState::Completing;
        self.facts.last_job_change_ms = self.now;
        for n in job.nodes.clone() {
            if let Some(sn) = self.slurm.nodes.get_mut(&n) {
                sn.jobs.remove(&id);
                sn.completing += 1;
                if sn.jobs.is_empty() && sn.base == SlurmBaseState::Allocated {
                    sn.base = SlurmBaseState::Idle;
                }
            }
        }
        self.at(self.cfg.completing_ms, Ev::JobDone { job: id });
        self.slurm_changed();
    }

    pub(crate) fn job_done(&mut self, id: u64) {
        let Some(job) = self.slurm.jobs.get_mut(&id) else {
            return;
        };
        if job.state != SlurmJobState::Completing {
            return;
        }
        job.state = SlurmJobState::Completed;
        self.facts.last_job_change_ms = self.now;
        for n in job.nodes.clone() {
            if let Some(sn) = self.slurm.nodes.get_mut(&n) {
                sn.completing = sn.completing.saturating_sub(1);
            }
        }
        self.at(self.cfg.min_job_age_ms, Ev::JobPurged { job: id });
        self.slurm_changed();
    }

    pub(crate) fn job_purged(&mut self, id: u64) {
        if self.slurm.jobs.remove(&id).is_some() {
            self.slurm_changed();
        }
    }

    /// `scontrol update nodename=N state=drain reason=R` as `user`.
    pub(crate) fn drain_node(&mut self, name: &str, reason: &str, user: &str, by: &Actor) {
        let now = self.now;
        let Some(n) = self.slurm.nodes.get_mut(name) else {
            return;
        };
        // lockstep's actuator records what it drained over itself.
        if !by.is_lockstep() {
            n.covers_foreign = None;
        }
        let new = Some((reason.to_owned(), user.to_owned()));
        let written = (by.is_lockstep() && n.reason != new)
            .then(|| n.reason.is_some() && holder(n).is_some_and(holds_a_reason_of_its_own));
        n.drain = Some((by.clone(), now));
        // A node has one reason: on a node somebody set DOWN the new one is
        // the DOWN's too, and the DOWN the writer's from then on.
        if n.reason != new {
            if let Some(d) = n.down.as_mut().filter(|d| d.1 == DownWhy::Explicit) {
                d.0 = by.clone();
                d.2 = now;
            }
        }
        n.reason = new;
        if let Some(foreign) = written {
            self.reason_written(name, foreign);
        }
        self.slurm_changed();
    }

    /// lockstep wrote a node's reason (replacing someone else's if
    /// `foreign`): two takeovers of somebody else's reason in one spell out
    /// of service is a fight, and a reason rewritten more often than
    /// [`REASON_CHANGES_PER_SPELL_MAX`] a flip-flop, however each came about.
    fn reason_written(&mut self, name: &str, foreign: bool) {
        let now = self.now;
        let writes = self.facts.reason_writes.entry(name.to_owned()).or_default();
        writes.push((foreign, now));
        let takeovers = writes.iter().filter(|w| w.0).count();
        let n = writes.len();
        let times: Vec<String> = writes
            .iter()
            .map(|(f, t)| {
                format!(
                    "{:.1} s{}",
                    *t as f64 / 1000.0,
                    if *f { " over another's" } else { "" }
                )
            })
            .collect();
        let message = if foreign && takeovers == 2 {
            Some(format!(
                "lockstep took {name}'s reason over from someone else twice in one spell out of service (writes at {})",
                times.join(", ")
            ))
        } else if n == REASON_CHANGES_PER_SPELL_MAX + 1 {
            Some(format!(
                "lockstep changed {name}'s reason {n} times in one spell out of service (writes at {})",
                times.join(", ")
            ))
        } else {
            None
        };
        if let Some(message) = message {
            self.facts.violations.push(super::check::Violation {
                property: super::check::Property::NoReasonFlipFlop,
                at_ms: now,
                message,
            });
        }
    }

    /// `scontrol update nodename=N reason=R` (no state): on a node that is
    /// drained or DOWN the reason, and so the drain or DOWN, is the
    /// writer's from then on.
    pub(crate) fn rewrite_reason(&mut self, name: &str, reason: &str, user: &str, by: &Actor) {
        let now = self.now;
        let Some(n) = self.slurm.nodes.get_mut(name) else {
            return;
        };
        if n.drain.is_none() && n.down.is_none() {
            return;
        }
        if let Some(d) = &mut n.drain {
            *d = (by.clone(), now);
        }
        if let Some(d) = &mut n.down {
            d.0 = by.clone();
            d.2 = now;
        }
        n.covers_foreign = None;
        n.reason = Some((reason.to_owned(), user.to_owned()));
        self.slurm_changed();
    }

    /// `scontrol update nodename=N state=undrain` (what Slinky's
    /// slurm-operator sends): clears DRAIN, and the reason unless the node
    /// is DOWN.
    pub(crate) fn undrain_node(&mut self, name: &str) {
        let Some(n) = self.slurm.nodes.get_mut(name) else {
            return;
        };
        if n.drain.take().is_none() {
            return;
        }
        n.covers_foreign = None;
        if n.down.is_none() {
            n.reason = None;
        }
        self.slurm_changed();
    }

    /// `scontrol update nodename=N state=resume`.
    pub(crate) fn resume_node(&mut self, name: &str) {
        let Some(n) = self.slurm.nodes.get_mut(name) else {
            return;
        };
        n.drain = None;
        n.covers_foreign = None;
        if n.down.take().is_some() {
            n.base = if n.jobs.is_empty() {
                SlurmBaseState::Idle
            } else {
                SlurmBaseState::Allocated
            };
        }
        n.reason = None;
        self.slurm_changed();
    }

    /// `scontrol update nodename=N state=down reason=R`: kills its jobs,
    /// which are laid at `kills_by`'s door (with how) when the DOWN only
    /// carries out what someone else started (a pod's preStop hook). A node
    /// has one reason: on a drained node the new one is the drain's too, and
    /// the drain is the writer's from then on (as with a reason rewritten).
    pub(crate) fn down_node(
        &mut self,
        name: &str,
        reason: &str,
        user: &str,
        by: &Actor,
        kills_by: Option<(&Actor, &str, Ms)>,
    ) {
        let now = self.now;
        let Some(n) = self.slurm.nodes.get_mut(name) else {
            return;
        };
        let new = Some((reason.to_owned(), user.to_owned()));
        let written = (by.is_lockstep() && n.reason != new)
            .then(|| n.reason.is_some() && holder(n).is_some_and(holds_a_reason_of_its_own));
        n.base = SlurmBaseState::Down;
        n.down = Some((by.clone(), DownWhy::Explicit, now));
        if n.reason != new {
            if let Some(d) = &mut n.drain {
                *d = (by.clone(), now);
                n.covers_foreign = None;
            }
        }
        n.reason = new;
        let jobs: Vec<u64> = n.jobs.iter().copied().collect();
        if let Some(foreign) = written {
            self.reason_written(name, foreign);
        }
        let (kill_by, how, at) = kills_by.unwrap_or((by, "set DOWN", now));
        let (kill_by, how) = (kill_by.clone(), how.to_owned());
        for j in jobs {
            self.kill_job(j, name, &kill_by, &how, at);
        }
        self.slurm_changed();
    }

    pub(crate) fn admin_drain(&mut self, r: PodRef, reason: u8, by: &Actor) {
        let Some(name) = self.pod_name(r) else {
            return;
        };
        let text = ADMIN_REASONS[usize::from(reason) % ADMIN_REASONS.len()];
        self.drain_node(&name, text, ADMIN_USER, by);
    }

    pub(crate) fn admin_rewrite_reason(&mut self, r: PodRef, reason: u8, by: &Actor) {
        let Some(name) = self.pod_name(r) else {
            return;
        };
        let text = ADMIN_REASONS[usize::from(reason) % ADMIN_REASONS.len()];
        self.rewrite_reason(&name, text, ADMIN_USER, by);
    }

    pub(crate) fn admin_resume(&mut self, r: PodRef, _by: &Actor) {
        let Some(name) = self.pod_name(r) else {
            return;
        };
        let Some(n) = self.slurm.nodes.get(&name) else {
            return;
        };
        // scontrol refuses to resume a node that is neither drained nor down.
        if n.drain.is_none() && n.down.is_none() {
            return;
        }
        self.slurm.admin_resumes.push((name.clone(), self.now));
        self.resume_node(&name);
    }
}

/// The most reason changes lockstep makes on a node in one spell out of
/// service: one per cause (a cordon, a pod gone, a health cause, a scale-in)
/// and a prefix rename; more is reasons going back and forth.
pub(crate) const REASON_CHANGES_PER_SPELL_MAX: usize = 4;

/// Whether a reason `who` wrote is somebody's own, which lockstep writing
/// over takes from them: not lockstep's, and not slurmctld's own "Not
/// responding" (written only where no reason was, and no actor's).
fn holds_a_reason_of_its_own(who: &Actor) -> bool {
    !who.is_lockstep() && *who != Actor::Slurmctld
}

/// Who holds a node out of service: whoever set its drain, else its DOWN.
pub(crate) fn holder(n: &SNode) -> Option<&Actor> {
    n.drain
        .as_ref()
        .map(|(who, _)| who)
        .or(n.down.as_ref().map(|(who, _, _)| who))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_table_order_is_numeric() {
        let mut names = vec!["cpu-10", "cpu-2", "cpu-1", "gpu-0"];
        names.sort_by_key(|n| node_order(n));
        assert_eq!(names, ["cpu-1", "cpu-2", "cpu-10", "gpu-0"]);
    }
}
