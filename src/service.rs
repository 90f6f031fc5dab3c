//! `lockstep run`: consume the log, apply in batches, commit, then act.
//!
//! Persist first, then act (restate's partition processor): each batch's
//! checkpoint (when due), ledger entries and audit rows are committed in one
//! store transaction and flushed before its actions are published. After a
//! crash the service restarts from the last checkpoint and re-applies the
//! log after it (the same records give the same action ids).
//!
//! Who acts: every instance folds the log; only the acting one (the holder
//! of the leader Lease, once caught up with the log; every instance when
//! leader election is off) observes, publishes and carries out actions.
//! When it starts acting it publishes what the reducer issued that was
//! never published (a batch committed just before a crash, the last moments
//! of a previous leader) and carries out those still in flight. An action
//! is carried out only by the instance
//! whose publication put it on the action stream first (JetStream
//! deduplicates by action id), so no action id is executed twice, whoever
//! crashed or took over; one that was published but lost with its
//! publisher gets no outcome, and the reducer retries it after
//! `actions.timeout_s` of log time under a new id.
//!
//! This loop owns the engine. It never decides anything itself.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use lockstep_connectors::backoff::{retry, Backoff};
use lockstep_connectors::clock::now_ms;
use lockstep_engine::{Engine, Output};
use lockstep_schemas::{Connector, Envelope, Event, OutcomeResult, Policy, Source};
use lockstep_store::store::Error as StoreError;
use lockstep_store::{Checkpoint, Commit, EventLog, Store};
use tracing::{error, info, warn};

use crate::config::Config;
use crate::telemetry::{self, Health};

/// Opens the configured log.
pub async fn open_log(cfg: &Config) -> Result<EventLog> {
    match &cfg.log.nats_url {
        Some(url) => EventLog::connect_nats(url, &cfg.stream_limits())
            .await
            .with_context(|| format!("connecting to the event log at {url}")),
        None => {
            let dir = cfg.data_dir.join("log");
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            EventLog::open_embedded(&dir)
                .with_context(|| format!("opening the embedded log in {}", dir.display()))
        }
    }
}

/// Opens the configured log, waiting (with bounded backoff) while it does
/// not answer: a NATS cluster without a majority of its servers has no
/// JetStream to create or find the streams. Why it waits is on `/readyz`
/// and in the log. `None` when `shutdown` came first.
async fn open_log_when_available(
    cfg: &Config,
    health: &Health,
    shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<Option<EventLog>> {
    let mut backoff = Backoff::new(500, cfg.service.retry_backoff_max_ms);
    let opening = retry(
        &mut backoff,
        || open_log(cfg),
        |error, retry_in| {
            let retryable = error
                .downcast_ref::<lockstep_store::log::Error>()
                .is_some_and(lockstep_store::log::Error::is_retryable);
            if retryable {
                let why = format!("waiting for the event log: {error:#}");
                telemetry::LogUnavailable {
                    what: "open",
                    error: &why,
                    retry_in,
                }
                .emit();
                *health.waiting.lock().expect("health lock poisoned") = Some(why);
            }
            retryable
        },
    );
    let log = tokio::select! {
        biased;
        _ = shutdown.as_mut() => return Ok(None),
        opened = opening => opened?,
    };
    if health
        .waiting
        .lock()
        .expect("health lock poisoned")
        .take()
        .is_some()
    {
        info!("the event log answers; starting");
    }
    Ok(Some(log))
}

/// How long `run` waits for the store's lock: a lockstep killed just before
/// this one started releases it within tens of milliseconds.
pub const STORE_LOCK_WAIT: Duration = Duration::from_secs(5);

/// Opens the store, waiting up to `wait` for another process's lock (the
/// service: [`STORE_LOCK_WAIT`]; commands that read the store: none).
pub fn open_store(cfg: &Config, wait: Duration) -> Result<Store> {
    let dir = cfg.data_dir.join("store");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Store::open_waiting(&dir, wait).with_context(|| {
        format!(
            "opening the store in {} (is another lockstep running on it?)",
            dir.display()
        )
    })
}

/// The engine and next sequence to apply, from the store's checkpoint. A
/// damaged or unreadable checkpoint is reported and the engine rebuilds from
/// the start of the log instead.
pub fn restore(store: &Store) -> Result<(Engine, u64)> {
    match store.checkpoint() {
        Ok(Some(Checkpoint { seq, snapshot })) => match Engine::restore(&snapshot) {
            Ok(engine) => {
                info!(seq, "resuming from checkpoint");
                Ok((engine, seq + 1))
            }
            Err(e) => {
                error!(seq, error = %e, "checkpoint does not restore; rebuilding from the log");
                Ok((Engine::new(Policy::default()), 1))
            }
        },
        Ok(None) => Ok((Engine::new(Policy::default()), 1)),
        Err(e @ StoreError::CorruptCheckpoint { .. }) => {
            error!(error = %e, "rebuilding from the log instead of starting from bad state");
            Ok((Engine::new(Policy::default()), 1))
        }
        Err(e) => Err(e).context("reading the checkpoint"),
    }
}

/// Reads and checks the policy file.
fn read_policy(path: &Path) -> Result<Policy> {
    crate::commands::read_policy(path)
}

/// Runs until `shutdown` resolves; then finishes the batch, commits a final
/// checkpoint and returns.
///
/// Every instance folds the log into its own store. Only the acting one,
/// the leader once it has caught up with the log (every instance, without
/// leader election), observes, dispatches and carries out actions. An
/// instance that loses the leader Lease returns an error, so that its
/// supervisor restarts it as a candidate.
pub async fn run(cfg: Config, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let health = Arc::new(Health::default());
    // `/why` questions, answered by this loop, which owns the engine.
    let (queries_tx, mut queries) = tokio::sync::mpsc::channel(telemetry::QUERIES_WAITING_MAX);
    if let Some(addr) = cfg.telemetry.listen {
        let handle = telemetry::install_metrics()?;
        let health = health.clone();
        tokio::spawn(async move {
            if let Err(e) = telemetry::serve(addr, handle, health, queries_tx).await {
                error!(error = format!("{e:#}"), "telemetry endpoint failed");
            }
        });
    }
    let store = open_store(&cfg, STORE_LOCK_WAIT)?;
    tokio::pin!(shutdown);
    let Some(log) = open_log_when_available(&cfg, &health, &mut shutdown).await? else {
        return Ok(());
    };
    let (mut engine, mut next) = restore(&store)?;
    health.checkpoint_seq.store(next - 1, Ordering::Relaxed);
    health.applied_seq.store(next - 1, Ordering::Relaxed);

    let mut leadership = match &cfg.leader_election {
        Some(le) => Some(start_leadership(&cfg, le).await?),
        None => None,
    };
    let mut leader = leadership.is_none();
    let mut acting: Option<Acting> = None;
    telemetry::record_leader(false);

    let last_activity = Arc::new(std::sync::atomic::AtomicU64::new(now_ms()));
    // When the engine next needs a record to come (u64::MAX: never).
    let next_wake = Arc::new(std::sync::atomic::AtomicU64::new(
        engine.next_wake_ms().unwrap_or(u64::MAX),
    ));
    let mut out = Output::default();
    let mut sync = telemetry::SyncMetrics::default();
    let mut since_checkpoint = (0u64, Instant::now());
    let read_wait = Duration::from_millis(cfg.service.read_wait_ms);
    let mut backoff = Backoff::new(100, cfg.service.retry_backoff_max_ms);
    let mut lost_lease = false;
    loop {
        let batch = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            now_leader = leadership_changed(&mut leadership) => {
                if now_leader {
                    info!(applied_seq = next - 1, "leading; acting once caught up with the log");
                    leader = true;
                    continue;
                }
                // Leadership ends for good (the elector stops): stop, to be
                // restarted as a candidate.
                error!(acting = acting.is_some(), "lost the leader lease; stopping so that only the new leader acts");
                lost_lease = true;
                break;
            }
            batch = log.read(next, cfg.service.batch_max, read_wait) => batch,
        };
        let batch = match batch {
            Ok(b) => {
                backoff.reset();
                b
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
            last_activity.store(now_ms(), Ordering::Relaxed);
            apply_batch(
                &cfg,
                &store,
                &mut engine,
                &batch,
                &mut next,
                &mut out,
                &mut since_checkpoint,
                &health,
            )
            .await?;
            next_wake.store(engine.next_wake_ms().unwrap_or(u64::MAX), Ordering::Relaxed);
            sync.applied(&batch, &out, health.ready.load(Ordering::Relaxed));
            if let Some(a) = &acting {
                // Then act.
                dispatch(&store, &log, &a.actuators, out.actions.clone(), |_| true).await?;
                sync.published(&batch, &out.actions);
            }
        }
        if sync.stats_due() {
            // Also while busy: the lag must be current when it is large.
            if let Ok(head) = log.head().await {
                health.head_seq.store(head, Ordering::Relaxed);
                telemetry::record_lag(head, next - 1);
            }
            sync.publish_stats(&engine, &health);
        }
        telemetry::answer_queries(&mut queries, &engine, &store);
        // Caught up? Checked when idle, or after a short batch until this
        // instance acts (a busy log may never give an empty read).
        let look =
            batch.is_empty() || (batch.len() < cfg.service.batch_max && leader && acting.is_none());
        if !look {
            continue;
        }
        let Ok(head) = log.head().await else {
            continue;
        };
        health.head_seq.store(head, Ordering::Relaxed);
        telemetry::record_lag(head, next - 1);
        if head >= next {
            continue;
        }
        if !health.ready.swap(true, Ordering::Relaxed) {
            info!(applied_seq = next - 1, "caught up with the log");
        }
        if leader && acting.is_none() {
            let a = start_acting(
                &cfg,
                &engine,
                &store,
                &log,
                last_activity.clone(),
                next_wake.clone(),
            )
            .await?;
            acting = Some(a);
            health.leader.store(true, Ordering::Relaxed);
            telemetry::record_leader(true);
        }
    }

    // Stop: everything applied is in a final checkpoint, then the Lease
    // goes to the next leader.
    if let Some(a) = acting.take() {
        a.stop();
    }
    store
        .commit(&Commit {
            checkpoint: Some(take_checkpoint(&engine)),
            ..Commit::default()
        })
        .context("writing the final checkpoint")?;
    store.flush().await?;
    log.flush().await?;
    if let Some(l) = leadership {
        l.release(Duration::from_secs(5)).await;
    }
    health.leader.store(false, Ordering::Relaxed);
    telemetry::record_leader(false);
    info!(applied_seq = next - 1, "stopped");
    if lost_lease {
        anyhow::bail!("lost the leader lease");
    }
    Ok(())
}

/// Starts competing for the configured Lease.
async fn start_leadership(
    cfg: &Config,
    le: &crate::config::LeaderElectionConfig,
) -> Result<lockstep_connectors::kube::Leadership> {
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
async fn leadership_changed(l: &mut Option<lockstep_connectors::kube::Leadership>) -> bool {
    match l {
        Some(l) => l.changed().await,
        None => std::future::pending().await,
    }
}

/// What an acting instance runs besides the apply loop: observers,
/// actuators, ticks, the policy watcher. Stopped as a whole when it stops
/// acting, so that nothing observes or acts past the leadership.
struct Acting {
    actuators: Actuators,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Acting {
    fn stop(self) {
        self.tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

/// Starts observing and acting: connectors, ticks, the policy watcher; then
/// dispatches the actions in flight that this instance has not dispatched
/// (issued before a crash, or by a previous leader).
async fn start_acting(
    cfg: &Config,
    engine: &Engine,
    store: &Store,
    log: &EventLog,
    last_activity: Arc<std::sync::atomic::AtomicU64>,
    next_wake: Arc<std::sync::atomic::AtomicU64>,
) -> Result<Acting> {
    // The policy the connectors start with (what they watch follows it).
    let policy = match &cfg.policy_file {
        Some(path) => read_policy(path)?,
        None => engine.policy().clone(),
    };
    let mut tasks = Vec::new();
    let actuators = start_connectors(cfg, &policy, log, &mut tasks).await?;
    tasks.push(tokio::spawn(tick_when_quiet(
        log.clone(),
        cfg.service.tick_interval_ms,
        last_activity,
        next_wake,
    )));
    if let Some(path) = cfg.policy_file.clone() {
        tasks.push(tokio::spawn(watch_policy(
            log.clone(),
            path,
            cfg.service.policy_poll_ms,
        )));
    }
    // What the reducer issued that this instance never dispatched and that
    // has no outcome: actions of batches committed but not published before
    // a crash, and, on a follower that just took over, actions of its
    // predecessor's last moments. All of them are published, so that the
    // action stream records everything the reducer issued (replay --verify);
    // a NATS stream deduplicates ids within its window only, so older ones
    // are taken to have been published by the leader of their time. Of what
    // this call is first to publish, only the actions still in flight are
    // carried out.
    let horizon = match cfg.log.nats_url {
        Some(_) => now_ms().saturating_sub(cfg.log.duplicate_window_s * 1000 * 9 / 10),
        None => 0,
    };
    let unpublished: Vec<_> = store
        .undispatched()?
        .into_iter()
        .filter(|a| a.time_ms >= horizon)
        .collect();
    let in_flight: std::collections::HashSet<_> =
        engine.pending().into_iter().map(|(_, id)| id).collect();
    info!(
        applied_seq = engine.last_seq(),
        unpublished = unpublished.len(),
        in_flight = in_flight.len(),
        "acting"
    );
    dispatch(store, log, &actuators, unpublished, |a| {
        in_flight.contains(&a.id)
    })
    .await?;
    Ok(Acting { actuators, tasks })
}

/// Applies one batch and commits it (checkpoint when due, ledger, audit).
#[allow(clippy::too_many_arguments)]
async fn apply_batch(
    cfg: &Config,
    store: &Store,
    engine: &mut Engine,
    batch: &[lockstep_schemas::EventRecord],
    next: &mut u64,
    out: &mut Output,
    since_checkpoint: &mut (u64, Instant),
    health: &Health,
) -> Result<()> {
    let started = Instant::now();
    out.clear();
    let mut commit = Commit::default();
    for rec in batch {
        if rec.seq < *next {
            continue;
        }
        engine.apply(rec, out);
        if let Event::ActionOutcome(o) = &rec.envelope.event {
            let result = match &o.result {
                OutcomeResult::Succeeded => "succeeded",
                OutcomeResult::AlreadyDone => "already_done",
                OutcomeResult::Failed {
                    retryable: true, ..
                } => "failed_retryable",
                OutcomeResult::Failed { .. } => "failed",
            };
            telemetry::OutcomeApplied {
                kind: o.kind.name(),
                result,
            }
            .emit();
            commit
                .outcomes
                .push((o.action_id.clone(), o.result.clone()));
        }
        *next = rec.seq + 1;
    }
    let apply = started.elapsed();
    since_checkpoint.0 += batch.len() as u64;
    let due = since_checkpoint.0 >= cfg.service.checkpoint_every_records
        || since_checkpoint.1.elapsed() >= Duration::from_millis(cfg.service.checkpoint_every_ms);
    if due {
        commit.checkpoint = Some(take_checkpoint(engine));
        *since_checkpoint = (0, Instant::now());
    }
    commit.issued.clone_from(&out.actions);
    commit.transitions.clone_from(&out.transitions);
    let commit_started = Instant::now();
    store.commit(&commit).context("committing a batch")?;
    store.flush().await.context("flushing the store")?;
    telemetry::BatchCommitted {
        records: batch.len(),
        last_seq: *next - 1,
        output: out,
        apply,
        commit: commit_started.elapsed(),
    }
    .emit();
    if let Some(cp) = &commit.checkpoint {
        health.checkpoint_seq.store(cp.seq, Ordering::Relaxed);
    }
    health.applied_seq.store(*next - 1, Ordering::Relaxed);
    Ok(())
}

fn take_checkpoint(engine: &Engine) -> Checkpoint {
    let started = Instant::now();
    let snapshot = engine.snapshot();
    telemetry::CheckpointWritten {
        seq: engine.last_seq(),
        bytes: snapshot.len(),
        took: started.elapsed(),
    }
    .emit();
    Checkpoint {
        seq: engine.last_seq(),
        snapshot,
    }
}

/// Where dispatched actions go to be carried out in this process.
#[derive(Default)]
struct Actuators {
    kube: Option<tokio::sync::mpsc::Sender<lockstep_schemas::IssuedAction>>,
    slurm: Option<tokio::sync::mpsc::Sender<lockstep_schemas::IssuedAction>>,
}

impl Actuators {
    /// The actuator of `connector`'s side, if this process runs one.
    fn of(
        &self,
        connector: Connector,
    ) -> Option<&tokio::sync::mpsc::Sender<lockstep_schemas::IssuedAction>> {
        match connector {
            Connector::Slurm => self.slurm.as_ref(),
            Connector::Kubernetes => self.kube.as_ref(),
        }
    }

    async fn hand_over(&self, actions: &[lockstep_schemas::IssuedAction]) {
        for a in actions {
            if let Some(tx) = self.of(a.action.kind().connector()) {
                // Bounded: a slow API server or slurmctld slows dispatch
                // down rather than queueing without limit.
                let _ = tx.send(a.clone()).await;
            }
        }
    }
}

/// Starts the configured connectors: observers append to the log,
/// actuators take dispatched actions and append their outcomes.
async fn start_connectors(
    cfg: &Config,
    policy: &Policy,
    log: &EventLog,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Result<Actuators> {
    let mut actuators = Actuators::default();
    if let Some(s) = &cfg.slurm {
        start_slurm(s, log, &mut actuators, tasks)?;
    }
    let Some(k) = &cfg.kubernetes else {
        return Ok(actuators);
    };
    use lockstep_connectors::kube;
    let kube_config = kube::load_config(k.kubeconfig.as_deref())
        .await
        .context("loading the Kubernetes client configuration")?;
    if k.observe {
        let labels: Vec<&str> = k.node_labels.iter().map(String::as_str).collect();
        let spec = kube::ObserveSpec::from_policy(policy, &labels);
        let observer =
            kube::Observer::new(kube_config.clone(), spec, kube::ObserverConfig::default())
                .context("starting the Kubernetes observer")?;
        let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
        tasks.push(tokio::spawn(observer.run(tx)));
        let log = log.clone();
        tokio::spawn(async move {
            while let Some(observation) = rx.recv().await {
                append_until_done(&log, &observation.into_envelope()).await;
            }
        });
        info!("watching Kubernetes");
    }
    if k.actuate {
        let actuator = kube::Actuator::new(
            kube_config,
            vec![kube::ScaleKind::stateful_set()],
            kube::ActuatorConfig::default(),
        )
        .context("starting the Kubernetes actuator")?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<lockstep_schemas::IssuedAction>(1024);
        let limit = Arc::new(tokio::sync::Semaphore::new(k.actions_in_flight_max.max(1)));
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(action) = rx.recv().await {
                let Ok(permit) = limit.clone().acquire_owned().await else {
                    break;
                };
                let (actuator, log) = (actuator.clone(), log.clone());
                tokio::spawn(async move {
                    let outcome = actuator.execute(&action).await;
                    let env =
                        Envelope::new(Source::Actuator, now_ms(), Event::ActionOutcome(outcome));
                    append_until_done(&log, &env).await;
                    drop(permit);
                });
            }
        }));
        actuators.kube = Some(tx);
        info!("carrying out Kubernetes actions");
    }
    Ok(actuators)
}

/// The Slurm observer and actuator.
fn start_slurm(
    s: &crate::config::SlurmConfig,
    log: &EventLog,
    actuators: &mut Actuators,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Result<()> {
    use lockstep_connectors::slurm;
    let rest = match &s.rest_url {
        Some(url) => {
            let token = match &s.jwt_file {
                Some(f) => slurm::TokenSource::File(f.clone()),
                None => slurm::TokenSource::Env("SLURM_JWT".to_owned()),
            };
            let config = slurm::RestConfig::new(url.clone(), s.rest_user.clone(), token);
            Some(slurm::RestClient::new(config).context("configuring the slurmrestd client")?)
        }
        None => None,
    };
    let scontrol = slurm::Scontrol::new(slurm::ScontrolConfig {
        slurm_conf: s.slurm_conf.clone(),
        ..slurm::ScontrolConfig::default()
    });
    if s.observe {
        let backend = match &rest {
            Some(r) => slurm::Backend::Rest(r.clone()),
            None => slurm::Backend::Scontrol(scontrol.clone()),
        };
        let observer = slurm::Observer::new(
            backend,
            slurm::ObserverConfig {
                poll_interval_ms: s.poll_interval_ms,
                resync_every_polls: s.resync_every_polls,
                ..slurm::ObserverConfig::default()
            },
        );
        let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
        tasks.push(tokio::spawn(observer.run(tx)));
        let log = log.clone();
        tokio::spawn(async move {
            while let Some(observation) = rx.recv().await {
                append_until_done(&log, &observation.into_envelope()).await;
            }
        });
        info!("watching Slurm");
    }
    if s.actuate {
        let actuator = Arc::new(
            slurm::Actuator::new(rest, Some(scontrol), slurm::ActuatorConfig::default())
                .context("starting the Slurm actuator")?,
        );
        let (tx, mut rx) = tokio::sync::mpsc::channel::<lockstep_schemas::IssuedAction>(1024);
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            // One at a time: slurmctld serialises node updates anyway.
            while let Some(action) = rx.recv().await {
                let outcome = actuator.execute(&action).await;
                let env = Envelope::new(Source::Actuator, now_ms(), Event::ActionOutcome(outcome));
                append_until_done(&log, &env).await;
            }
        }));
        actuators.slurm = Some(tx);
        info!("carrying out Slurm actions");
    }
    Ok(())
}

/// Appends, retrying with bounded backoff while the log is unavailable.
async fn append_until_done(log: &EventLog, env: &Envelope) {
    let mut backoff = Backoff::new(100, APPEND_BACKOFF_MAX_MS);
    let appended = retry(
        &mut backoff,
        || log.append(env),
        |e, retry_in| {
            telemetry::LogUnavailable {
                what: "append",
                error: e,
                retry_in,
            }
            .emit();
            true
        },
    );
    // Never gives up: the only way out is success.
    let _ = appended.await;
}

/// Bound of the backoff of appends and action publications while the log
/// is unavailable.
const APPEND_BACKOFF_MAX_MS: u64 = 5_000;

/// Publishes actions the ledger has not dispatched, records them, then
/// hands those this call was first to publish and that `carry_out` accepts
/// to the actuators of this process.
async fn dispatch(
    store: &Store,
    log: &EventLog,
    actuators: &Actuators,
    actions: Vec<lockstep_schemas::IssuedAction>,
    carry_out: impl Fn(&lockstep_schemas::IssuedAction) -> bool,
) -> Result<()> {
    let mut todo = Vec::with_capacity(actions.len());
    for a in actions {
        if store.ledger_entry(&a.id)?.is_some_and(|e| e.dispatched > 0) {
            continue;
        }
        todo.push(a);
    }
    if todo.is_empty() {
        return Ok(());
    }
    let fresh = retry(
        &mut Backoff::new(100, APPEND_BACKOFF_MAX_MS),
        || log.publish_actions(&todo),
        |e, retry_in| {
            if e.is_retryable() {
                telemetry::LogUnavailable {
                    what: "publish actions",
                    error: e,
                    retry_in,
                }
                .emit();
            }
            e.is_retryable()
        },
    )
    .await
    .context("publishing actions")?;
    let ids: Vec<_> = todo.iter().map(|a| a.id.clone()).collect();
    store.mark_dispatched(&ids)?;
    store.flush().await?;
    // Only the instance whose publication was the first carries an action
    // out: an action id is executed at most once, whoever leads.
    let (ours, theirs): (Vec<_>, Vec<_>) = todo.into_iter().zip(fresh).partition(|(_, f)| *f);
    let ours: Vec<_> = ours
        .into_iter()
        .map(|(a, _)| a)
        .filter(|a| carry_out(a))
        .collect();
    let theirs: Vec<_> = theirs.into_iter().map(|(a, _)| a.id).collect();
    telemetry::ActionsDispatched { count: ours.len() }.emit();
    telemetry::ActionsAlreadyPublished { ids: &theirs }.emit();
    actuators.hand_over(&ours).await;
    Ok(())
}

/// Appends a `Tick` when the log has been quiet for `interval_ms` and the
/// engine has a timer due: its timers fire at most `interval_ms` late, and
/// a log with nothing waiting on time gets no records that say nothing
/// (before, a quiet log got one every interval: 86,400 a day).
async fn tick_when_quiet(
    log: EventLog,
    interval_ms: u64,
    last_activity: Arc<std::sync::atomic::AtomicU64>,
    next_wake: Arc<std::sync::atomic::AtomicU64>,
) {
    let interval = Duration::from_millis(interval_ms.max(10));
    loop {
        tokio::time::sleep(interval).await;
        let now = now_ms();
        if now.saturating_sub(last_activity.load(Ordering::Relaxed)) < interval_ms
            || next_wake.load(Ordering::Relaxed) > now
        {
            continue;
        }
        match log
            .append(&Envelope::new(Source::Lockstep, now, Event::Tick))
            .await
        {
            Ok(_) => last_activity.store(now, Ordering::Relaxed),
            Err(e) => warn!(error = %e, "appending a tick failed"),
        }
    }
}

/// Appends `PolicyChanged` when the policy file's content changes (and once
/// at start). An invalid file is reported and ignored: the last good policy
/// stays in force.
async fn watch_policy(log: EventLog, path: std::path::PathBuf, poll_ms: u64) {
    let mut last: Option<String> = None;
    loop {
        match std::fs::read_to_string(&path) {
            Ok(text) if last.as_deref() != Some(text.as_str()) => match read_policy(&path) {
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
                    error!(file = %path.display(), error = format!("{e:#}"), "policy file rejected; keeping the policy in force");
                    last = Some(text);
                }
            },
            Ok(_) => {}
            Err(e) => warn!(file = %path.display(), error = %e, "cannot read the policy file"),
        }
        tokio::time::sleep(Duration::from_millis(poll_ms.max(100))).await;
    }
}
