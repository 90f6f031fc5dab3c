//! The Slurm actuator: carries out the `Slurm*` actions, idempotently, and
//! reports an [`ActionOutcome`] for every one.
//!
//! It reads the node first and does nothing if the action is already true
//! (`AlreadyDone`): a drain with the same reason, a resume of a node that is
//! neither drained nor down, the same features or topology. Writes go
//! through slurmrestd where its openapi version has a node update endpoint
//! (`POST /slurm/v0.0.39+/node/{name}`, Slurm 23.02+), through `scontrol
//! update` otherwise (Slurm 22.05). [`Actuator::execute_all`] carries out
//! the drains, downs and resumes that wait together with shared reads and
//! writes (`batch`). Every call is bounded by timeouts and the
//! whole action by `action_timeout_ms`; it never panics and never hangs. It
//! decides nothing: whether an action should happen is the reducer's
//! business.
//!
//! # What it never replaces or lifts
//!
//! A drain, down or resume changes a node only if nobody else holds it out
//! (a resume: only if it is out by lockstep's own doing), as
//! [`Ownership::owns`] says with the [`ReasonOwnership`] in force: the
//! actuator holds a [`watch::Receiver`] of it, which the service updates when
//! a `PolicyChanged` changes the reason prefix or `drain.slurm_user` (from
//! the engine's `reason_ownership`, earlier prefixes included). So:
//!
//! | action | node as read | outcome |
//! |---|---|---|
//! | SlurmDrain / SlurmDown | held by somebody else: drained, or set DOWN or FAIL by a user, with a reason not lockstep's ([`Ownership::held_by_other`]; slurmctld's own not-responding DOWN holds nothing) | `Declined { held_by }`, nothing written |
//! | SlurmDrain / SlurmDown | already in that state with that reason | `AlreadyDone` |
//! | SlurmDrain / SlurmDown | otherwise (in service, or out by lockstep) | written: only lockstep's own reason is ever replaced |
//! | SlurmResume | not out | `AlreadyDone` |
//! | SlurmResume | out, reason not lockstep's (slurmctld's DOWN included) | `Declined { held_by }`, nothing written |
//! | SlurmResume | out by lockstep | resumed: `UNDRAIN` of a drain, `RESUME` of a DOWN or FAIL |
//!
//! `held_by` is [`Ownership::describe_holder`]: `IDLE+DRAIN by root: NVSwitch
//! RMA`.
//!
//! # The window between read and write
//!
//! Slurm has no conditional node update: a drain of a node drained with
//! another reason replaces that reason and answers success (`scontrol update
//! nodename=N state=drain reason=B` over reason A on 22.05, the REST update
//! on 24.11 and 26.05: Slurm keeps B, says nothing of A). So the actuator
//! reads the node and decides; then, only if it is about to write, it reads
//! the node once more and decides again with the ownership in force, and
//! writes right after that second read. What somebody else does while the
//! action waits or decides is seen. What remains is the window from the
//! second read to slurmctld applying the write: one request to slurmrestd
//! (or one `scontrol update` run) and its answer. A drain or down an admin
//! sets inside it is replaced by lockstep's and from then on reads as
//! lockstep's own; nothing short of a conditional update in Slurm closes it.
//! A resume of a node the read found only drained is an `UNDRAIN`, which
//! lifts the drain alone: a DOWN set inside the window (a pod's preStop
//! hook, an admin, slurmctld for a node not responding) stays, with its
//! reason. A drain or FAIL set there is lifted with lockstep's (Slurm has one
//! DRAIN flag, and FAIL sets it too). Slurm 22.05, 24.11 and 26.05 take `UNDRAIN` through scontrol, and
//! the last two through slurmrestd; on a node not drained it changes nothing.
//! [`ActuatorConfig::before_write`] is a seam for tests that act inside the
//! wider window the second read closes, [`ActuatorConfig::after_read`] one
//! for the window that remains.
//!
//! What it writes is clean whatever it was given: a reason loses its control
//! characters and is cut to [`REASON_CHARS_MAX`] characters (its start, and
//! so lockstep's prefix, is kept); an empty or malformed feature or topology
//! is refused, never sent (an empty topology would take the node out of
//! every Slurm topology).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use lockstep_schemas::{
    Action, ActionOutcome, IssuedAction, OutcomeResult, Ownership, ReasonOwnership, SlurmBaseState,
    SlurmNode, SlurmNodeFlag,
};
use tokio::sync::{watch, OnceCell};

use super::error::{Error, Result};
use super::rest::RestClient;
use super::scontrol::{ReservationVerb, Scontrol, SlurmVersion};

/// Drains, downs and resumes carried out together.
mod batch;

/// Bounds of the actuator.
#[derive(Debug, Clone)]
pub struct ActuatorConfig {
    /// Upper bound of one action, reads and writes included.
    pub action_timeout_ms: u64,
    /// A test seam, `None` in production: awaited when a drain, down or
    /// resume has read its node and decided to write, before the second
    /// read that checks the node again right before the write (see the
    /// module docs); in a batch ([`Actuator::execute_all`]), for each of its
    /// actions before the batch's one read. Tests change the node there, as
    /// an admin would while the action runs. It counts against
    /// `action_timeout_ms`.
    pub before_write: Option<BeforeWrite>,
    /// A test seam, `None` in production: awaited after the last read of a
    /// drain, down or resume that writes, right before its write (in a
    /// batch, for each of its writes' actions). Tests change the node there
    /// to show what the write does to a change it could not see: the
    /// window no read closes (see the module docs).
    pub after_read: Option<BeforeWrite>,
    /// From this many nodes on, and from a quarter of the nodes Slurm has
    /// (as the last listing showed), [`Actuator::execute_all`] reads the
    /// nodes of its drains, downs and resumes in one listing of every node
    /// instead of one request per node.
    pub listing_read_min: usize,
    /// Those listings go through scontrol (`scontrol show node`, some 50 ms
    /// for 10,000 nodes on a slurm.conf that names them as ranges) rather
    /// than slurmrestd (seconds for 10,000 nodes), and so pay from
    /// `listing_read_min` nodes on, whatever the cluster's size; and a
    /// batch of fewer than a quarter of the cluster reads its nodes by
    /// name, in one `scontrol show node A,B,...`. Set with
    /// `[slurm] nodes_through_scontrol`; without scontrol it does nothing.
    pub list_through_scontrol: bool,
}

impl Default for ActuatorConfig {
    fn default() -> Self {
        Self {
            action_timeout_ms: 30_000,
            before_write: None,
            after_read: None,
            listing_read_min: 32,
            list_through_scontrol: false,
        }
    }
}

/// What [`ActuatorConfig::before_write`] and [`ActuatorConfig::after_read`]
/// await: a function of the action about to be written.
#[derive(Clone)]
pub struct BeforeWrite(Arc<HookFn>);

type HookFn = dyn Fn(&Action) -> BoxFuture<'static, ()> + Send + Sync;

impl BeforeWrite {
    /// A hook that runs `f` for the action and awaits what it returns.
    pub fn new<F, Fut>(f: F) -> Self
    where
        F: Fn(&Action) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        Self(Arc::new(move |a| Box::pin(f(a))))
    }
}

impl std::fmt::Debug for BeforeWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforeWrite(..)")
    }
}

/// Carries out Slurm actions. Give it slurmrestd, scontrol or both: reads
/// use slurmrestd when there is one; writes use slurmrestd when its version
/// can update nodes, else scontrol.
#[derive(Debug)]
pub struct Actuator {
    rest: Option<RestClient>,
    scontrol: Option<Scontrol>,
    ownership: watch::Receiver<ReasonOwnership>,
    config: ActuatorConfig,
    scontrol_version: OnceCell<Option<SlurmVersion>>,
    /// How many nodes the last listing of every node held (0: none yet).
    nodes_listed: std::sync::atomic::AtomicUsize,
}

/// Longest reason lockstep writes, in characters. Slurm stores any length,
/// but `sinfo`, `scontrol show node` and the REST answers carry the reason on
/// every listing of the node, and a reason is a label for people.
pub const REASON_CHARS_MAX: usize = 256;

/// The reason left on a node lockstep resumed when Slurm keeps the old one.
/// Slurm 24.11 keeps a resumed node's reason (22.05 and 26.05 clear it) and,
/// when the node later stops responding, appends its own: `lockstep: ... :
/// Not responding` on a DOWN node would read as lockstep's own down. This
/// text carries no owned prefix.
pub const RESUMED_REASON: &str = "resumed";

/// How an action ended, short of a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Applied {
    Changed,
    AlreadyDone,
    /// Somebody else holds the node, as described.
    Declined(String),
}

/// A node-state action (drain, down, resume) as the actuator weighs it.
#[derive(Debug, Clone, Copy)]
enum StateChange<'a> {
    Drain(&'a str),
    Down(&'a str),
    Resume,
}

impl<'a> StateChange<'a> {
    /// What to do about `n` as Slurm shows it now: `None` to write.
    fn decide(self, n: &SlurmNode, own: &Ownership<'_>) -> Option<Applied> {
        let out = out_of_service(n);
        if let Self::Resume = self {
            if !out {
                return Some(Applied::AlreadyDone);
            }
        }
        // A drain or down never replaces what somebody else holds; a
        // resume lifts only what lockstep set (slurmctld's own DOWN of a
        // node not responding included: that is Slurm's to lift).
        let declines = match self {
            Self::Resume => !own.owns(n),
            Self::Drain(_) | Self::Down(_) => own.held_by_other(n),
        };
        if declines {
            return Some(Applied::Declined(Ownership::describe_holder(n)));
        }
        let already = match self {
            Self::Drain(reason) => n.drained_with(reason),
            Self::Down(reason) => n.down_with(reason),
            Self::Resume => false,
        };
        already.then_some(Applied::AlreadyDone)
    }

    /// The write that carries it out on `n`, as read. A resume of a node
    /// only drained is an UNDRAIN: it lifts the drain alone, so a DOWN that
    /// lands between the read and the write (a pod's preStop hook, an
    /// administrator, slurmctld for a node not responding) stays, with its
    /// reason. A resume of lockstep's own DOWN (or FAIL) is a RESUME, which
    /// lifts both.
    fn write(self, n: &SlurmNode) -> Write<'a> {
        match self {
            Self::Drain(reason) => Write::State {
                state: "DRAIN",
                reason: Some(reason),
            },
            Self::Down(reason) => Write::State {
                state: "DOWN",
                reason: Some(reason),
            },
            Self::Resume if n.state == SlurmBaseState::Down || n.has(&SlurmNodeFlag::Fail) => {
                Write::State {
                    state: "RESUME",
                    reason: None,
                }
            }
            Self::Resume => Write::State {
                state: "UNDRAIN",
                reason: None,
            },
        }
    }
}

/// Drained, down or failed.
fn out_of_service(n: &SlurmNode) -> bool {
    n.has(&SlurmNodeFlag::Drain) || n.has(&SlurmNodeFlag::Fail) || n.state == SlurmBaseState::Down
}

/// What a write must achieve, in Slurm's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Write<'a> {
    State {
        state: &'static str,
        reason: Option<&'a str>,
    },
    /// The reason alone, state unchanged.
    Reason(&'a str),
    Features(&'a [String]),
    Topology(&'a str),
}

impl Actuator {
    /// An actuator. At least one of `rest` and `scontrol` must be given.
    /// `ownership` tells lockstep's drains and downs from everybody else's;
    /// the actuator reads the value in force at every decision, so the
    /// sender may change it at any time (a fixed one: keep
    /// `watch::channel(ownership).1`).
    pub fn new(
        rest: Option<RestClient>,
        scontrol: Option<Scontrol>,
        ownership: watch::Receiver<ReasonOwnership>,
        config: ActuatorConfig,
    ) -> Result<Self> {
        if rest.is_none() && scontrol.is_none() {
            return Err(Error::Config(
                "the slurm actuator needs slurmrestd or scontrol".to_owned(),
            ));
        }
        Ok(Self {
            rest,
            scontrol,
            ownership,
            config,
            scontrol_version: OnceCell::new(),
            nodes_listed: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Carries out one action and reports how it ended. Never panics, never
    /// waits longer than `action_timeout_ms`.
    pub async fn execute(&self, issued: &IssuedAction) -> ActionOutcome {
        let applied = tokio::time::timeout(self.timeout(), self.apply(&issued.action)).await;
        self.conclude(
            issued,
            applied.unwrap_or_else(|_| Err(self.timed_out(&issued.action))),
        )
    }

    /// The bound of one action (of one batch, in [`Actuator::execute_all`]).
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.action_timeout_ms)
    }

    /// The error of `action` when the bound was hit.
    fn timed_out(&self, action: &Action) -> Error {
        Error::Timeout {
            what: action.describe(),
            timeout_ms: self.config.action_timeout_ms,
        }
    }

    /// The outcome of `issued`, which ended as `applied`; logged.
    fn conclude(&self, issued: &IssuedAction, applied: Result<Applied>) -> ActionOutcome {
        let action = &issued.action;
        let result = match applied {
            Ok(Applied::Changed) => OutcomeResult::Succeeded,
            Ok(Applied::AlreadyDone) => OutcomeResult::AlreadyDone,
            Ok(Applied::Declined(held_by)) => OutcomeResult::Declined { held_by },
            Err(e) => OutcomeResult::Failed {
                retryable: e.retryable(),
                error: e.to_string(),
            },
        };
        match &result {
            OutcomeResult::Failed { retryable, error } => tracing::warn!(
                action = %issued.id, kind = action.kind().name(), retryable, error, "slurm action failed"
            ),
            r => {
                tracing::info!(action = %issued.id, kind = action.kind().name(), result = ?r, "slurm action done")
            }
        }
        ActionOutcome {
            action_id: issued.id.clone(),
            kind: action.kind(),
            target: action.target(),
            result,
        }
    }

    /// How the action ended, short of a failure.
    async fn apply(&self, action: &Action) -> Result<Applied> {
        match action {
            Action::SlurmDrain { node, reason } => {
                let reason = clean_reason(reason)?;
                return self
                    .change_state(action, node, StateChange::Drain(&reason))
                    .await;
            }
            Action::SlurmDown { node, reason } => {
                let reason = clean_reason(reason)?;
                return self
                    .change_state(action, node, StateChange::Down(&reason))
                    .await;
            }
            Action::SlurmResume { node } => {
                let applied = self.change_state(action, node, StateChange::Resume).await?;
                if applied == Applied::Changed {
                    // The resume is done; replacing a reason Slurm kept is
                    // housekeeping, and its failure does not undo the resume.
                    if let Err(e) = self.replace_kept_reason(node).await {
                        tracing::warn!(node, error = %e, "cannot replace the reason slurm kept after a resume");
                    }
                }
                return Ok(applied);
            }
            Action::SlurmSetFeatures { node, features } => {
                for f in features {
                    let ok = !f.is_empty()
                        && !f.chars().any(|c| {
                            c.is_whitespace()
                                || c.is_control()
                                || matches!(c, ',' | '=' | '&' | '|' | '(' | ')' | '[' | ']' | '*')
                        });
                    if !ok {
                        return Err(Error::InvalidValue {
                            what: "slurm feature",
                            value: f.clone(),
                        });
                    }
                }
                let mut want = features.clone();
                want.sort();
                want.dedup();
                let n = self.read(node).await?;
                if n.features == want {
                    return Ok(Applied::AlreadyDone);
                }
                self.write(node, Write::Features(&want)).await?;
            }
            Action::SlurmSetTopology { node, topology } => {
                if topology.is_empty()
                    || topology
                        .chars()
                        .any(|c| c.is_whitespace() || c.is_control() || c == '=')
                {
                    return Err(Error::InvalidValue {
                        what: "slurm topology",
                        value: topology.clone(),
                    });
                }
                self.check_topology_supported().await?;
                let n = self.read(node).await?;
                if n.topology.as_deref() == Some(topology.as_str()) {
                    return Ok(Applied::AlreadyDone);
                }
                self.write(node, Write::Topology(topology)).await?;
            }
            Action::SlurmReserve {
                name,
                nodes,
                start_ms,
                end_ms,
                users,
            } => {
                let changed = self.reserve(name, nodes, *start_ms, *end_ms, users).await?;
                return Ok(if changed {
                    Applied::Changed
                } else {
                    Applied::AlreadyDone
                });
            }
            Action::SlurmUnreserve { name } => {
                let sc = self.reservations_through()?;
                if sc.reservation(name).await?.is_none() {
                    return Ok(Applied::AlreadyDone);
                }
                sc.write_reservation(ReservationVerb::Delete, name, &[])
                    .await?;
            }
            other => return Err(Error::NotSlurm(other.kind().name())),
        }
        Ok(Applied::Changed)
    }

    /// A drain, down or resume: read and decide; if there is something to
    /// write, read again and decide again with the ownership then in force,
    /// and write at once (see the module docs for the window that remains).
    async fn change_state(
        &self,
        action: &Action,
        node: &str,
        change: StateChange<'_>,
    ) -> Result<Applied> {
        let n = self.read(node).await?;
        if let Some(done) = change.decide(&n, &self.ownership().borrow()) {
            return Ok(done);
        }
        if let Some(hook) = &self.config.before_write {
            (hook.0)(action).await;
        }
        let n = self.read(node).await?;
        if let Some(done) = change.decide(&n, &self.ownership().borrow()) {
            return Ok(done);
        }
        if let Some(hook) = &self.config.after_read {
            (hook.0)(action).await;
        }
        self.write(node, change.write(&n)).await?;
        Ok(Applied::Changed)
    }

    /// Reservations are written with scontrol, on every Slurm version.
    fn reservations_through(&self) -> Result<&Scontrol> {
        self.scontrol.as_ref().ok_or_else(|| {
            Error::Unsupported(
                "maintenance reservations are made with scontrol, and none is configured ([slurm] slurm_conf, scontrol in PATH)".to_owned(),
            )
        })
    }

    /// Creates the maintenance reservation, or brings the one of that name
    /// to these nodes and this window. A start in the past starts it now (and
    /// is then no longer compared: Slurm moved it to the time it was made).
    async fn reserve(
        &self,
        name: &str,
        nodes: &[String],
        start_ms: u64,
        end_ms: Option<u64>,
        users: &str,
    ) -> Result<bool> {
        let sc = self.reservations_through()?;
        for n in nodes {
            super::scontrol::check_node_name(n)?;
        }
        if nodes.is_empty() {
            return Err(Error::InvalidValue {
                what: "slurm reservation nodes",
                value: String::new(),
            });
        }
        let mut want_nodes = nodes.to_vec();
        want_nodes.sort();
        want_nodes.dedup();
        let started = start_ms <= crate::clock::now_ms();
        let start = utc_time(start_ms);
        let end = end_ms.map(utc_time);
        let mut settings: Vec<(&str, String)> = vec![("nodes", want_nodes.join(","))];
        if !started {
            settings.push(("starttime", start.clone()));
        }
        match &end {
            Some(e) => settings.push(("endtime", e.clone())),
            None => settings.push(("duration", "UNLIMITED".to_owned())),
        }
        match sc.reservation(name).await? {
            Some(r) => {
                let same = r.nodes == want_nodes
                    && (started || r.start == start)
                    && match &end {
                        Some(e) => r.end == *e && !r.open_ended(),
                        None => r.open_ended(),
                    };
                if same {
                    return Ok(false);
                }
                sc.write_reservation(ReservationVerb::Update, name, &settings)
                    .await?;
            }
            None => {
                if started {
                    settings.push(("starttime", "now".to_owned()));
                }
                settings.push(("users", users.to_owned()));
                settings.push(("flags", "MAINT,IGNORE_JOBS".to_owned()));
                sc.write_reservation(ReservationVerb::Create, name, &settings)
                    .await?;
            }
        }
        Ok(true)
    }

    async fn read(&self, node: &str) -> Result<SlurmNode> {
        let found = match (&self.rest, &self.scontrol) {
            (Some(rest), _) => rest.node(node).await?,
            (None, Some(sc)) => sc.node(node).await?,
            (None, None) => {
                return Err(Error::Config(
                    "the slurm actuator needs slurmrestd or scontrol".to_owned(),
                ))
            }
        };
        found.ok_or_else(|| Error::NodeNotFound {
            node: node.to_owned(),
        })
    }

    /// The ownership in force (a copy: the receiver's lock is never held
    /// across a request).
    fn ownership(&self) -> ReasonOwnership {
        self.ownership.borrow().clone()
    }

    /// After a resume: if Slurm kept the node's reason (24.11) and it is
    /// lockstep's, replace it by [`RESUMED_REASON`].
    async fn replace_kept_reason(&self, node: &str) -> Result<()> {
        let after = self.read(node).await?;
        let kept_own = after.reason.as_deref().is_some_and(|r| r != RESUMED_REASON)
            && self.ownership().borrow().owns(&after);
        if !out_of_service(&after) && kept_own {
            self.write(node, Write::Reason(RESUMED_REASON)).await?;
        }
        Ok(())
    }

    async fn scontrol_version(&self, sc: &Scontrol) -> Option<SlurmVersion> {
        *self
            .scontrol_version
            .get_or_init(|| async {
                match sc.version().await {
                    Ok(v) => Some(v),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot tell the slurm version from scontrol");
                        None
                    }
                }
            })
            .await
    }

    /// Per-node topology exists from Slurm 25.05 on (slurmrestd v0.0.43's
    /// `topology_str`, `scontrol update ... topology=`).
    async fn check_topology_supported(&self) -> Result<()> {
        let mut seen = Vec::new();
        if let Some(rest) = &self.rest {
            let v = rest.version().await?;
            if v.has_node_topology() {
                return Ok(());
            }
            seen.push(format!("slurmrestd serves openapi {v}"));
        }
        if let Some(sc) = &self.scontrol {
            match self.scontrol_version(sc).await {
                Some(v) if v.has_node_topology() => return Ok(()),
                Some(v) => seen.push(format!("scontrol is slurm {v}")),
                None => seen.push("scontrol's version is unknown".to_owned()),
            }
        }
        Err(Error::Unsupported(format!(
            "setting a node's topology needs slurm 25.05 or newer (slurmrestd openapi v0.0.43+, or scontrol update topology=); {}",
            seen.join(", ")
        )))
    }

    async fn write(&self, node: &str, w: Write<'_>) -> Result<()> {
        if let Some(rest) = &self.rest {
            let v = rest.version().await?;
            let usable = match w {
                Write::Topology(_) => v.has_node_topology(),
                _ => v.has_node_update(),
            };
            if usable {
                let update = rest_update(&w, &rest.config().user);
                return rest.update_node(node, &update).await;
            }
        }
        let Some(sc) = &self.scontrol else {
            let v = match &self.rest {
                Some(rest) => rest.version().await?.to_string(),
                None => "none".to_owned(),
            };
            return Err(Error::Unsupported(format!(
                "slurmrestd openapi {v} cannot update nodes and no scontrol is configured"
            )));
        };
        let settings = scontrol_settings(&w);
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        match sc.update_node(node, &settings).await {
            Err(Error::Command { stderr, .. })
                if stderr.to_ascii_lowercase().contains("invalid node name") =>
            {
                Err(Error::NodeNotFound {
                    node: node.to_owned(),
                })
            }
            r => r,
        }
    }

    /// Writes `w` to all of `nodes` in one request where the way [`write`]
    /// takes accepts several nodes (a host list to `scontrol update`,
    /// slurmrestd v0.0.42's `POST /nodes/`); `None` where it does not
    /// (slurmrestd v0.0.39 - v0.0.41 update one node a request).
    ///
    /// [`write`]: Actuator::write
    async fn write_together(&self, nodes: &[&str], w: Write<'_>) -> Option<Result<()>> {
        if let Some(rest) = &self.rest {
            let v = match rest.version().await {
                Ok(v) => v,
                Err(e) => return Some(Err(e)),
            };
            let usable = match w {
                Write::Topology(_) => v.has_node_topology(),
                _ => v.has_node_update(),
            };
            if usable {
                if !v.has_nodes_update() {
                    return None;
                }
                let update = rest_update(&w, &rest.config().user);
                return Some(rest.update_nodes(nodes, &update).await);
            }
        }
        // Without scontrol, each node's own write says why it cannot.
        let sc = self.scontrol.as_ref()?;
        let settings = scontrol_settings(&w);
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Some(sc.update_nodes(nodes, &settings).await)
    }
}

/// `scontrol update nodename=...` settings that carry out `w`.
fn scontrol_settings(w: &Write<'_>) -> Vec<(&'static str, String)> {
    match w {
        Write::State { state, reason } => {
            let mut s = vec![("state", (*state).to_owned())];
            if let Some(r) = reason {
                s.push(("reason", (*r).to_owned()));
            }
            s
        }
        Write::Features(f) => {
            // Without a node features plugin Slurm keeps active =
            // available; setting both keeps that true (active must be a
            // subset of available).
            let features = f.join(",");
            vec![
                ("availablefeatures", features.clone()),
                ("activefeatures", features),
            ]
        }
        Write::Topology(t) => vec![("topology", (*t).to_owned())],
        Write::Reason(r) => vec![("reason", (*r).to_owned())],
    }
}

/// The `update_node_msg` for slurmrestd v0.0.39+. `user` is the user
/// lockstep acts as (the JWT's): a reason carries it as `reason_uid`, as the
/// published schema asks of a client that sends as root. (Slurm 24.11 and
/// 26.05 set `reason_set_by_user` to the authenticated user whatever
/// `reason_uid` says; sending lockstep's own user keeps both the same.)
fn rest_update(w: &Write<'_>, user: &str) -> serde_json::Value {
    match w {
        Write::State { state, reason } => {
            let mut m = serde_json::json!({ "state": [state] });
            if let Some(r) = reason {
                m["reason"] = serde_json::Value::from(*r);
                m["reason_uid"] = serde_json::Value::from(user);
            }
            m
        }
        // An empty list means "leave the features alone" to slurmrestd
        // (24.11 and 26.05 answer 200 and change nothing); a list holding
        // one empty string clears them.
        Write::Features([]) => serde_json::json!({ "features": [""], "features_act": [""] }),
        Write::Features(f) => serde_json::json!({ "features": f, "features_act": f }),
        Write::Topology(t) => serde_json::json!({ "topology_str": t }),
        Write::Reason(r) => serde_json::json!({ "reason": r, "reason_uid": user }),
    }
}

/// The reason as lockstep writes it: control characters removed (a tab or
/// line break becomes a space, so words stay apart), surrounding whitespace
/// trimmed, cut to [`REASON_CHARS_MAX`] characters. The start is kept, so a
/// reason that starts with lockstep's prefix still does. Nothing left: an
/// invalid reason, never sent.
pub fn clean_reason(reason: &str) -> Result<String> {
    let cleaned: String = reason
        .chars()
        .filter_map(|c| match c {
            '\t' | '\n' | '\r' | '\u{b}' | '\u{c}' => Some(' '),
            c if c.is_control() => None,
            c => Some(c),
        })
        .collect();
    let cut: String = cleaned.trim().chars().take(REASON_CHARS_MAX).collect();
    let cut = cut.trim_end().to_owned();
    if cut.is_empty() {
        return Err(Error::InvalidValue {
            what: "slurm node reason",
            value: reason.to_owned(),
        });
    }
    Ok(cut)
}

/// `YYYY-MM-DDTHH:MM:SS` in UTC, as scontrol reads and prints times under
/// `TZ=UTC`.
fn utc_time(ms: u64) -> String {
    let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    let t = k8s_openapi::jiff::Timestamp::from_second(secs)
        .unwrap_or(k8s_openapi::jiff::Timestamp::MAX);
    let mut s = t.to_string();
    if s.ends_with('Z') {
        s.pop();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rest_updates_follow_the_published_schema() {
        let drain = rest_update(
            &Write::State {
                state: "DRAIN",
                reason: Some("lockstep: cordoned"),
            },
            "lockstep",
        );
        assert_eq!(
            drain,
            serde_json::json!({"state": ["DRAIN"], "reason": "lockstep: cordoned", "reason_uid": "lockstep"})
        );
        // Resumes carry no reason.
        for state in ["RESUME", "UNDRAIN"] {
            let body = rest_update(
                &Write::State {
                    state,
                    reason: None,
                },
                "lockstep",
            );
            assert_eq!(body, serde_json::json!({ "state": [state] }));
        }
        let f = ["gpu".to_owned(), "zone-a".to_owned()];
        assert_eq!(
            rest_update(&Write::Features(&f), "root"),
            serde_json::json!({"features": ["gpu", "zone-a"], "features_act": ["gpu", "zone-a"]})
        );
        assert_eq!(
            rest_update(&Write::Features(&[]), "root"),
            serde_json::json!({"features": [""], "features_act": [""]}),
            "an empty list would change nothing"
        );
        assert_eq!(
            rest_update(&Write::Topology("default:s1"), "root"),
            serde_json::json!({"topology_str": "default:s1"})
        );
    }

    #[test]
    fn reasons_are_cleaned_before_they_reach_slurm() {
        let long = format!("lockstep: {}", "x".repeat(400));
        let long_want = format!("lockstep: {}", "x".repeat(REASON_CHARS_MAX - 10));
        let wide = format!("lockstep: {}", "é".repeat(300));
        let wide_want = format!("lockstep: {}", "é".repeat(REASON_CHARS_MAX - 10));
        // (given, written; None: refused)
        let rows: &[(&str, Option<&str>)] = &[
            (
                "lockstep: kubernetes node k1 cordoned",
                Some("lockstep: kubernetes node k1 cordoned"),
            ),
            (
                "lockstep: a\nReason=forged",
                Some("lockstep: a Reason=forged"),
            ),
            ("lockstep:\tb\r\n", Some("lockstep: b")),
            ("lock\u{7}step: bell\u{1b}[0m", Some("lockstep: bell[0m")),
            ("\u{0}lockstep: nul first", Some("lockstep: nul first")),
            ("  lockstep: padded  ", Some("lockstep: padded")),
            ("lockstep: del\u{7f}", Some("lockstep: del")),
            ("lockstep: c1\u{85}", Some("lockstep: c1")),
            (&long, Some(&long_want)),
            (&wide, Some(&wide_want)),
            ("", None),
            ("   ", None),
            ("\u{1}\u{2}\n", None),
        ];
        for (given, want) in rows {
            let got = clean_reason(given).ok();
            assert_eq!(got.as_deref(), *want, "{given:?}");
            if let Some(g) = got {
                assert!(g.chars().count() <= REASON_CHARS_MAX, "{given:?}");
                assert!(!g.chars().any(char::is_control), "{given:?}");
                assert!(
                    g.starts_with("lockstep:"),
                    "the owned prefix is kept: {given:?}"
                );
            }
        }
    }

    #[test]
    fn it_never_replaces_or_lifts_what_lockstep_does_not_own() {
        use lockstep_schemas::SlurmBaseState::{Down, Idle};
        use lockstep_schemas::SlurmNodeFlag::{Drain, Fail};
        let own = ReasonOwnership {
            prefix: "lockstep:".to_owned(),
            earlier_prefixes: vec!["ls:".to_owned()],
            slurm_user: None,
        };
        let node =
            |state: SlurmBaseState, flags: &[SlurmNodeFlag], reason: Option<&str>| SlurmNode {
                name: "n1".into(),
                state,
                flags: flags.to_vec(),
                reason: reason.map(str::to_owned),
                reason_user: reason.map(|_| "root".to_owned()),
                features: vec![],
                topology: None,
                partitions: vec![],
                version: 0,
            };
        const MINE: &str = "lockstep: cordoned";
        let declined = |h: &str| Some(Applied::Declined(h.to_owned()));
        let write = None;
        let done = Some(Applied::AlreadyDone);
        // (action, node as read, what the actuator does; None: writes)
        let rows: Vec<(StateChange<'_>, SlurmNode, Option<Applied>)> = vec![
            (
                StateChange::Drain(MINE),
                node(Idle, &[], None),
                write.clone(),
            ),
            (
                StateChange::Drain(MINE),
                node(Idle, &[Drain], Some(MINE)),
                done.clone(),
            ),
            (
                StateChange::Drain(MINE),
                node(Idle, &[Drain], Some("lockstep: old")),
                write.clone(),
            ),
            (
                StateChange::Drain(MINE),
                node(Idle, &[Drain], Some("ls: earlier")),
                write.clone(),
            ),
            (
                StateChange::Drain(MINE),
                node(Idle, &[Drain], Some("NVSwitch RMA")),
                declined("IDLE+DRAIN by root: NVSwitch RMA"),
            ),
            // slurmctld's own DOWN holds nothing: the drain keeps the
            // node out once slurmd answers again.
            (
                StateChange::Drain(MINE),
                node(
                    Down,
                    &[SlurmNodeFlag::NotResponding],
                    Some("Not responding"),
                ),
                write.clone(),
            ),
            (
                StateChange::Drain(MINE),
                node(Idle, &[Fail], Some("bad dimm")),
                declined("IDLE+FAIL by root: bad dimm"),
            ),
            (
                StateChange::Drain(MINE),
                node(Down, &[], Some("lockstep: x : Not responding")),
                write.clone(),
            ),
            (
                StateChange::Drain(MINE),
                node(Down, &[], Some("slurm-operator: Pod is terminating")),
                declined("DOWN by root: slurm-operator: Pod is terminating"),
            ),
            (
                StateChange::Down(MINE),
                node(Idle, &[Drain], Some(MINE)),
                write.clone(),
            ),
            (
                StateChange::Down(MINE),
                node(Down, &[], Some(MINE)),
                done.clone(),
            ),
            (
                StateChange::Down(MINE),
                node(Idle, &[Drain], Some("NVSwitch RMA")),
                declined("IDLE+DRAIN by root: NVSwitch RMA"),
            ),
            (StateChange::Resume, node(Idle, &[], None), done.clone()),
            (
                StateChange::Resume,
                node(Idle, &[], Some("resumed")),
                done.clone(),
            ),
            (
                StateChange::Resume,
                node(Idle, &[Drain], Some(MINE)),
                write.clone(),
            ),
            (
                StateChange::Resume,
                node(Down, &[], Some(MINE)),
                write.clone(),
            ),
            (
                StateChange::Resume,
                node(Idle, &[Drain], Some("ls: earlier")),
                write.clone(),
            ),
            (
                StateChange::Resume,
                node(Idle, &[Drain], Some("NVSwitch RMA")),
                declined("IDLE+DRAIN by root: NVSwitch RMA"),
            ),
            (
                StateChange::Resume,
                node(Down, &[], Some("lockstep: x : Not responding")),
                declined("DOWN by root: lockstep: x : Not responding"),
            ),
            (
                StateChange::Resume,
                node(
                    Down,
                    &[SlurmNodeFlag::NotResponding],
                    Some("Not responding"),
                ),
                declined("DOWN+NOT_RESPONDING by root: Not responding"),
            ),
        ];
        for (change, n, want) in rows {
            assert_eq!(
                change.decide(&n, &own.borrow()),
                want,
                "{change:?} on {n:?}"
            );
        }
        // With `drain.slurm_user`, who set the reason decides, not its text.
        let by_user = ReasonOwnership {
            slurm_user: Some("lockstep".to_owned()),
            ..own.clone()
        };
        let mine_by_root = node(Idle, &[Drain], Some(MINE));
        assert_eq!(
            StateChange::Resume.decide(&mine_by_root, &by_user.borrow()),
            declined("IDLE+DRAIN by root: lockstep: cordoned")
        );
        // A resume of a drain lifts the drain alone; one of lockstep's DOWN
        // (or FAIL) lifts that too.
        for (n, state) in [
            (node(Idle, &[Drain], Some(MINE)), "UNDRAIN"),
            (node(Down, &[], Some(MINE)), "RESUME"),
            (node(Down, &[Drain], Some(MINE)), "RESUME"),
            (node(Idle, &[Fail], Some(MINE)), "RESUME"),
        ] {
            let want = Write::State {
                state,
                reason: None,
            };
            assert_eq!(StateChange::Resume.write(&n), want, "{n:?}");
        }
    }

    #[test]
    fn an_actuator_needs_a_way_to_slurm() {
        let (_, ownership) = watch::channel(ReasonOwnership::default());
        assert!(Actuator::new(None, None, ownership, ActuatorConfig::default()).is_err());
    }
}
