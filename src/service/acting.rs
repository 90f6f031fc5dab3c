//! What the leader runs besides the apply loop, for as long as it leads:
//! the connectors, ticks and the policy file watcher, all in one `JoinSet`
//! that stops as a whole when the leadership does, so that nothing observes
//! or acts past it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use lockstep_connectors::clock::now_ms;
use lockstep_engine::Engine;
use lockstep_schemas::{ActionId, Envelope, Event, IssuedAction, Policy, Source};
use lockstep_store::{EventLog, Store};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{error, info, warn};

use super::connectors::{self, Actuators, SlurmOwnership, Watched};
use super::dispatch::{dispatch, DISPATCH_PAGE};
use crate::config::Config;

/// A leadership's tasks and where its actions go.
pub(super) struct Acting {
    actuators: Actuators,
    /// What the Kubernetes observer watches, if there is one.
    watched: Option<Watched>,
    /// What the Slurm actuator takes for lockstep's own, if there is one.
    slurm_ownership: Option<SlurmOwnership>,
    tasks: JoinSet<()>,
    /// The take-over of earlier leaderships' actions, or a wave of one
    /// batch's, while it runs: it publishes them off the apply loop, and
    /// the actions of the batches applied meanwhile queue behind them, in
    /// issue order.
    behind: Option<Behind>,
}

/// A running take-over or wave and the queue of the actions issued since
/// it began.
struct Behind {
    queue: mpsc::UnboundedSender<Vec<IssuedAction>>,
    task: JoinHandle<Result<()>>,
}

/// When the log was last written to, and when the engine next needs a
/// record (u64::MAX: never), in ms: what the tick task reads.
#[derive(Debug, Clone)]
pub(super) struct Quiet {
    pub(super) last_activity_ms: Arc<AtomicU64>,
    pub(super) next_wake_ms: Arc<AtomicU64>,
}

impl Acting {
    /// Starts observing and acting: connectors, ticks, the policy watcher;
    /// then dispatches the actions in flight that this instance has not
    /// dispatched (issued before a crash, or by a previous leader).
    pub(super) async fn start(
        cfg: &Config,
        engine: &Engine,
        store: &Store,
        log: &EventLog,
        quiet: Quiet,
    ) -> Result<Self> {
        let mut tasks = JoinSet::new();
        // The connectors start from the engine's policy (the log's), never
        // from the file: what they watch, and which drains are lockstep's
        // own (with the prefixes of earlier policies), follow the log's
        // `PolicyChanged` records as the engine does. A file that differs
        // from the log is appended by the watcher below, and the connectors
        // follow it once it is applied.
        let started = connectors::start(cfg, engine, log, &mut tasks).await?;
        tasks.spawn(tick_when_quiet(
            log.clone(),
            cfg.service.tick_interval_ms,
            quiet,
        ));
        if let Some(path) = cfg.policy_file.clone() {
            tasks.spawn(watch_policy(log.clone(), path, cfg.service.policy_poll_ms));
        }
        let (queue, queued) = mpsc::unbounded_channel();
        let task = tokio::spawn(take_over(
            Earlier::of(cfg, engine),
            store.clone(),
            log.clone(),
            started.actuators.clone(),
            queued,
        ));
        Ok(Self {
            actuators: started.actuators,
            watched: started.watched,
            slurm_ownership: started.slurm_ownership,
            tasks,
            behind: Some(Behind { queue, task }),
        })
    }

    /// Publishes the actions of a batch and carries out those this instance
    /// was first to publish; while the take-over or a wave runs, they queue
    /// behind it. A batch of more than a page of actions (a node pool
    /// cordoned at once, or the timeouts of as many actions ending
    /// together) is a wave: published off the apply loop as a take-over
    /// is, since publishing a hundred thousand takes seconds.
    pub(super) async fn dispatch(
        &mut self,
        store: &Store,
        log: &EventLog,
        actions: &[IssuedAction],
    ) -> Result<()> {
        if let Some(behind) = &self.behind {
            if actions.is_empty() {
                return self.behind_ended().await;
            }
            if !behind.task.is_finished() && behind.queue.send(actions.to_vec()).is_ok() {
                return Ok(());
            }
            // It is taking the last of its queue: after it, in order.
            self.join_behind().await?;
        }
        if actions.len() > DISPATCH_PAGE {
            let (queue, queued) = mpsc::unbounded_channel();
            let task = tokio::spawn(wave(
                actions.to_vec(),
                store.clone(),
                log.clone(),
                self.actuators.clone(),
                queued,
            ));
            self.behind = Some(Behind { queue, task });
            return Ok(());
        }
        dispatch(store, log, &self.actuators, actions, |_| true).await
    }

    /// Whether the take-over or wave failed (its error); once it has
    /// ended, the actions of each batch are dispatched as it is applied.
    pub(super) async fn behind_ended(&mut self) -> Result<()> {
        if self.behind.as_ref().is_some_and(|b| b.task.is_finished()) {
            self.join_behind().await?;
        }
        Ok(())
    }

    /// Waits for the take-over or wave to end; its error, if it failed.
    async fn join_behind(&mut self) -> Result<()> {
        match self.behind.take() {
            Some(behind) => behind
                .task
                .await
                .context("publishing off the apply loop stopped")?,
            None => Ok(()),
        }
    }

    /// A `PolicyChanged` put the engine's policy in force: the Kubernetes
    /// watches follow what it needs watched, the Kubernetes actuator the
    /// kinds of scale target it names, the Slurm actuator which drains are
    /// lockstep's own.
    pub(super) fn policy_changed(&self, engine: &Engine) {
        if let Some(w) = &self.watched {
            w.follow(engine.policy());
        }
        if let Some(o) = &self.slurm_ownership {
            o.follow(engine.reason_ownership());
        }
    }

    /// Stops every task of the leadership and waits until they are gone.
    pub(super) async fn stop(mut self) {
        // What it has not published stays undispatched in the ledger: the
        // next leader's take-over publishes it.
        if let Some(behind) = self.behind.take() {
            behind.task.abort();
            let _ = behind.task.await;
        }
        self.tasks.shutdown().await;
    }
}

/// What a take-over publishes: the actions issued up to `last_seq` (the
/// state it took over), those after `horizon` published (older ones are
/// taken to have been), those in flight then carried out.
struct Earlier {
    last_seq: u64,
    horizon: u64,
    /// The 64-bit hashes of the ids in flight, sorted: a hundred thousand
    /// take 0.8 MB, where copies of the ids would take ten times that.
    in_flight: Vec<u64>,
}

impl Earlier {
    fn of(cfg: &Config, engine: &Engine) -> Self {
        let horizon = match cfg.log.nats_url {
            Some(_) => now_ms().saturating_sub(cfg.log.duplicate_window_s * 1000 * 9 / 10),
            None => 0,
        };
        Self {
            last_seq: engine.last_seq(),
            horizon,
            in_flight: {
                let mut v: Vec<u64> = engine.pending_ids().map(id_hash).collect();
                v.sort_unstable();
                v
            },
        }
    }

    fn in_flight(&self, id: &ActionId) -> bool {
        self.in_flight.binary_search(&id_hash(id)).is_ok()
    }
}

/// A hash of an action id, the same for the same id within this process.
fn id_hash(id: &ActionId) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(&id.0)
}

/// Publishes what the reducer issued that this instance never dispatched
/// and that has no outcome: actions of batches committed but not published
/// before a crash, and, on a follower that just took over, actions of its
/// predecessor's last moments. All of them are published, so that the
/// action stream records everything the reducer issued (replay --verify); a
/// NATS stream deduplicates ids within its window only, so older ones are
/// taken to have been published by the leader of their time. Of what this
/// call is first to publish, only the actions still in flight are carried
/// out. Then dispatches what `queued` holds, the actions of the batches
/// applied meanwhile, in order: a new leader may find a hundred thousand
/// actions waiting, and applying goes on while they are published.
async fn take_over(
    earlier: Earlier,
    store: Store,
    log: EventLog,
    actuators: Actuators,
    queued: mpsc::UnboundedReceiver<Vec<IssuedAction>>,
) -> Result<()> {
    let started = std::time::Instant::now();
    info!(
        applied_seq = earlier.last_seq,
        in_flight = earlier.in_flight.len(),
        "acting"
    );
    // Page by page: however many actions wait, memory holds one page of
    // them and of their publication.
    let (mut unpublished, mut too_old) = (0usize, 0usize);
    let mut after: Option<IssuedAction> = None;
    loop {
        let mut page = store.undispatched(after.as_ref(), DISPATCH_PAGE)?;
        let Some(last) = page.last().cloned() else {
            break;
        };
        // Those issued since come through the queue.
        let end = page.len();
        page.retain(|a| a.seq <= earlier.last_seq);
        let (recent, old): (Vec<_>, Vec<_>) =
            page.into_iter().partition(|a| a.time_ms >= earlier.horizon);
        store.forget_undispatched(&old)?;
        too_old += old.len();
        unpublished += recent.len();
        dispatch(&store, &log, &actuators, &recent, |a| {
            earlier.in_flight(&a.id)
        })
        .await?;
        if recent.len() + old.len() < end {
            break;
        }
        after = Some(last);
    }
    info!(
        unpublished,
        too_old_to_publish = too_old,
        took_ms = started.elapsed().as_millis() as u64,
        "actions of earlier leaderships published"
    );
    then_queued(&store, &log, &actuators, queued).await
}

/// Publishes a batch's wave of actions ([`Acting::dispatch`]), then what
/// `queued` holds.
async fn wave(
    actions: Vec<IssuedAction>,
    store: Store,
    log: EventLog,
    actuators: Actuators,
    queued: mpsc::UnboundedReceiver<Vec<IssuedAction>>,
) -> Result<()> {
    let started = std::time::Instant::now();
    dispatch(&store, &log, &actuators, &actions, |_| true).await?;
    info!(
        actions = actions.len(),
        took_ms = started.elapsed().as_millis() as u64,
        "a wave of actions published off the apply loop"
    );
    then_queued(&store, &log, &actuators, queued).await
}

/// Dispatches the actions of the batches applied while a take-over or a
/// wave was published, in order, for as long as the loop queues more. Once
/// none waits, the queue is closed and what came in meanwhile dispatched:
/// the loop, finding it closed, waits only for that before it dispatches
/// the next batch itself.
async fn then_queued(
    store: &Store,
    log: &EventLog,
    actuators: &Actuators,
    mut queued: mpsc::UnboundedReceiver<Vec<IssuedAction>>,
) -> Result<()> {
    while let Ok(actions) = queued.try_recv() {
        dispatch(store, log, actuators, &actions, |_| true).await?;
    }
    queued.close();
    while let Some(actions) = queued.recv().await {
        dispatch(store, log, actuators, &actions, |_| true).await?;
    }
    Ok(())
}

/// Appends a `Tick` when the log has been quiet for `interval_ms` and the
/// engine has a timer due: its timers fire at most `interval_ms` late, and
/// a log with nothing waiting on time gets no records that say nothing
/// (before, a quiet log got one every interval: 86,400 a day).
async fn tick_when_quiet(log: EventLog, interval_ms: u64, quiet: Quiet) {
    let interval = Duration::from_millis(interval_ms.max(10));
    loop {
        tokio::time::sleep(interval).await;
        let now = now_ms();
        if now.saturating_sub(quiet.last_activity_ms.load(Ordering::Relaxed)) < interval_ms
            || quiet.next_wake_ms.load(Ordering::Relaxed) > now
        {
            continue;
        }
        match log
            .append(&Envelope::new(Source::Lockstep, now, Event::Tick))
            .await
        {
            Ok(_) => quiet.last_activity_ms.store(now, Ordering::Relaxed),
            Err(e) => warn!(error = %e, "appending a tick failed"),
        }
    }
}

/// Appends `PolicyChanged` when the policy file's content changes (and once
/// at start). An invalid file is reported and ignored: the last good policy
/// stays in force. The file is read once a poll; a changed content is
/// parsed from what was read, so the policy appended is the content compared.
async fn watch_policy(log: EventLog, path: PathBuf, poll_ms: u64) {
    let mut last: Option<String> = None;
    loop {
        match std::fs::read_to_string(&path) {
            Ok(text) if last.as_deref() != Some(text.as_str()) => {
                match Policy::from_file_text(&path, &text) {
                    Ok(policy) => {
                        // The file it came from, for `lockstep policy history`.
                        let detail = lockstep_schemas::SourceDetail {
                            file: path.display().to_string(),
                            ..Default::default()
                        };
                        let env = Envelope::with_detail(
                            Source::Lockstep,
                            now_ms(),
                            Event::PolicyChanged(Box::new(policy)),
                            detail,
                        );
                        match log.append(&env).await {
                            Ok(a) => {
                                info!(file = %path.display(), seq = a.seq, "policy change appended to the log");
                                last = Some(text);
                            }
                            Err(e) => warn!(error = %e, "appending the policy failed; will retry"),
                        }
                    }
                    Err(e) => {
                        error!(file = %path.display(), error = format!("{:#}", anyhow::Error::new(e)), "policy file rejected; keeping the policy in force");
                        last = Some(text);
                    }
                }
            }
            Ok(_) => {}
            Err(e) => warn!(file = %path.display(), error = %e, "cannot read the policy file"),
        }
        tokio::time::sleep(Duration::from_millis(poll_ms.max(100))).await;
    }
}
