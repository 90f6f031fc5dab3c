//! `lockstep run`: consume the log, apply in batches, commit, then act.
//!
//! Persist first, then act (restate's partition processor): each batch's
//! ledger entries and audit rows are committed in one store transaction and
//! flushed before its actions are published; when a checkpoint is due, it
//! is written after that commit, streamed to its own file. After a crash
//! the service restarts from the last checkpoint and re-applies the log
//! after it (the same records give the same action ids, and committing
//! them again changes nothing).
//!
//! Who acts: every instance folds the log; only the acting one (the holder
//! of the leader Lease, once caught up with the log; every instance when
//! leader election is off) observes, publishes and carries out actions.
//! That is its `Role`: a follower competes for the Lease, a candidate
//! holds it and catches up, a leader acts, with everything it runs for that
//! in one `JoinSet` that stops with the leadership (`acting`). A leader
//! that loses the Lease (its renewals failed for the renew deadline: an API
//! server that stalls, a network cut) stops that `JoinSet` and is a follower
//! again, in the same process: no restart, and no restart back-off of its
//! supervisor, before it may lead again.
//! When it starts acting it publishes what the reducer issued that was
//! never published (a batch committed just before a crash, the last moments
//! of a previous leader) and carries out those still in flight, off the
//! apply loop: the actions of the batches applied meanwhile queue behind
//! them, in issue order. An action
//! is carried out only by the instance
//! whose publication put it on the action stream first (JetStream
//! deduplicates by action id), so no action id is executed twice, whoever
//! crashed or took over; one that was published but lost with its
//! publisher gets no outcome, and the reducer retries it after
//! `actions.timeout_s` of log time under a new id.
//!
//! The policy reaches the connectors as it reaches the engine: from the
//! log's `PolicyChanged` records. When one is applied, the Kubernetes
//! watches whose parameters it changes restart under it.
//!
//! This loop owns the engine. It never decides anything itself.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use lockstep_connectors::backoff::Backoff;
use lockstep_connectors::clock::now_ms;
use lockstep_connectors::kube::Leadership;
use lockstep_engine::{Engine, Output};
use lockstep_schemas::EventRecord;
use lockstep_store::{EventLog, LogState, Store};
use tokio::sync::mpsc;
use tracing::{error, info};

use crate::config::{Config, LeaderElectionConfig};
use crate::telemetry::{self, Health};

mod acting;
mod apply;
mod connectors;
mod continuity;
mod dispatch;
mod open;

use acting::{Acting, Quiet};
pub use open::{bootstrap, restore, LOCK_WAIT};

/// Runs until `shutdown` resolves; then finishes the batch, commits a final
/// checkpoint and returns.
///
/// Every instance folds the log into its own store. Only the acting one,
/// the leader once it has caught up with the log (every instance, without
/// leader election), observes, dispatches and carries out actions. An
/// instance that loses the leader Lease stops acting, goes on folding the
/// log and competes for the Lease again.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<()> {
    let health = Arc::new(Health::default());
    // `/why` questions, answered by the apply loop, which owns the engine.
    let (queries_tx, mut queries) = mpsc::channel(telemetry::QUERIES_WAITING_MAX);
    if let Some(addr) = cfg.telemetry.listen {
        let handle = telemetry::install_metrics()?;
        let health = health.clone();
        tokio::spawn(async move {
            if let Err(e) = telemetry::serve(addr, handle, health, queries_tx).await {
                error!(error = format!("{e:#}"), "telemetry endpoint failed");
            }
        });
    }
    let store = crate::storage::open_store(&cfg, LOCK_WAIT)?;
    tokio::pin!(shutdown);
    let Some(log) = open::open_log_when_available(&cfg, &health, &mut shutdown).await? else {
        return Ok(());
    };
    bootstrap(&store, &log).await?;
    let mut service = Service::start(cfg, store, log, health.clone()).await?;
    let stop = service.run_until(&mut shutdown, &mut queries).await?;
    service.stop().await?;
    match stop {
        Stop::Shutdown => Ok(()),
        Stop::Broken(b) => {
            // Not an exit: a restart would meet the same log. It stays up,
            // acting on nothing, and says why until it is told to stop.
            telemetry::LogBroken {
                reason: b.reason(),
                detail: &b,
            }
            .emit(&health);
            shutdown.await;
            Ok(())
        }
    }
}

/// Where this instance stands in the leader election.
enum Role {
    /// Folds the log and competes for the leader Lease; observes nothing,
    /// carries out nothing.
    Follower,
    /// Holds the Lease (or needs none: no leader election) and catches up
    /// with the log before it acts.
    Candidate,
    /// Caught up and leading: observes, dispatches and carries out actions,
    /// with everything it runs for that in [`Acting`].
    Leader(Acting),
}

impl Role {
    fn acting(&self) -> Option<&Acting> {
        match self {
            Self::Leader(a) => Some(a),
            Self::Follower | Self::Candidate => None,
        }
    }

    fn acting_mut(&mut self) -> Option<&mut Acting> {
        match self {
            Self::Leader(a) => Some(a),
            Self::Follower | Self::Candidate => None,
        }
    }
}

/// Why the apply loop stopped.
enum Stop {
    /// Asked to.
    Shutdown,
    /// The log no longer continues what the store applied
    /// ([`continuity`]): stop acting and folding until an operator
    /// recovers.
    Broken(continuity::Break),
}

/// The apply loop: the engine, what it folds and where it commits, and the
/// role this instance plays.
struct Service {
    cfg: Config,
    store: Store,
    log: EventLog,
    engine: Engine,
    /// The next sequence to apply.
    next: u64,
    role: Role,
    /// `None` without leader election.
    leadership: Option<Leadership>,
    health: Arc<Health>,
    /// The output of the last batch.
    out: Output,
    sync: telemetry::SyncMetrics,
    /// Records applied since the last checkpoint, and when it was taken.
    since_checkpoint: (u64, Instant),
    /// The checkpoint being written off the loop, from a frozen copy of
    /// the engine ([`apply`]).
    checkpointing: Option<tokio::task::JoinHandle<Result<apply::Written>>>,
    /// A look at the log's state asked off the loop, and the sequence
    /// applied when it was asked ([`Self::look_at_head_off_loop`]).
    looking: Option<(u64, tokio::task::JoinHandle<Option<LogState>>)>,
    quiet: Quiet,
    /// The id of the log the store folds ([`continuity`]).
    log_id: String,
    /// Found that the log does not continue what was applied.
    broken: Option<continuity::Break>,
    /// The snapshots this instance keeps beside the log while it leads.
    snapshots: Snapshots,
}

/// When the leader last kept a snapshot beside the log.
#[derive(Debug, Default)]
struct Snapshots {
    /// `None`: none since it leads; one is kept at the next checkpoint.
    last: Option<Instant>,
    /// Records applied since.
    records_since: u64,
    /// The log's bytes per record, as its state last said (0: unknown).
    record_bytes: u64,
    /// When the retention horizon was last applied, and the task applying
    /// it (off the loop) while it runs.
    retention: Option<(Instant, tokio::task::JoinHandle<()>)>,
    /// The snapshot being kept beside the log (off the loop): what it is,
    /// and then how long keeping it took and how that went.
    keeping: Option<tokio::task::JoinHandle<Kept>>,
}

/// A snapshot kept beside the log, how long that took, and whether it was.
type Kept = (
    lockstep_store::snapshots::SnapshotInfo,
    Duration,
    lockstep_store::log::Result<()>,
);

impl Service {
    /// Restores the engine from the store and, with leader election, starts
    /// competing for the Lease.
    async fn start(cfg: Config, store: Store, log: EventLog, health: Arc<Health>) -> Result<Self> {
        let (engine, next) = restore(&store)?;
        let state = log.state().await.context("reading the event log's state")?;
        let position = store.log_position().context("reading the store")?;
        let broken = continuity::at_start(&log, position.as_ref(), &state)
            .await
            .context("comparing the store with the event log")?;
        let log_id = position.map_or(state.id, |p| p.log_id);
        health.checkpoint_seq.store(next - 1, Ordering::Relaxed);
        health.applied_seq.store(next - 1, Ordering::Relaxed);
        let leadership = match &cfg.leader_election {
            Some(le) => Some(start_leadership(&cfg, le).await?),
            None => None,
        };
        let role = match leadership {
            Some(_) => Role::Follower,
            None => Role::Candidate,
        };
        telemetry::record_leader(false);
        let quiet = Quiet {
            last_activity_ms: Arc::new(AtomicU64::new(now_ms())),
            next_wake_ms: Arc::new(AtomicU64::new(engine.next_wake_ms().unwrap_or(u64::MAX))),
        };
        Ok(Self {
            cfg,
            store,
            log,
            engine,
            next,
            role,
            leadership,
            health,
            out: Output::default(),
            sync: telemetry::SyncMetrics::default(),
            since_checkpoint: (0, Instant::now()),
            checkpointing: None,
            looking: None,
            quiet,
            log_id,
            broken,
            snapshots: Snapshots::default(),
        })
    }

    /// Reads, applies, commits and acts until `shutdown` resolves or the
    /// log breaks.
    async fn run_until(
        &mut self,
        shutdown: &mut Pin<&mut impl Future<Output = ()>>,
        queries: &mut mpsc::Receiver<telemetry::Query>,
    ) -> Result<Stop> {
        let read_wait = Duration::from_millis(self.cfg.service.read_wait_ms);
        let mut backoff = Backoff::new(100, self.cfg.service.retry_backoff_max_ms);
        loop {
            if let Some(b) = self.broken.take() {
                return Ok(Stop::Broken(b));
            }
            let batch = tokio::select! {
                biased;
                _ = shutdown.as_mut() => return Ok(Stop::Shutdown),
                now_leader = leadership_changed(&mut self.leadership) => {
                    if now_leader {
                        info!(applied_seq = self.next - 1, "leading; acting once caught up with the log");
                        if matches!(self.role, Role::Follower) {
                            self.role = Role::Candidate;
                        }
                        continue;
                    }
                    // That leadership ends for good (its elector stops):
                    // stop acting, so that only the next leader acts, then
                    // compete again as a follower.
                    error!(acting = self.role.acting().is_some(), "lost the leader lease; stepping down so that only the next leader acts");
                    self.step_down().await?;
                    continue;
                }
                batch = self.log.read(self.next, self.cfg.service.batch_max, read_wait) => batch,
            };
            let batch = match batch {
                Ok(b) => {
                    backoff.reset();
                    self.continuing(b).await
                }
                Err(e) => {
                    let retry_in = backoff.failed();
                    telemetry::LogUnavailable {
                        what: "read",
                        error: &e,
                        retry_in,
                    }
                    .emit();
                    tokio::time::sleep(retry_in).await;
                    continue;
                }
            };
            if !batch.is_empty() {
                self.apply_and_act(&batch).await?;
            } else if let Some(acting) = self.role.acting_mut() {
                acting.behind_ended().await?;
            }
            if self.sync.stats_due() {
                // Also while busy: the lag must be current when it is large.
                self.look_at_head_off_loop();
                self.sync.begin_stats(&self.engine);
                self.snapshot_if_due().await?;
                self.retention_if_due();
            }
            self.sync
                .count_stats(&self.engine, &self.health, batch.is_empty());
            self.head_looked().await;
            telemetry::answer_queries(queries, &self.engine, &self.store);
            self.lead_once_caught_up(&batch).await?;
        }
    }

    /// Applies and commits a batch, then acts on it: persist first, then
    /// act. A batch whose records issue many actions (thousands of timeouts
    /// ending together) is applied, committed and acted on in parts
    /// ([`apply::ACTIONS_PER_COMMIT`]), so that one pass of the loop does
    /// not grow with it.
    async fn apply_and_act(&mut self, mut batch: &[EventRecord]) -> Result<()> {
        while !batch.is_empty() {
            let used = self.apply_and_act_part(batch).await?;
            batch = &batch[used..];
        }
        Ok(())
    }

    /// [`Self::apply_and_act`] of the first part of `batch`; how many of its
    /// records that part took.
    async fn apply_and_act_part(&mut self, batch: &[EventRecord]) -> Result<usize> {
        self.quiet
            .last_activity_ms
            .store(now_ms(), Ordering::Relaxed);
        let used = self.apply_batch(batch).await?;
        let batch = &batch[..used];
        self.quiet.next_wake_ms.store(
            self.engine.next_wake_ms().unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.sync
            .applied(batch, &self.out, self.health.ready.load(Ordering::Relaxed));
        if let Some(acting) = self.role.acting_mut() {
            // Then act.
            acting
                .dispatch(&self.store, &self.log, &self.out.actions)
                .await?;
            self.sync.published(batch, &self.out.actions);
            // What is watched, and which drains are lockstep's own, follow
            // the policy in force, as the engine does: from the log's
            // `PolicyChanged` records.
            if batch
                .iter()
                .any(|r| matches!(r.envelope.event, lockstep_schemas::Event::PolicyChanged(_)))
            {
                acting.policy_changed(&self.engine);
            }
        }
        Ok(used)
    }

    /// Caught up with the log? Checked when idle, or after a short batch
    /// until this instance acts (a busy log may never give an empty read).
    /// A candidate that is caught up becomes the leader and acts.
    async fn lead_once_caught_up(&mut self, batch: &[EventRecord]) -> Result<()> {
        let candidate = matches!(self.role, Role::Candidate);
        let look = batch.is_empty() || (batch.len() < self.cfg.service.batch_max && candidate);
        if !look {
            return Ok(());
        }
        let Some(head) = self.look_at_head().await else {
            return Ok(());
        };
        if head >= self.next || self.broken.is_some() {
            return Ok(());
        }
        if !self.health.ready.swap(true, Ordering::Relaxed) {
            info!(applied_seq = self.next - 1, "caught up with the log");
        }
        if candidate {
            let acting = Acting::start(
                &self.cfg,
                &self.engine,
                &self.store,
                &self.log,
                self.quiet.clone(),
            )
            .await?;
            self.role = Role::Leader(acting);
            // A snapshot at the first checkpoint of the leadership.
            self.snapshots.last = None;
            self.health.leader.store(true, Ordering::Relaxed);
            telemetry::record_leader(true);
        }
        Ok(())
    }

    /// The log's head, for the lag; and whether the log still is the one
    /// applied and has not gone back (else `broken` says why). `None` when
    /// the log does not answer.
    async fn look_at_head(&mut self) -> Option<u64> {
        let state = self.log.state().await.ok()?;
        self.saw_head(self.next - 1, &state);
        Some(state.last_seq)
    }

    /// [`Self::look_at_head`] without waiting for the answer, for the
    /// periodic look: on a busy connection (a new leader publishing 150,000
    /// actions) the answer can take a hundred milliseconds and more, which
    /// the loop would spend idle. [`Self::head_looked`] takes the answer.
    fn look_at_head_off_loop(&mut self) {
        if self.looking.is_some() {
            return;
        }
        let log = self.log.clone();
        let asked = tokio::spawn(async move { log.state().await.ok() });
        self.looking = Some((self.next - 1, asked));
    }

    /// Takes the answer of [`Self::look_at_head_off_loop`] once it is
    /// there, and judges it against what was applied when it was asked.
    async fn head_looked(&mut self) {
        if !self.looking.as_ref().is_some_and(|(_, h)| h.is_finished()) {
            return;
        }
        let (applied, asked) = self.looking.take().expect("a look under way");
        if let Ok(Some(state)) = asked.await {
            self.saw_head(applied, &state);
        }
    }

    /// What a look at the log's state says, `applied` being the sequence
    /// applied when it was asked: the head and lag, the size of a record,
    /// and whether the log still is the one applied and has not gone back.
    fn saw_head(&mut self, applied: u64, state: &LogState) {
        let head = state.last_seq;
        let held = (state.last_seq + 1).saturating_sub(state.first_seq);
        if held > 0 && state.bytes > 0 {
            self.snapshots.record_bytes = state.bytes / held;
        }
        self.health.head_seq.store(head, Ordering::Relaxed);
        telemetry::record_lag(head, applied);
        if let Some(b) = continuity::against_state(&self.log_id, applied, state) {
            self.broken.get_or_insert(b);
        }
    }

    /// The part of a batch read from `next` that continues from it. A gap
    /// at its start stops the loop (`broken`): a hole, or records the log's
    /// retention discarded before this replica applied them (a snapshot
    /// after them would have been started from). A gap further in is met by
    /// the next read.
    async fn continuing(&mut self, mut batch: Vec<EventRecord>) -> Vec<EventRecord> {
        let (n, missing) = continuity::contiguous(self.next, &batch);
        let Some((from, to)) = missing else {
            return batch;
        };
        if n > 0 {
            batch.truncate(n);
            return batch;
        }
        let state = match self.log.state().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "reading the event log's state failed; reading again");
                return Vec::new();
            }
        };
        let snapshots = self.log.snapshots().await.unwrap_or_default();
        let newest = snapshots.last().map(|s| s.seq);
        self.broken = Some(continuity::gap(from, to, &state, newest));
        Vec::new()
    }

    /// After the Lease was lost: stops everything the leadership ran
    /// (waiting until it is gone, well within the Lease's term left to the
    /// others: the renew deadline is shorter than the Lease), then competes
    /// for the Lease again as a follower. What it had not published stays
    /// undispatched in the ledger, for whichever replica leads next (this
    /// one too). It goes on folding the log meanwhile, as a follower does.
    async fn step_down(&mut self) -> Result<()> {
        self.stop_acting().await;
        if let Some(le) = &self.cfg.leader_election {
            self.leadership = Some(start_leadership(&self.cfg, le).await?);
        }
        Ok(())
    }

    /// Stops everything the leadership runs, waits until it is gone, and
    /// says it no longer leads.
    async fn stop_acting(&mut self) {
        if let Role::Leader(acting) = std::mem::replace(&mut self.role, Role::Follower) {
            acting.stop().await;
        }
        self.health.leader.store(false, Ordering::Relaxed);
        telemetry::record_leader(false);
    }

    /// Stops acting, writes a final checkpoint of everything applied, then
    /// hands the Lease to the next leader.
    async fn stop(mut self) -> Result<()> {
        self.stop_acting().await;
        self.checkpoint_written(true).await?;
        self.snapshot_kept(true).await;
        // Every batch applied is committed and flushed already.
        apply::write_checkpoint(&self.store, &self.engine.frozen())
            .context("writing the final checkpoint")?;
        self.store.flush().await?;
        self.log.flush().await?;
        if let Some(l) = self.leadership {
            l.release(Duration::from_secs(5)).await;
        }
        info!(applied_seq = self.next - 1, "stopped");
        Ok(())
    }
}

/// Starts competing for the configured Lease.
async fn start_leadership(cfg: &Config, le: &LeaderElectionConfig) -> Result<Leadership> {
    use lockstep_connectors::kube;
    let kubeconfig = cfg
        .kubernetes
        .as_ref()
        .and_then(|k| k.kubeconfig.as_deref());
    let kube_config = kube::load_config(kubeconfig)
        .await
        .context("loading the Kubernetes client configuration for leader election")?;
    let lease = kube::LeaseConfig {
        lease_duration: Duration::from_millis(le.lease_duration_ms),
        renew_deadline: Duration::from_millis(le.renew_deadline_ms),
        retry_period: Duration::from_millis(le.retry_period_ms),
        ..kube::LeaseConfig::new(le.namespace(), le.lease_name.clone(), le.identity())
    };
    info!(
        lease = format!("{}/{}", lease.namespace, lease.name),
        identity = %lease.identity,
        "following; competing for the leader lease"
    );
    kube::Leadership::start(kube_config, lease).context("starting leader election")
}

/// The next change of leadership; never, without leader election.
async fn leadership_changed(l: &mut Option<Leadership>) -> bool {
    match l {
        Some(l) => l.changed().await,
        None => std::future::pending().await,
    }
}
