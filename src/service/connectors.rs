//! Starting the configured connectors for a leadership: the observers, whose
//! observations are appended to the log, and the actuators, to which
//! [`Actuators::hand_over`] routes each action by the side it acts on.
//!
//! Every task started here goes into the leadership's `JoinSet`, so nothing
//! observes or acts once the leadership ends.

use std::sync::Arc;

use anyhow::{Context, Result};
use lockstep_connectors::backoff::{retry, Backoff};
use lockstep_connectors::clock::now_ms;
use lockstep_connectors::{kube, slurm, Observation};
use lockstep_engine::Engine;
use lockstep_schemas::{Connector, Envelope, Event, IssuedAction, Policy, ReasonOwnership, Source};
use lockstep_store::EventLog;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::info;

use crate::config::{Config, KubernetesConfig, SlurmConfig};
use crate::telemetry;

/// Observations waiting to be appended, per observer.
const OBSERVATIONS_WAITING_MAX: usize = 4096;
/// Most observations appended together: sent to the log before the first
/// ack is awaited ([`EventLog::append_all`]). One at a time, a node pool
/// cordoned at once (thousands of watch events in seconds) waited on one
/// round trip to JetStream each.
const APPENDS_TOGETHER_MAX: usize = 256;
/// Dispatched actions waiting for their actuator, per actuator.
const ACTIONS_WAITING_MAX: usize = 1024;
/// Bound of the backoff of appends and action publications while the log
/// is unavailable.
pub(super) const APPEND_BACKOFF_MAX_MS: u64 = 5_000;

/// Where dispatched actions go to be carried out in this process.
#[derive(Default, Clone)]
pub(super) struct Actuators {
    kube: Option<mpsc::Sender<IssuedAction>>,
    slurm: Option<mpsc::Sender<IssuedAction>>,
}

impl Actuators {
    /// The actuator of `connector`'s side, if this process runs one.
    fn of(&self, connector: Connector) -> Option<&mpsc::Sender<IssuedAction>> {
        match connector {
            Connector::Slurm => self.slurm.as_ref(),
            Connector::Kubernetes => self.kube.as_ref(),
        }
    }

    /// Hands each action to the actuator of the side it acts on.
    pub(super) async fn hand_over(&self, actions: &[IssuedAction]) {
        for a in actions {
            if let Some(tx) = self.of(a.action.kind().connector()) {
                // Bounded: a slow API server or slurmctld slows dispatch
                // down rather than queueing without limit.
                let _ = tx.send(a.clone()).await;
            }
        }
    }
}

/// The Kubernetes observer and actuator follow the policy in force: what
/// the observer watches, and the kinds of scale target the actuator scales,
/// are sent here when a `PolicyChanged` changes them.
pub(super) struct Watched {
    /// `None` without an observer.
    spec: Option<watch::Sender<kube::ObserveSpec>>,
    /// `None` without an actuator.
    scale_kinds: Option<watch::Sender<Vec<kube::ScaleKind>>>,
    /// Node labels observed whatever the policy says (`kubernetes.node_labels`).
    node_labels: Vec<String>,
}

impl Watched {
    /// What `policy` needs watched.
    fn spec(policy: &Policy, node_labels: &[String]) -> kube::ObserveSpec {
        let labels: Vec<&str> = node_labels.iter().map(String::as_str).collect();
        kube::ObserveSpec::from_policy(policy, &labels)
    }

    /// `policy` is now in force: the observer watches what it needs (the
    /// watches it changes restart, the others go on), and the actuator
    /// scales the kinds it names.
    pub(super) fn follow(&self, policy: &Policy) {
        if let Some(tx) = &self.spec {
            replace_if_changed(tx, Self::spec(policy, &self.node_labels));
        }
        if let Some(tx) = &self.scale_kinds {
            replace_if_changed(tx, kube::scale_kinds(policy));
        }
    }
}

/// The Slurm actuator follows the policy in force: which drains and downs
/// are lockstep's own (what it may replace or lift) is sent here when a
/// `PolicyChanged` changes the reason prefix or `drain.slurm_user`.
pub(super) struct SlurmOwnership(watch::Sender<ReasonOwnership>);

impl SlurmOwnership {
    /// `ownership` (the engine's `reason_ownership`) is now in force: the
    /// actuator's next decision uses it.
    pub(super) fn follow(&self, ownership: ReasonOwnership) {
        replace_if_changed(&self.0, ownership);
    }
}

/// Sends `new` unless it is what `tx` already holds.
fn replace_if_changed<T: PartialEq>(tx: &watch::Sender<T>, new: T) {
    tx.send_if_modified(|held| {
        let changed = *held != new;
        if changed {
            *held = new;
        }
        changed
    });
}

/// The connectors of one leadership, as far as the service talks to them.
pub(super) struct Started {
    pub(super) actuators: Actuators,
    /// `None` without a Kubernetes observer or actuator.
    pub(super) watched: Option<Watched>,
    /// `None` without a Slurm actuator.
    pub(super) slurm_ownership: Option<SlurmOwnership>,
}

/// Starts the configured connectors: observers append to the log,
/// actuators take dispatched actions and append their outcomes. They start
/// from what the engine holds, never from a policy file: what the
/// Kubernetes observer watches from the engine's policy, what the Slurm
/// actuator takes for lockstep's own from its reason ownership.
pub(super) async fn start(
    cfg: &Config,
    engine: &Engine,
    log: &EventLog,
    tasks: &mut JoinSet<()>,
) -> Result<Started> {
    let (policy, ownership) = (engine.policy(), engine.reason_ownership());
    let mut started = Started {
        actuators: Actuators::default(),
        watched: None,
        slurm_ownership: None,
    };
    if let Some(s) = &cfg.slurm {
        started.slurm_ownership = start_slurm(s, ownership, log, &mut started.actuators, tasks)?;
    }
    if let Some(k) = &cfg.kubernetes {
        started.watched = start_kube(k, policy, log, &mut started.actuators, tasks).await?;
    }
    Ok(started)
}

/// The Kubernetes observer and actuator.
async fn start_kube(
    k: &KubernetesConfig,
    policy: &Policy,
    log: &EventLog,
    actuators: &mut Actuators,
    tasks: &mut JoinSet<()>,
) -> Result<Option<Watched>> {
    let kube_config = kube::load_config(k.kubeconfig.as_deref())
        .await
        .context("loading the Kubernetes client configuration")?;
    let mut watched = Watched {
        spec: None,
        scale_kinds: None,
        node_labels: k.node_labels.clone(),
    };
    if k.observe {
        let spec = Watched::spec(policy, &k.node_labels);
        let (spec_tx, spec_rx) = watch::channel(spec.clone());
        let observer =
            kube::Observer::new(kube_config.clone(), spec, kube::ObserverConfig::default())
                .context("starting the Kubernetes observer")?;
        let (tx, rx) = mpsc::channel(OBSERVATIONS_WAITING_MAX);
        tasks.spawn(observer.run_following(spec_rx, tx));
        tasks.spawn(append_observations(log.clone(), rx));
        watched.spec = Some(spec_tx);
        info!("watching Kubernetes");
    }
    if k.actuate {
        let (kinds_tx, kinds_rx) = watch::channel(kube::scale_kinds(policy));
        let actuator =
            kube::Actuator::following(kube_config, kinds_rx, kube::ActuatorConfig::default())
                .context("starting the Kubernetes actuator")?;
        watched.scale_kinds = Some(kinds_tx);
        let (tx, mut rx) = mpsc::channel::<IssuedAction>(ACTIONS_WAITING_MAX);
        let limit = Arc::new(tokio::sync::Semaphore::new(k.actions_in_flight_max.max(1)));
        let log = log.clone();
        tasks.spawn(async move {
            // The actions in flight: stopped with this task.
            let mut in_flight = JoinSet::new();
            while let Some(action) = rx.recv().await {
                while in_flight.try_join_next().is_some() {}
                let Ok(permit) = limit.clone().acquire_owned().await else {
                    break;
                };
                let (actuator, log) = (actuator.clone(), log.clone());
                in_flight.spawn(async move {
                    let outcome = actuator.execute(&action).await;
                    append_outcome(&log, outcome).await;
                    drop(permit);
                });
            }
        });
        actuators.kube = Some(tx);
        info!("carrying out Kubernetes actions");
    }
    Ok((k.observe || k.actuate).then_some(watched))
}

/// The Slurm observer and actuator.
fn start_slurm(
    s: &SlurmConfig,
    ownership: ReasonOwnership,
    log: &EventLog,
    actuators: &mut Actuators,
    tasks: &mut JoinSet<()>,
) -> Result<Option<SlurmOwnership>> {
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
            Some(r) if s.nodes_through_scontrol => {
                slurm::Backend::NodesThroughScontrol(r.clone(), scontrol.clone())
            }
            Some(r) => slurm::Backend::Rest(r.clone()),
            None => slurm::Backend::Scontrol(scontrol.clone()),
        };
        let observer = slurm::Observer::new(
            backend,
            slurm::ObserverConfig {
                poll_interval_ms: s.poll_interval_ms,
                jobs_poll_interval_ms: s.jobs_poll_interval_ms,
                resync_every_polls: s.resync_every_polls,
                ..slurm::ObserverConfig::default()
            },
        );
        let (tx, rx) = mpsc::channel(OBSERVATIONS_WAITING_MAX);
        tasks.spawn(observer.run(tx));
        tasks.spawn(append_observations(log.clone(), rx));
        info!("watching Slurm");
    }
    let mut followed = None;
    if s.actuate {
        let (ownership_tx, ownership_rx) = watch::channel(ownership);
        let actuator = slurm::Actuator::new(
            rest,
            Some(scontrol),
            ownership_rx,
            slurm::ActuatorConfig {
                list_through_scontrol: s.nodes_through_scontrol,
                ..slurm::ActuatorConfig::default()
            },
        )
        .context("starting the Slurm actuator")?;
        followed = Some(SlurmOwnership(ownership_tx));
        let (tx, mut rx) = mpsc::channel::<IssuedAction>(ACTIONS_WAITING_MAX);
        let log = log.clone();
        tasks.spawn(async move {
            // What waits is carried out together: slurmctld serialises node
            // updates anyway, and the drains of a node pool cordoned at
            // once share their reads and writes (`execute_all`).
            let mut waiting = Vec::with_capacity(ACTIONS_WAITING_MAX);
            while rx.recv_many(&mut waiting, ACTIONS_WAITING_MAX).await > 0 {
                let outcomes = actuator.execute_all(&waiting).await;
                waiting.clear();
                let mut appends = JoinSet::new();
                for outcome in outcomes {
                    let log = log.clone();
                    appends.spawn(async move { append_outcome(&log, outcome).await });
                }
                appends.join_all().await;
            }
        });
        actuators.slurm = Some(tx);
        info!("carrying out Slurm actions");
    }
    Ok(followed)
}

/// Appends what an observer sends, in order, until it stops.
async fn append_observations(log: EventLog, mut rx: mpsc::Receiver<Observation>) {
    let mut waiting = Vec::with_capacity(APPENDS_TOGETHER_MAX);
    while rx.recv_many(&mut waiting, APPENDS_TOGETHER_MAX).await > 0 {
        let envelopes: Vec<Envelope> = waiting.drain(..).map(Observation::into_envelope).collect();
        append_all_until_done(&log, &envelopes).await;
    }
}

/// Appends `envelopes` in order, retrying all of them with bounded backoff
/// while the log is unavailable (those that landed deduplicate by their
/// ids).
async fn append_all_until_done(log: &EventLog, envelopes: &[Envelope]) {
    let mut backoff = Backoff::new(100, APPEND_BACKOFF_MAX_MS);
    let appended = retry(
        &mut backoff,
        || log.append_all(envelopes),
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

/// Appends an actuator's outcome, so the reducer learns it from the log.
async fn append_outcome(log: &EventLog, outcome: lockstep_schemas::ActionOutcome) {
    let env = Envelope::new(Source::Actuator, now_ms(), Event::ActionOutcome(outcome));
    append_until_done(log, &env).await;
}

/// Appends, retrying with bounded backoff while the log is unavailable.
async fn append_until_done(log: &EventLog, env: &Envelope) {
    append_all_until_done(log, std::slice::from_ref(env)).await;
}
