//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! The protocol is client-go's `leaderelection` with a Lease lock:
//!
//! - A candidate reads the Lease every `retry_period`. It takes the Lease
//!   when nobody holds it, or when the holder's record has not changed for
//!   `lease_duration` as measured on the candidate's own clock (so clock
//!   skew between machines does not matter, only rates). Taking and renewing
//!   are `replace`s carrying the `resourceVersion` that was read, so of two
//!   candidates racing for an expired Lease exactly one succeeds; the other
//!   gets 409 Conflict.
//! - The leader renews every `retry_period`. If no renewal succeeds for
//!   `renew_deadline` (shorter than `lease_duration`), it stops being the
//!   leader at once, before any other candidate may consider the Lease
//!   expired. Every API call is bounded by the time left to that deadline,
//!   so a hung connection cannot keep a stale leader acting.
//! - A leadership ends for good: once lost, [`Leadership::changed`]
//!   reports `false` and the elector stops. The service stops everything
//!   it runs as the leader, waits until it is gone, and only then starts a
//!   new [`Leadership`] to compete again: the next term never overlaps the
//!   last one's work.
//! - On a graceful stop the leader releases the Lease (empty holder), so a
//!   follower takes over within one `retry_period` instead of waiting for
//!   the Lease to expire.
//!
//! (kube-lease-manager was considered: it has no renew deadline, so a leader
//! cut off from the API server would go on acting past the Lease's expiry.)

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::{oneshot, watch};
use tracing::{debug, info, warn};

use super::{Error, Result};

/// Where the Lease is and how it is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This candidate's identity (unique among the candidates: pod name).
    pub identity: String,
    /// How long a Lease that is not renewed stays held.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it steps down.
    pub renew_deadline: Duration,
    /// Pause between attempts to take or renew the Lease.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults: 15 s, 10 s, 2 s.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The timing constraints that make the protocol safe.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.identity.is_empty() {
            return Err("the identity must not be empty".into());
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "the renew deadline ({:?}) must be shorter than the lease duration ({:?})",
                self.renew_deadline, self.lease_duration
            ));
        }
        if self.retry_period >= self.renew_deadline {
            return Err(format!(
                "the retry period ({:?}) must be shorter than the renew deadline ({:?})",
                self.retry_period, self.renew_deadline
            ));
        }
        if self.lease_duration < Duration::from_secs(1) {
            return Err("the lease duration must be at least 1 s".into());
        }
        Ok(())
    }
}

/// A running candidate. [`Leadership::changed`] reports each change;
/// [`Leadership::release`] gives the Lease up (if held) and stops.
pub struct Leadership {
    state: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Leadership {
    /// Starts competing for the Lease.
    pub fn start(kube_config: kube::Config, config: LeaseConfig) -> Result<Self> {
        let client = Client::try_from(kube_config).map_err(|e| Error::Client(Box::new(e)))?;
        config.check().map_err(|detail| Error::Malformed {
            what: format!("lease {}/{}", config.namespace, config.name),
            detail,
        })?;
        let (tx, state) = watch::channel(false);
        let (stop, stopped) = oneshot::channel();
        let elector = Elector {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
        };
        let task = tokio::spawn(elector.run(tx, stopped));
        Ok(Self {
            state,
            stop: Some(stop),
            task,
        })
    }

    /// Whether this candidate leads now.
    pub fn is_leader(&self) -> bool {
        *self.state.borrow()
    }

    /// Waits for the next change and returns the new state. After
    /// leadership is lost it stays `false` and this never returns again.
    pub async fn changed(&mut self) -> bool {
        if self.state.changed().await.is_err() {
            // The elector stopped; nothing will change any more.
            std::future::pending::<()>().await;
        }
        *self.state.borrow_and_update()
    }

    /// Releases the Lease if held (bounded by `limit`) and stops.
    pub async fn release(mut self, limit: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(limit, &mut self.task).await.is_err() {
            warn!("releasing the lease did not finish in time; it expires on its own");
            self.task.abort();
        }
    }
}

struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The holder's record as last seen, and when (local clock).
    observed: Option<(Record, Instant)>,
}

/// What identifies one renewal of the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    holder: String,
    renew_time: Option<Timestamp>,
    transitions: i32,
}

impl Record {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_default(),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
        }
    }
}

impl Elector {
    async fn run(mut self, tx: watch::Sender<bool>, mut stopped: oneshot::Receiver<()>) {
        let name = format!("{}/{}", self.config.namespace, self.config.name);
        // Candidate: try until the Lease is ours. An error is reported when
        // it first appears or changes (missing RBAC, API server down), not
        // on every retry.
        let mut last_error = None;
        let taken = loop {
            let sent = Instant::now();
            let attempt = self.try_acquire_or_renew(self.config.retry_period * 2);
            tokio::select! {
                _ = &mut stopped => return,
                r = attempt => match r {
                    Ok(true) => break sent,
                    Ok(false) => last_error = None,
                    Err(e) => {
                        let text = e.to_string();
                        if last_error.as_ref() != Some(&text) {
                            warn!(lease = %name, error = %text, "cannot take part in leader election; retrying");
                        } else {
                            debug!(lease = %name, error = %text, "could not take the lease");
                        }
                        last_error = Some(text);
                    }
                },
            }
            tokio::select! {
                _ = &mut stopped => return,
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
        };
        info!(lease = %name, identity = %self.config.identity, "became the leader");
        let _ = tx.send(true);

        // Leader: renew until the deadline passes without a renewal.
        let mut renewed = taken;
        loop {
            tokio::select! {
                _ = &mut stopped => {
                    self.release().await;
                    let _ = tx.send(false);
                    return;
                }
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
            let left = self.config.renew_deadline.saturating_sub(renewed.elapsed());
            if left.is_zero() {
                break;
            }
            // The renewal counts from when it was sent: the Lease's new
            // term may start any time after that.
            let sent = Instant::now();
            match self.try_acquire_or_renew(left).await {
                Ok(true) => renewed = sent,
                Ok(false) => {
                    warn!(lease = %name, "another candidate holds the lease");
                    break;
                }
                Err(e) => warn!(lease = %name, error = %e, "renewing the lease failed"),
            }
        }
        warn!(lease = %name, identity = %self.config.identity, "no longer the leader");
        let _ = tx.send(false);
    }

    /// One attempt, bounded by `limit`: `Ok(true)` when this candidate holds
    /// the Lease afterwards.
    async fn try_acquire_or_renew(&mut self, limit: Duration) -> Result<bool> {
        let what = format!("lease {}/{}", self.config.namespace, self.config.name);
        match tokio::time::timeout(limit, self.attempt(&what)).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                what,
                timeout_ms: limit.as_millis() as u64,
            }),
        }
    }

    async fn attempt(&mut self, what: &str) -> Result<bool> {
        let now = MicroTime(Timestamp::now());
        let me = &self.config.identity;
        let duration_s = self.config.lease_duration.as_secs_f64().ceil() as i32;
        let existing = match self.api.get_opt(&self.config.name).await {
            Ok(l) => l,
            Err(e) => return Err(Error::from_kube(format!("get {what}"), e)),
        };
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(duration_s),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observed = Some((Record::of(&created), Instant::now()));
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(Error::from_kube(format!("create {what}"), e)),
            };
        };

        let record = Record::of(&lease);
        if self.observed.as_ref().map(|(r, _)| r) != Some(&record) {
            self.observed = Some((record.clone(), Instant::now()));
        }
        let held_by_other = !record.holder.is_empty() && record.holder != *me;
        if held_by_other {
            let seen = self
                .observed
                .as_ref()
                .map_or_else(Instant::now, |(_, at)| *at);
            let their_duration = lease
                .spec
                .as_ref()
                .and_then(|s| s.lease_duration_seconds)
                .map_or(self.config.lease_duration, |s| {
                    Duration::from_secs(s.max(0) as u64)
                });
            if seen.elapsed() < their_duration {
                return Ok(false);
            }
            info!(lease = %what, holder = %record.holder, "the lease expired; taking it");
        }

        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if record.holder != *me {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(record.transitions + 1);
        }
        spec.holder_identity = Some(me.clone());
        spec.lease_duration_seconds = Some(duration_s);
        spec.renew_time = Some(now);
        // `replace` carries the resourceVersion read above: a concurrent
        // writer makes this fail with 409 instead of both succeeding.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                self.observed = Some((Record::of(&updated), Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(Error::from_kube(format!("update {what}"), e)),
        }
    }

    /// Gives the Lease up: empty holder, so the next candidate need not wait
    /// for it to expire.
    async fn release(&mut self) {
        let what = format!("lease {}/{}", self.config.namespace, self.config.name);
        let release = async {
            let mut lease = self.api.get(&self.config.name).await?;
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            self.api
                .replace(&self.config.name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        };
        match tokio::time::timeout(self.config.renew_deadline, release).await {
            Ok(Ok(())) => info!(lease = %what, "released the lease"),
            Ok(Err(e)) => {
                warn!(lease = %what, error = %e, "releasing the lease failed; it expires on its own")
            }
            Err(_) => warn!(lease = %what, "releasing the lease timed out; it expires on its own"),
        }
    }
}
