//! The Slurm observer: polls slurmrestd (or scontrol), diffs against its last
//! snapshot and emits one event per changed object.
//!
//! Its lifecycle is a value, like kube-runtime's `watcher`: a private
//! [`State`] and a `step` that polls once and returns the events and the next
//! state. Full listings are part of the event vocabulary: the first one, and
//! one every `resync_every_polls` polls, is bracketed by
//! `SyncStarted { domain }` .. `SyncDone { domain }` and lists every object
//! (objects not listed are gone). Between them only changes are emitted, with
//! `*Gone` events for objects that left; an unchanged object emits nothing,
//! also after slurmctld or slurmrestd restarts.
//!
//! Failures back off exponentially (bounded); after `lost_after_failures`
//! consecutive failures the observer reports
//! `ConnectorStatus { connector: Slurm, visible: false }`. The first poll
//! that sees Slurm again reports `visible: true` and then lists every
//! domain in full, each bracketed by `SyncStarted` .. `SyncDone`: the
//! reducer gets a complete fresh view, and objects that left during the
//! blackout are gone by absence from it. A poll that fails part way while
//! Slurm is lost reports nothing (the next one lists everything again). A
//! failed listing is never taken as "everything is gone".
//!
//! [`Observer::run`] polls the nodes in a lane of their own, beside the
//! jobs and partitions, so that a long job listing never delays what the
//! nodes show; the two lanes share one sight of Slurm (see there).
//! [`Observer::poll`] polls all three in turn.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockstep_schemas::{Connector, Domain, Event, SlurmJob, SlurmNode, SlurmPartition, Source};
use tokio::sync::{mpsc, Mutex, OwnedMutexGuard};

use super::error::Result;
use super::rest::{Fetch, RestClient};
use super::scontrol::Scontrol;
use super::session::NodeSession;
use crate::backoff::Backoff;
use crate::clock::{now_ms, now_s};
use crate::diff::{Known, Observed};
use crate::observation::Observation;

/// Where the observer reads Slurm from.
#[derive(Debug, Clone)]
pub enum Backend {
    /// slurmrestd: polls with `update_time`, so an unchanged poll is cheap.
    Rest(RestClient),
    /// scontrol: for sites without slurmrestd. Nodes are listed through one
    /// long-lived scontrol ([`NodeSession`]), which asks slurmctld only for
    /// a listing newer than its last; jobs and partitions by a new scontrol
    /// each poll, every poll a full listing (diffed, so it still emits only
    /// changes).
    Scontrol(Scontrol),
    /// Nodes listed through scontrol at every poll (one long-lived scontrol,
    /// [`NodeSession`]), jobs and partitions through slurmrestd: for large
    /// clusters, where slurmrestd takes seconds to write 10,000 nodes as
    /// JSON that slurmctld lists in milliseconds and scontrol prints in a
    /// few tens.
    NodesThroughScontrol(RestClient, Scontrol),
}

enum Items {
    Nodes(Vec<SlurmNode>),
    Jobs(Vec<SlurmJob>),
    Partitions(Vec<SlurmPartition>),
}

impl Backend {
    /// One domain's listing; `since_s` as the last listing's `update_time`
    /// (`None`: every object). Node listings through scontrol go through
    /// `node_session`, started here when there is none.
    async fn fetch(
        &self,
        domain: Domain,
        since_s: Option<u64>,
        node_session: &mut Option<NodeSession>,
    ) -> Result<Fetch<Items>> {
        match (self, domain) {
            (Self::Scontrol(s) | Self::NodesThroughScontrol(_, s), Domain::SlurmNodes) => {
                let session = node_session.get_or_insert_with(|| NodeSession::new(s.clone()));
                Ok(map(session.nodes(since_s.is_some()).await?, Items::Nodes))
            }
            (Self::Rest(c) | Self::NodesThroughScontrol(c, _), _) => {
                rest_fetch(c, domain, since_s).await
            }
            (Self::Scontrol(s), Domain::SlurmJobs) => {
                Ok(Fetch::Changed(Items::Jobs(s.jobs().await?)))
            }
            (Self::Scontrol(s), _) => Ok(Fetch::Changed(Items::Partitions(s.partitions().await?))),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Rest(_) => "slurmrestd",
            Self::Scontrol(_) => "scontrol",
            Self::NodesThroughScontrol(..) => "slurmrestd, nodes through scontrol",
        }
    }
}

async fn rest_fetch(c: &RestClient, domain: Domain, since_s: Option<u64>) -> Result<Fetch<Items>> {
    Ok(match domain {
        Domain::SlurmNodes => map(c.nodes(since_s).await?, |l| Items::Nodes(l.items)),
        Domain::SlurmJobs => map(c.jobs(since_s).await?, |l| Items::Jobs(l.items)),
        _ => map(c.partitions(since_s).await?, |l| Items::Partitions(l.items)),
    })
}

fn map<T, U>(f: Fetch<T>, g: impl FnOnce(T) -> U) -> Fetch<U> {
    match f {
        Fetch::Unchanged => Fetch::Unchanged,
        Fetch::Changed(t) => Fetch::Changed(g(t)),
    }
}

/// Bounds and rhythm of the observer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObserverConfig {
    /// Time between the starts of two polls while Slurm answers (of each
    /// lane, in [`Observer::run`]): what lockstep sees of the nodes lags
    /// Slurm by at most this and one node listing. After a poll
    /// that took longer than half of it, the next waits half of it from
    /// that poll's end, so a slow Slurm is never polled back to back.
    pub poll_interval_ms: u64,
    /// The same for the lane of jobs and partitions in [`Observer::run`]
    /// (`None`: `poll_interval_ms`). Longer spares slurmrestd the listing of
    /// a long queue that changes all the time; the nodes are not delayed.
    pub jobs_poll_interval_ms: Option<u64>,
    /// Every this many polls, a full listing of every object (bracketed by
    /// `SyncStarted` .. `SyncDone`) instead of a diff. 0: only the first.
    pub resync_every_polls: u32,
    /// First pause after a failed poll.
    pub backoff_initial_ms: u64,
    /// Upper bound of the pause after failures (it doubles per failure).
    pub backoff_max_ms: u64,
    /// Consecutive failed polls after which the observer reports that it
    /// lost sight of Slurm.
    pub lost_after_failures: u32,
    /// `update_time` is sent this many seconds before the start of the last
    /// poll that returned data. slurmctld reports a change when its last
    /// change time (whole seconds) is at or after `update_time`, so 0 is
    /// exact on one clock; the margin absorbs that much clock skew between
    /// lockstep and slurmctld, at the price of fetching a change twice.
    pub update_time_margin_s: u64,
    /// Poll slurmrestd with `update_time` (HTTP 304 when nothing changed).
    /// Off: every poll is a full GET, diffed as well.
    pub use_update_time: bool,
}

/// What the last poll did, per domain (nodes, jobs, partitions), for
/// telemetry and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollStats {
    /// Domains whose answer was "unchanged" (HTTP 304).
    pub unchanged: u8,
    /// Domains fetched in full (and diffed or listed).
    pub fetched: u8,
    /// The poll failed (the remaining domains were not polled).
    pub failed: bool,
    /// Events the poll produced.
    pub events: usize,
}

impl Default for ObserverConfig {
    fn default() -> Self {
        Self {
            poll_interval_ms: 1_000,
            jobs_poll_interval_ms: None,
            resync_every_polls: 600,
            backoff_initial_ms: 500,
            backoff_max_ms: 30_000,
            lost_after_failures: 2,
            update_time_margin_s: 1,
            use_update_time: true,
        }
    }
}

/// Where the observer is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Nothing listed yet; visibility not announced.
    Starting {
        /// Consecutive failed polls.
        failures: u32,
    },
    /// Sees Slurm.
    Seeing {
        /// Polls since the last full listing.
        polls_since_resync: u32,
        /// Consecutive failed polls (fewer than `lost_after_failures`).
        failures: u32,
    },
    /// Lost sight of Slurm (`ConnectorStatus { visible: false }` sent).
    Lost {
        /// Consecutive failed polls.
        failures: u32,
    },
}

/// Every domain, in the order one observer polls them.
const ALL: [Domain; 3] = [
    Domain::SlurmNodes,
    Domain::SlurmJobs,
    Domain::SlurmPartitions,
];
/// The node lane's domain.
const NODES: [Domain; 1] = [Domain::SlurmNodes];
/// The other lane's domains.
const JOBS_AND_PARTITIONS: [Domain; 2] = [Domain::SlurmJobs, Domain::SlurmPartitions];

/// What the reducer was last told about Slurm, shared by an observer's lanes.
#[derive(Debug, Default)]
struct Sight {
    /// The last `ConnectorStatus` sent: `None` before the first.
    announced: Option<bool>,
    /// Counts the `visible: true` sent. The reducer trusts Slurm again once
    /// every domain was listed in full after one; a lane whose last full
    /// listing is older lists again.
    epoch: u64,
}

/// One domain's answer, before it is diffed.
struct Fetched {
    domain: Domain,
    /// A full listing (`SyncStarted` .. `SyncDone`).
    all: bool,
    started_s: u64,
    observed_ms: u64,
    items: Items,
}

/// How one domain is polled in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every object, bracketed by `SyncStarted` .. `SyncDone`.
    Sync,
    /// Only changes (and `*Gone`), polled with `update_time` when known.
    Diff { since_s: Option<u64> },
}

/// A Slurm observation that holds its own key and takes the poll's
/// generation as its version.
trait Keyed: Observed {
    type Ref: ?Sized + Eq + Hash + ToOwned<Owned = Self::Key>;
    fn key_ref(&self) -> &Self::Ref;
    fn set_version(&mut self, version: u64);
}

impl Keyed for SlurmNode {
    type Ref = str;
    fn key_ref(&self) -> &str {
        &self.name
    }
    fn set_version(&mut self, version: u64) {
        self.version = version;
    }
}

impl Keyed for SlurmJob {
    type Ref = u64;
    fn key_ref(&self) -> &u64 {
        &self.job_id
    }
    fn set_version(&mut self, version: u64) {
        self.version = version;
    }
}

impl Keyed for SlurmPartition {
    type Ref = str;
    fn key_ref(&self) -> &str {
        &self.name
    }
    fn set_version(&mut self, version: u64) {
        self.version = version;
    }
}

/// The last listing of one domain, and how to poll it next.
#[derive(Debug)]
struct Snapshot<V: Keyed> {
    objects: Known<V>,
    /// A full listing has been seen.
    listed: bool,
    /// `update_time` for the next poll.
    since_s: Option<u64>,
}

impl<V: Keyed> Default for Snapshot<V> {
    fn default() -> Self {
        Self {
            objects: Known::default(),
            listed: false,
            since_s: None,
        }
    }
}

impl<V: Keyed> Snapshot<V>
where
    V::Key: Borrow<V::Ref>,
{
    /// Replaces the snapshot by `items`, pushing an event per changed (or,
    /// with `all`, per listed) object and a gone event per object that left.
    /// Unchanged objects cost a lookup and a comparison, nothing else. Every
    /// object and every gone event carries `generation`, the poll's version.
    fn apply(
        &mut self,
        items: Vec<V>,
        all: bool,
        (observed_ms, generation): (u64, u64),
        out: &mut Vec<Observation>,
    ) {
        let observed = |event| Observation::new(Source::Slurm, observed_ms, event);
        self.objects.start_listing();
        for mut v in items {
            v.set_version(generation);
            if let Some(event) = self.objects.observe_keyed(v, V::key_ref, all) {
                out.push(observed(event));
            }
        }
        // Slurm has no delete event: the poll that first misses the object
        // dates its deletion.
        for k in self.objects.end_listing() {
            out.push(observed(V::gone(&k, generation)));
        }
        self.listed = true;
    }

    fn sorted(&self) -> Vec<V> {
        let mut v: Vec<(&V::Key, &V)> = self.objects.iter().collect();
        v.sort_by(|a, b| a.0.cmp(b.0));
        v.into_iter().map(|(_, x)| x.clone()).collect()
    }
}

/// Polls Slurm and emits observation events. See the module docs.
#[derive(Debug)]
pub struct Observer {
    backend: Backend,
    config: ObserverConfig,
    /// The domains this observer polls, in this order: all three, or one
    /// lane's (see [`Observer::run`]).
    domains: &'static [Domain],
    state: State,
    /// What Slurm was last told to be, shared by the lanes of one observer.
    sight: Arc<Mutex<Sight>>,
    /// The sight's epoch when this observer last listed all its domains.
    listed_epoch: u64,
    nodes: Snapshot<SlurmNode>,
    jobs: Snapshot<SlurmJob>,
    partitions: Snapshot<SlurmPartition>,
    /// The node listings' scontrol, once started (nodes through scontrol).
    node_session: Option<NodeSession>,
    last_poll: PollStats,
}

/// Last poll generation handed out in this process, shared by every observer
/// so that one started after another (a new leadership term) keeps counting up.
static LAST_GENERATION: AtomicU64 = AtomicU64::new(0);

/// The version of the objects of a poll observed at `observed_ms`: its wall
/// time in ms, but always above the last one (a clock step back, two polls in
/// one ms), so a later poll's observations are never older than an earlier's.
fn next_generation(observed_ms: u64) -> u64 {
    let mut next = 0;
    LAST_GENERATION
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            next = observed_ms.max(last.saturating_add(1));
            Some(next)
        })
        .expect("the update always returns Some");
    next
}

impl Observer {
    /// An observer that has not polled yet.
    pub fn new(backend: Backend, config: ObserverConfig) -> Self {
        Self {
            backend,
            config,
            domains: &ALL,
            state: State::Starting { failures: 0 },
            sight: Arc::default(),
            listed_epoch: 0,
            nodes: Snapshot::default(),
            jobs: Snapshot::default(),
            partitions: Snapshot::default(),
            node_session: None,
            last_poll: PollStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ObserverConfig {
        &self.config
    }

    /// The nodes as last observed, sorted by name.
    pub fn nodes(&self) -> Vec<SlurmNode> {
        self.nodes.sorted()
    }

    /// The jobs as last observed, sorted by id.
    pub fn jobs(&self) -> Vec<SlurmJob> {
        self.jobs.sorted()
    }

    /// The partitions as last observed, sorted by name.
    pub fn partitions(&self) -> Vec<SlurmPartition> {
        self.partitions.sorted()
    }

    /// What the last poll did.
    pub fn last_poll(&self) -> PollStats {
        self.last_poll
    }

    /// Whether the observer currently sees Slurm (it has not reported
    /// losing it).
    pub fn visible(&self) -> bool {
        !matches!(self.state, State::Lost { .. })
    }

    /// How long to wait before the next [`Observer::poll`], counted from
    /// the end of the last one. While Slurm answers that is the interval
    /// less what the poll took (its start and the next are the interval
    /// apart), but at least half the interval; after failures, the back-off.
    pub fn next_delay_after(&self, took: Duration) -> Duration {
        let delay = self.next_delay();
        match self.state {
            State::Seeing { failures: 0, .. } => delay.saturating_sub(took).max(delay / 2),
            _ => delay,
        }
    }

    /// How long to wait after the last [`Observer::poll`] ended if it took
    /// no time: the interval while Slurm answers, else the back-off.
    pub fn next_delay(&self) -> Duration {
        let failures = match self.state {
            State::Starting { failures: 0 } => return Duration::ZERO,
            State::Seeing { failures: 0, .. } => return Duration::from_millis(self.interval_ms()),
            State::Starting { failures }
            | State::Seeing { failures, .. }
            | State::Lost { failures } => failures,
        };
        Backoff::new(self.config.backoff_initial_ms, self.config.backoff_max_ms)
            .delay_after(failures)
    }

    /// This observer's poll interval: the jobs lane's, or the nodes'.
    fn interval_ms(&self) -> u64 {
        match self.config.jobs_poll_interval_ms {
            Some(ms) if !self.domains.contains(&Domain::SlurmNodes) => ms,
            _ => self.config.poll_interval_ms,
        }
    }

    /// Polls once (without waiting first) and returns what was observed.
    pub async fn poll(&mut self) -> Vec<Observation> {
        self.poll_holding_sight().await.1
    }

    /// Polls once; returns what was observed with the sight still locked,
    /// so that it can be delivered before another lane settles a poll.
    async fn poll_holding_sight(&mut self) -> (OwnedMutexGuard<Sight>, Vec<Observation>) {
        self.last_poll = PollStats::default();
        let state = std::mem::replace(&mut self.state, State::Starting { failures: 0 });
        let (state, sight, out) = self.step(state).await;
        self.state = state;
        self.last_poll.events = out.len();
        (sight, out)
    }

    /// Polls until `tx` is closed, sending every observation to it. Never
    /// gives up on Slurm; the channel's bound is the only queue (a slow
    /// consumer delays the next poll).
    ///
    /// Nodes are polled in a lane of their own, beside jobs and partitions:
    /// a drain shows within an interval and a node listing however long the
    /// job listing takes (5 s for a queue of 10,000 jobs through
    /// slurmrestd). Each lane keeps its own rhythm and back-off; they share
    /// what Slurm was last told to be. A lane that loses Slurm says so for
    /// both, and the first that sees it again says so and lists its domains
    /// in full; the other lists its own in full at its next poll, also after
    /// `visible: true`. Every domain's observations reach `tx` in the order
    /// of their versions, as from one lane.
    pub async fn run(self, tx: mpsc::Sender<Observation>) {
        let (nodes, rest) = self.into_lanes();
        tokio::join!(nodes.run_lane(tx.clone()), rest.run_lane(tx));
    }

    /// This observer as two that share its sight: one polling the nodes,
    /// one the jobs and partitions.
    fn into_lanes(self) -> (Self, Self) {
        let jobs = Self {
            backend: self.backend.clone(),
            config: self.config.clone(),
            domains: &JOBS_AND_PARTITIONS,
            state: self.state.clone(),
            sight: Arc::clone(&self.sight),
            listed_epoch: self.listed_epoch,
            nodes: Snapshot::default(),
            jobs: self.jobs,
            partitions: self.partitions,
            node_session: None,
            last_poll: PollStats::default(),
        };
        let nodes = Self {
            domains: &NODES,
            jobs: Snapshot::default(),
            partitions: Snapshot::default(),
            ..self
        };
        (nodes, jobs)
    }

    async fn run_lane(mut self, tx: mpsc::Sender<Observation>) {
        let mut took = Duration::ZERO;
        loop {
            tokio::select! {
                () = tx.closed() => return,
                () = tokio::time::sleep(self.next_delay_after(took)) => {}
            }
            let started = tokio::time::Instant::now();
            let (sight, out) = self.poll_holding_sight().await;
            for o in out {
                if tx.send(o).await.is_err() {
                    return;
                }
            }
            drop(sight);
            took = started.elapsed();
        }
    }

    async fn step(&mut self, state: State) -> (State, OwnedMutexGuard<Sight>, Vec<Observation>) {
        let lost_after = self.config.lost_after_failures.max(1);
        let epoch = self.sight.lock().await.epoch;
        let modes = match &state {
            State::Starting { .. } => self.modes(true),
            State::Seeing {
                polls_since_resync, ..
            } => {
                // Sight came back through the other lane since this one
                // listed everything: the reducer waits for its listing too.
                let resync = self.listed_epoch != epoch
                    || self.config.resync_every_polls > 0
                        && polls_since_resync.saturating_add(1) >= self.config.resync_every_polls;
                self.modes(resync)
            }
            State::Lost { .. } => {
                // slurmrestd may have come back with other versions.
                if let Backend::Rest(c) | Backend::NodesThroughScontrol(c, _) = &self.backend {
                    c.forget_version();
                }
                // What happened in the blackout is unknown (`update_time`
                // may predate it, deletions left no trace): list it all.
                self.modes(true)
            }
        };
        let mut fetched = Vec::with_capacity(modes.len());
        let result = self.fetch_domains(&modes, &mut fetched).await;
        self.last_poll.failed = result.is_err();
        // Diffed under the lock, so that versions follow the order in which
        // the lanes deliver.
        let mut sight = Arc::clone(&self.sight).lock_owned().await;
        let mut events = Vec::new();
        for f in fetched {
            self.take(f, &mut events);
        }
        let mut out = Vec::new();
        let state = match (state, result) {
            (State::Starting { .. } | State::Lost { .. }, Ok(())) => {
                tracing::info!(
                    backend = self.backend.name(),
                    domains = ?self.domains,
                    "slurm observer sees slurm"
                );
                // First what the reducer should know before the objects:
                // that it may trust them again.
                if sight.announced != Some(true) {
                    sight.announced = Some(true);
                    sight.epoch += 1;
                    out.push(Observation::new(
                        Source::Slurm,
                        now_ms(),
                        status(true, String::new()),
                    ));
                }
                self.listed_epoch = sight.epoch;
                out.append(&mut events);
                State::Seeing {
                    polls_since_resync: 0,
                    failures: 0,
                }
            }
            (
                State::Seeing {
                    polls_since_resync, ..
                },
                Ok(()),
            ) => {
                out.append(&mut events);
                let synced = modes.iter().all(|(_, m)| *m == Mode::Sync);
                if synced {
                    self.listed_epoch = sight.epoch;
                }
                State::Seeing {
                    polls_since_resync: if synced {
                        0
                    } else {
                        polls_since_resync.saturating_add(1)
                    },
                    failures: 0,
                }
            }
            (state, Err(e)) => {
                // Domains that were polled before the failure are valid,
                // except while Slurm is lost: the poll that regains it lists
                // every domain after `visible: true`, and nothing comes
                // before that.
                if !matches!(state, State::Lost { .. }) {
                    out.append(&mut events);
                }
                let (failures, polls, lost) = match state {
                    State::Starting { failures } => (failures.saturating_add(1), 0, false),
                    State::Seeing {
                        polls_since_resync,
                        failures,
                    } => (failures.saturating_add(1), polls_since_resync, false),
                    State::Lost { failures } => (failures.saturating_add(1), 0, true),
                };
                tracing::warn!(
                    backend = self.backend.name(),
                    domains = ?self.domains,
                    failures,
                    retryable = e.retryable(),
                    error = %e,
                    "slurm poll failed"
                );
                if lost {
                    State::Lost { failures }
                } else if failures >= lost_after {
                    // Said once, whichever lane lost it first.
                    if sight.announced != Some(false) {
                        sight.announced = Some(false);
                        out.push(Observation::new(
                            Source::Slurm,
                            now_ms(),
                            status(false, e.to_string()),
                        ));
                    }
                    State::Lost { failures }
                } else if polls == 0 && !self.all_listed() {
                    State::Starting { failures }
                } else {
                    State::Seeing {
                        polls_since_resync: polls,
                        failures,
                    }
                }
            }
        };
        (state, sight, out)
    }

    fn all_listed(&self) -> bool {
        self.domains.iter().all(|d| match d {
            Domain::SlurmNodes => self.nodes.listed,
            Domain::SlurmJobs => self.jobs.listed,
            _ => self.partitions.listed,
        })
    }

    /// The mode of each of this observer's domains: a full listing when
    /// asked or never listed, else a diff.
    fn modes(&self, resync: bool) -> Vec<(Domain, Mode)> {
        let m = |listed: bool, since_s: Option<u64>| {
            if resync || !listed {
                Mode::Sync
            } else {
                Mode::Diff { since_s }
            }
        };
        self.domains
            .iter()
            .map(|&d| {
                let mode = match d {
                    Domain::SlurmNodes => m(self.nodes.listed, self.nodes.since_s),
                    Domain::SlurmJobs => m(self.jobs.listed, self.jobs.since_s),
                    _ => m(self.partitions.listed, self.partitions.since_s),
                };
                (d, mode)
            })
            .collect()
    }

    /// Reads the domains in turn until one fails.
    async fn fetch_domains(
        &mut self,
        modes: &[(Domain, Mode)],
        out: &mut Vec<Fetched>,
    ) -> Result<()> {
        for &(domain, mode) in modes {
            let since_s = match mode {
                Mode::Diff { since_s } if self.config.use_update_time => since_s,
                _ => None,
            };
            let started_s = now_s();
            let fetch = self
                .backend
                .fetch(domain, since_s, &mut self.node_session)
                .await?;
            let observed_ms = now_ms();
            match fetch {
                Fetch::Unchanged => self.last_poll.unchanged += 1,
                Fetch::Changed(items) => {
                    self.last_poll.fetched += 1;
                    out.push(Fetched {
                        domain,
                        all: mode == Mode::Sync,
                        started_s,
                        observed_ms,
                        items,
                    });
                }
            }
        }
        Ok(())
    }

    /// Diffs one domain's listing against its snapshot into events.
    fn take(&mut self, f: Fetched, out: &mut Vec<Observation>) {
        let Fetched {
            domain,
            all,
            started_s,
            observed_ms,
            items,
        } = f;
        let stamp = (observed_ms, next_generation(observed_ms));
        if all {
            out.push(Observation::new(
                Source::Slurm,
                observed_ms,
                Event::SyncStarted { domain },
            ));
        }
        let since_next = Some(started_s.saturating_sub(self.config.update_time_margin_s));
        match items {
            Items::Nodes(v) => {
                self.nodes.apply(v, all, stamp, out);
                self.nodes.since_s = since_next;
            }
            Items::Jobs(v) => {
                self.jobs.apply(v, all, stamp, out);
                self.jobs.since_s = since_next;
            }
            Items::Partitions(v) => {
                self.partitions.apply(v, all, stamp, out);
                self.partitions.since_s = since_next;
            }
        }
        if all {
            out.push(Observation::new(
                Source::Slurm,
                observed_ms,
                Event::SyncDone { domain },
            ));
        }
    }
}

fn status(visible: bool, detail: String) -> Event {
    Event::ConnectorStatus {
        connector: Connector::Slurm,
        visible,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_schemas::SlurmBaseState;

    fn node(name: &str, state: SlurmBaseState) -> SlurmNode {
        SlurmNode {
            name: name.into(),
            state,
            flags: vec![],
            reason: None,
            reason_user: None,
            features: vec![],
            topology: None,
            partitions: vec!["batch".into()],
            version: 0,
        }
    }

    #[test]
    fn diffs_emit_changes_and_gone_only() {
        let mut s = Snapshot::<SlurmNode>::default();
        let mut out = Vec::new();
        s.apply(
            vec![
                node("a", SlurmBaseState::Idle),
                node("b", SlurmBaseState::Idle),
            ],
            true,
            (1, 1),
            &mut out,
        );
        assert_eq!(out.len(), 2);
        out.clear();
        // Same again: nothing.
        s.apply(
            vec![
                node("a", SlurmBaseState::Idle),
                node("b", SlurmBaseState::Idle),
            ],
            false,
            (2, 2),
            &mut out,
        );
        assert!(out.is_empty());
        // b changes, a leaves, c arrives.
        s.apply(
            vec![
                node("b", SlurmBaseState::Mixed),
                node("c", SlurmBaseState::Idle),
            ],
            false,
            (3, 3),
            &mut out,
        );
        let kinds: Vec<String> = out.iter().map(|o| o.event.summary()).collect();
        assert_eq!(
            kinds,
            [
                "slurm node b MIXED (v3)",
                "slurm node c IDLE (v3)",
                "slurm node a gone (v3)"
            ]
        );
        assert!(out.iter().all(|o| o.event.version() == 3));
    }

    #[test]
    fn generations_only_go_up() {
        let a = next_generation(5_000);
        // The clock stepped back: still above the last one.
        let b = next_generation(1_000);
        assert!(b > a, "{b} after {a}");
        let c = next_generation(b + 10_000);
        assert_eq!(c, b + 10_000);
    }

    #[test]
    fn backoff_is_bounded() {
        let mut o = Observer::new(
            Backend::Scontrol(Scontrol::new(Default::default())),
            ObserverConfig::default(),
        );
        assert_eq!(o.next_delay(), Duration::ZERO);
        o.state = State::Seeing {
            polls_since_resync: 3,
            failures: 0,
        };
        assert_eq!(o.next_delay(), Duration::from_millis(1_000));
        o.state = State::Lost { failures: 1 };
        assert_eq!(
            o.next_delay_after(Duration::from_millis(300)),
            Duration::from_millis(500),
            "a back-off counts from the failed poll's end"
        );
        assert_eq!(o.next_delay(), Duration::from_millis(500));
        o.state = State::Lost { failures: 4 };
        assert_eq!(o.next_delay(), Duration::from_millis(4_000));
        o.state = State::Lost { failures: 400 };
        assert_eq!(o.next_delay(), Duration::from_millis(30_000));
    }

    #[test]
    fn polls_start_an_interval_apart_with_half_of_it_between() {
        let mut o = Observer::new(
            Backend::Scontrol(Scontrol::new(Default::default())),
            ObserverConfig {
                poll_interval_ms: 400,
                ..ObserverConfig::default()
            },
        );
        // The first poll at once, however long nothing took.
        assert_eq!(o.next_delay_after(Duration::from_secs(9)), Duration::ZERO);
        o.state = State::Seeing {
            polls_since_resync: 1,
            failures: 0,
        };
        let after = |ms| o.next_delay_after(Duration::from_millis(ms));
        assert_eq!(after(0), Duration::from_millis(400));
        assert_eq!(after(120), Duration::from_millis(280));
        assert_eq!(after(200), Duration::from_millis(200));
        // A slow poll: half the interval between it and the next.
        assert_eq!(after(350), Duration::from_millis(200));
        assert_eq!(after(3_000), Duration::from_millis(200));
    }

    #[test]
    fn the_jobs_lane_keeps_its_own_interval() {
        let seeing = State::Seeing {
            polls_since_resync: 1,
            failures: 0,
        };
        let lanes = |jobs_poll_interval_ms| {
            let mut o = Observer::new(
                Backend::Scontrol(Scontrol::new(Default::default())),
                ObserverConfig {
                    poll_interval_ms: 350,
                    jobs_poll_interval_ms,
                    ..ObserverConfig::default()
                },
            );
            o.state = seeing.clone();
            let (nodes, jobs) = o.into_lanes();
            (nodes.next_delay(), jobs.next_delay())
        };
        let ms = Duration::from_millis;
        assert_eq!(lanes(None), (ms(350), ms(350)));
        assert_eq!(lanes(Some(5_000)), (ms(350), ms(5_000)));
        // `poll` lists every domain, at the nodes' interval.
        let mut all = Observer::new(
            Backend::Scontrol(Scontrol::new(Default::default())),
            ObserverConfig {
                poll_interval_ms: 350,
                jobs_poll_interval_ms: Some(5_000),
                ..ObserverConfig::default()
            },
        );
        all.state = seeing;
        assert_eq!(all.next_delay(), ms(350));
    }
}
