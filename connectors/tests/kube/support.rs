//! What the Kubernetes connector's tests share on top of
//! `lockstep_testkit::kube`: the observer as the tests run it and what it
//! sent, the nodes a log describes, the actuator, and failure checks.

use std::collections::BTreeMap;
use std::time::Duration;

use lockstep_connectors::kube::{
    Actuator, ActuatorConfig, Observation, ObserveSpec, Observer, ObserverConfig, ScaleKind,
};
use lockstep_schemas::{
    ActionOutcome, Connector, Domain, Event, KubeNode, KubePod, OutcomeResult, Policy, Source,
};
use lockstep_testkit::kube::{ControlPlane, NS, TEST_LABEL, ZONE};
use lockstep_testkit::Proxy;
use tokio::sync::{mpsc, watch};

/// A kube client configuration for a control plane, read with lockstep's
/// own loader.
pub trait KubeConfig {
    /// The configuration of the cluster-admin kubeconfig up.sh wrote.
    async fn kube_config(&self) -> kube::Config;
}

impl KubeConfig for ControlPlane {
    async fn kube_config(&self) -> kube::Config {
        lockstep_connectors::kube::load_config(Some(&self.kubeconfig))
            .await
            .expect("kubeconfig written by up.sh loads")
    }
}

/// A kube client configuration that goes through a [`Proxy`].
pub trait Through {
    /// `c` with its server moved to the proxy.
    fn config(&self, c: kube::Config) -> kube::Config;
}

impl Through for Proxy {
    fn config(&self, mut c: kube::Config) -> kube::Config {
        // The serving certificate is for IP 127.0.0.1, any port.
        c.cluster_url = format!("https://{}", self.addr).parse().expect("uri");
        c
    }
}

/// What the tests observe: the default policy plus a watched node
/// condition, a node-name label, a zone label and a rack annotation,
/// restricted to the objects labelled `lockstep-test=<run>`.
pub fn spec(run: &str) -> ObserveSpec {
    let mut policy = Policy::default();
    policy.health.node_conditions = vec!["GpuXid".to_owned()];
    policy.mapping.node_name_label = Some("slurm.node".to_owned());
    let selector = format!("{TEST_LABEL}={run}");
    policy.mapping.pod_selector = selector.clone();
    let mut spec = ObserveSpec::from_policy(&policy, &[ZONE, "annotation:lockstep.io/rack"]);
    spec.node_selector = Some(selector.clone());
    spec.namespace = Some(NS.to_owned());
    spec.scale_selector = Some(selector);
    spec
}

pub fn test_observer_config() -> ObserverConfig {
    ObserverConfig {
        backoff_initial_ms: 100,
        backoff_max_ms: 1_000,
        probe_interval_ms: 200,
        probe_timeout_ms: 2_000,
        connect_timeout_ms: 2_000,
        ..ObserverConfig::default()
    }
}

/// A running observer and everything it sent so far.
pub struct Watch {
    rx: mpsc::Receiver<Observation>,
    /// Everything it sent so far.
    pub seen: Vec<Event>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long a test waits for what it expects.
pub const WAIT: Duration = Duration::from_secs(20);

impl Watch {
    /// Starts an observer of `spec` on its own task.
    pub fn start(config: kube::Config, spec: ObserveSpec) -> Self {
        let observer = Observer::new(config, spec, test_observer_config()).expect("observer");
        let (tx, rx) = mpsc::channel(1024);
        Self {
            rx,
            seen: Vec::new(),
            task: tokio::spawn(observer.run(tx)),
        }
    }

    /// An observer that watches what `specs` names, as the service runs it.
    pub fn following(config: kube::Config, specs: watch::Receiver<ObserveSpec>) -> Self {
        let spec = specs.borrow().clone();
        let observer = Observer::new(config, spec, test_observer_config()).expect("observer");
        let (tx, rx) = mpsc::channel(1024);
        Self {
            rx,
            seen: Vec::new(),
            task: tokio::spawn(observer.run_following(specs, tx)),
        }
    }

    /// The next event, if one comes before `deadline`.
    pub async fn recv(&mut self, deadline: tokio::time::Instant) -> Option<Event> {
        match tokio::time::timeout_at(deadline, self.rx.recv()).await {
            Ok(Some(Observation {
                source,
                observed_ms,
                event,
            })) => {
                assert_eq!(source, Source::Kubernetes);
                assert!(
                    observed_ms > 1_600_000_000_000,
                    "observed_ms is wall-clock ms"
                );
                self.seen.push(event.clone());
                Some(event)
            }
            Ok(None) => panic!("observer stopped; events so far:\n{}", self.history()),
            Err(_) => None,
        }
    }

    /// The last events it sent, one a line.
    pub fn history(&self) -> String {
        let from = self.seen.len().saturating_sub(60);
        self.seen[from..]
            .iter()
            .map(|e| format!("  {}", e.summary()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The next event matching `pred`, within `WAIT`; panics otherwise.
    pub async fn next(&mut self, what: &str, pred: impl Fn(&Event) -> bool) -> Event {
        let deadline = tokio::time::Instant::now() + WAIT;
        while let Some(e) = self.recv(deadline).await {
            if pred(&e) {
                return e;
            }
        }
        panic!(
            "no {what} within {WAIT:?}; last events:\n{}",
            self.history()
        )
    }

    /// The next observation of node `name` that satisfies `pred`.
    pub async fn node(
        &mut self,
        name: &str,
        what: &str,
        pred: impl Fn(&KubeNode) -> bool,
    ) -> KubeNode {
        match self
            .next(
                what,
                |e| matches!(e, Event::KubeNode(n) if n.name == name && pred(n)),
            )
            .await
        {
            Event::KubeNode(n) => n,
            _ => unreachable!(),
        }
    }

    /// The next observation of pod `name` that satisfies `pred`.
    pub async fn pod(
        &mut self,
        name: &str,
        what: &str,
        pred: impl Fn(&KubePod) -> bool,
    ) -> KubePod {
        match self
            .next(
                what,
                |e| matches!(e, Event::KubePod(p) if p.name == name && pred(p)),
            )
            .await
        {
            Event::KubePod(p) => p,
            _ => unreachable!(),
        }
    }

    /// Waits for the end of a listing of `domain`.
    pub async fn synced(&mut self, domain: Domain) {
        self.next(
            &format!("SyncDone {domain:?}"),
            |e| matches!(e, Event::SyncDone { domain: d } if *d == domain),
        )
        .await;
    }

    /// Waits for the connector to report the API server (in)visible.
    pub async fn visible(&mut self, visible: bool) -> Event {
        self.next(&format!("ConnectorStatus visible={visible}"), |e| {
            matches!(e, Event::ConnectorStatus { connector: Connector::Kubernetes, visible: v, .. } if *v == visible)
        })
        .await
    }

    /// Everything sent within `d`.
    pub async fn quiet(&mut self, d: Duration) -> Vec<Event> {
        let deadline = tokio::time::Instant::now() + d;
        let mut got = Vec::new();
        while let Some(e) = self.recv(deadline).await {
            got.push(e);
        }
        got
    }

    /// Waits until the nodes the log describes (folded as the reducer
    /// folds them) satisfy `pred`.
    pub async fn converge(
        &mut self,
        what: &str,
        pred: impl Fn(&BTreeMap<String, KubeNode>) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if pred(&mirror_nodes(&self.seen)) {
                return;
            }
            if self.recv(deadline).await.is_none() {
                panic!(
                    "nodes did not converge to {what}; folded: {:?}\nlast events:\n{}",
                    mirror_nodes(&self.seen).keys().collect::<Vec<_>>(),
                    self.history()
                );
            }
        }
    }
}

/// The Kubernetes nodes a log describes, folded with the reducer's rules:
/// `*Gone` removes, and whatever a `SyncStarted` .. `SyncDone` listing did
/// not list is gone.
pub fn mirror_nodes(events: &[Event]) -> BTreeMap<String, KubeNode> {
    let mut nodes: BTreeMap<String, (KubeNode, u32)> = BTreeMap::new();
    let (mut gen, mut listing) = (0, false);
    for e in events {
        match e {
            Event::KubeNode(n) => {
                nodes.insert(n.name.to_string(), (n.clone(), gen));
            }
            Event::KubeNodeGone { name, .. } => {
                nodes.remove(name);
            }
            Event::SyncStarted {
                domain: Domain::KubeNodes,
            } => {
                gen += 1;
                listing = true;
            }
            Event::SyncDone {
                domain: Domain::KubeNodes,
            } if listing => {
                nodes.retain(|_, (_, g)| *g == gen);
                listing = false;
            }
            _ => {}
        }
    }
    nodes.into_iter().map(|(k, (n, _))| (k, n)).collect()
}

/// lockstep's Kubernetes actuator on `cp`, StatefulSets as scale targets.
pub async fn actuator(cp: &ControlPlane) -> Actuator {
    Actuator::new(
        cp.kube_config().await,
        vec![ScaleKind::stateful_set()],
        ActuatorConfig::default(),
    )
    .expect("actuator")
}

#[track_caller]
/// `o` failed, retryably or not, with a lowercase message containing
/// `contains`.
pub fn assert_failed(o: &ActionOutcome, retryable: bool, contains: &str) {
    match &o.result {
        OutcomeResult::Failed {
            retryable: r,
            error,
        } => {
            assert_eq!(*r, retryable, "retryable of {error:?}");
            assert!(
                error.contains(contains),
                "{error:?} should contain {contains:?}"
            );
            assert!(
                error.chars().next().is_some_and(|c| !c.is_uppercase()),
                "lowercase message: {error:?}"
            );
        }
        other => panic!("expected failure ({contains}), got {other:?}"),
    }
}
