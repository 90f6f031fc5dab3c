//! The Kubernetes observer: kube-runtime watchers on nodes, slurmd pods and
//! scale targets, reduced, deduplicated and sent on as observation events.
//!
//! One task runs all watchers, merged into one stream, so the trackers need
//! no locks and the output channel's bound is the only queue: when the
//! consumer is slow, the watchers are not polled and the API server's TCP
//! window fills (backpressure, not memory).
//!
//! Recovery is kube-runtime's: a broken watch is restarted from its last
//! resourceVersion, a `410 Gone` (or any desync) starts a new listing, which
//! the trackers turn into `SyncStarted` .. objects .. `*Gone` .. `SyncDone`.
//! Every failed call waits a bounded, growing delay ([`ObserverConfig`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{AbortHandle, BoxStream, SelectAll};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::lifecycle::v1alpha1::Eviction;
use k8s_openapi::api::resource::v1::{DeviceTaintRule, ResourceSlice};
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::Client;
use lockstep_schemas::{
    Connector, Domain, Event, KubeNode, KubePod, KubeScaleTarget, ScaleTargetRef, Source,
};
use tokio::sync::{mpsc, watch};

use super::devices::Devices;
use super::discover::discover;
use super::error::{Error, Result};
use super::evictions::Evictions;
use super::reduce;
use super::spec::{ChangedWatches, ObserveSpec, ScaleKind};
use super::tracker::{Step, Tracker};
use crate::backoff::Backoff;
use crate::clock::now_ms;
use crate::diff::Observed;
use crate::observation::Observation;

/// Bounds of the observer: timeouts, backoff, page size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObserverConfig {
    /// First delay after a failed list or watch call.
    pub backoff_initial_ms: u64,
    /// Upper bound of the delay; it doubles per consecutive failure.
    pub backoff_max_ms: u64,
    /// The delay starts again from `backoff_initial_ms` once no call has
    /// failed for this long.
    pub backoff_reset_after_ms: u64,
    /// Server-side timeout of one watch call; the watcher then resumes from
    /// its resourceVersion. Also bounds how long a silently dead connection
    /// goes unnoticed (plus a few seconds).
    pub watch_timeout_s: u32,
    /// Objects per list page during a listing.
    pub page_size: u32,
    /// Timeout to connect to the API server.
    pub connect_timeout_ms: u64,
    /// While the API server cannot be seen, how often to check whether it is
    /// back.
    pub probe_interval_ms: u64,
    /// Timeout of one such check.
    pub probe_timeout_ms: u64,
    /// Use streaming lists (`sendInitialEvents`, Kubernetes 1.27+) for
    /// listings instead of paginated lists.
    pub streaming_lists: bool,
    /// A watcher that gets this many server errors (5xx) in a row inside
    /// its watch, with nothing in between, starts over with a new listing.
    /// kube-runtime's watcher retries such a watch from the same
    /// resourceVersion forever; with watches served from etcd, a delete
    /// whose previous version was compacted away gives a 500 every time.
    pub watch_server_errors_max: u32,
}

impl Default for ObserverConfig {
    fn default() -> Self {
        Self {
            backoff_initial_ms: 250,
            backoff_max_ms: 15_000,
            backoff_reset_after_ms: 60_000,
            watch_timeout_s: 290,
            page_size: 500,
            connect_timeout_ms: 5_000,
            probe_interval_ms: 1_000,
            probe_timeout_ms: 5_000,
            streaming_lists: false,
            watch_server_errors_max: 5,
        }
    }
}

/// Watches Kubernetes and sends observation events.
pub struct Observer {
    client: Client,
    spec: Arc<ObserveSpec>,
    config: ObserverConfig,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("spec", &self.spec)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// An observer of what `spec` names, talking to the cluster of
    /// `kube_config` (see [`load_config`](super::load_config)).
    pub fn new(
        mut kube_config: kube::Config,
        mut spec: ObserveSpec,
        config: ObserverConfig,
    ) -> Result<Self> {
        spec.normalize();
        kube_config.connect_timeout = Some(Duration::from_millis(config.connect_timeout_ms));
        // Every read is bounded: a watch call ends server-side after
        // `watch_timeout_s`, so a read that waits longer than that (plus a
        // margin) is a dead connection. Lists are bounded by the same value.
        kube_config.read_timeout =
            Some(Duration::from_secs(u64::from(config.watch_timeout_s) + 30));
        kube_config.reset_reader_on_write = true;
        // Requests are small: one that cannot be written within twice the
        // connect timeout is on a dead connection.
        kube_config.write_timeout = Some(Duration::from_millis(
            config.connect_timeout_ms.saturating_mul(2),
        ));
        let client = Client::try_from(kube_config).map_err(|e| Error::Client(Box::new(e)))?;
        Ok(Self {
            client,
            spec: Arc::new(spec),
            config,
        })
    }

    /// Watches until `tx` is closed, sending every observation to it.
    ///
    /// Never gives up on the API server: failures are retried with bounded
    /// backoff, and reported as [`Event::ConnectorStatus`] when they mean
    /// lockstep cannot see the cluster.
    pub async fn run(self, tx: mpsc::Sender<Observation>) {
        // A spec nobody changes.
        let (_unchanged, specs) = watch::channel((*self.spec).clone());
        self.run_following(specs, tx).await;
    }

    /// [`Observer::run`], watching what `specs` names from now on: when it
    /// changes (the policy in force changed), the watches whose parameters
    /// differ restart under the new spec ([`ObserveSpec::changed_watches`]),
    /// and the others go on undisturbed. A restarted watch lists again: every
    /// object it watches is re-emitted as the new spec reduces it, and what it
    /// no longer watches is gone.
    pub async fn run_following(
        mut self,
        mut specs: watch::Receiver<ObserveSpec>,
        tx: mpsc::Sender<Observation>,
    ) {
        let mut out = Vec::new();
        let mut first = specs.borrow_and_update().clone();
        first.normalize();
        self.spec = Arc::new(first);
        let mut state = State::new(&self.spec);
        let mut watches = Watches::default();
        self.start_watches(ChangedWatches::ALL, &mut watches);
        let mut following = true;
        let mut probe: Option<Pin<Box<dyn Future<Output = Result<()>> + Send>>> = None;
        let mut next_probe = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = tx.closed() => return,
                item = watches.merged.next() => match item {
                    Some(item) => state.handle(item, &mut out),
                    // The watchers never end; if they all did, there is
                    // nothing left to observe.
                    None => return,
                },
                changed = specs.changed(), if following => match changed {
                    Ok(()) => {
                        let spec = specs.borrow_and_update().clone();
                        self.follow(spec, &mut state, &mut watches, &mut out);
                    }
                    // Nobody changes it any more: what is watched stays.
                    Err(_) => following = false,
                },
                result = async { probe.as_mut().expect("guarded").await }, if probe.is_some() => {
                    probe = None;
                    next_probe = tokio::time::Instant::now()
                        + Duration::from_millis(self.config.probe_interval_ms);
                    state.probed(result, &mut out);
                },
                () = tokio::time::sleep_until(next_probe), if probe.is_none() && state.blind() => {
                    probe = Some(Box::pin(probe_api(
                        self.client.clone(),
                        Arc::clone(&self.spec),
                        self.config.probe_timeout_ms,
                    )));
                },
            }
            for event in out.drain(..) {
                if tx
                    .send(Observation::new(Source::Kubernetes, now_ms(), event))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }

    /// Watches what `spec` names from now on: restarts the watches it
    /// changes, and gives up those it no longer wants.
    fn follow(
        &mut self,
        mut spec: ObserveSpec,
        state: &mut State,
        watches: &mut Watches,
        out: &mut Vec<Event>,
    ) {
        spec.normalize();
        let changed = self.spec.changed_watches(&spec);
        if !changed.any() {
            return;
        }
        tracing::info!(
            nodes = changed.nodes,
            pods = changed.pods,
            scale_targets = changed.scale_targets,
            "the policy changes what is watched in kubernetes; restarting those watches"
        );
        state.respec(&self.spec, &spec, changed, out);
        self.spec = Arc::new(spec);
        self.start_watches(changed, watches);
    }

    /// (Re)starts the watches `which` names under the current spec, each
    /// after stopping its predecessor.
    fn start_watches(&self, which: ChangedWatches, watches: &mut Watches) {
        if which.nodes {
            if let Some(h) = watches.nodes.take() {
                h.abort();
            }
            watches.nodes = Some(watches.add(self.node_watch()));
            for h in std::mem::take(&mut watches.devices) {
                h.abort();
            }
            if self.spec.device_faults {
                watches.devices = self
                    .device_watches()
                    .into_iter()
                    .map(|w| watches.add(w))
                    .collect();
            }
        }
        if which.pods {
            if let Some(h) = watches.pods.take() {
                h.abort();
            }
            watches.pods = self.pod_watch().map(|w| watches.add(w));
            if let Some(h) = watches.evictions.take() {
                h.abort();
            }
            watches.evictions = self.eviction_watch().map(|w| watches.add(w));
        }
        if which.scale_targets {
            for handle in std::mem::take(&mut watches.scale_targets) {
                handle.abort();
            }
            watches.scale_targets = self
                .scale_target_watches()
                .into_iter()
                .map(|w| watches.add(w))
                .collect();
        }
    }

    /// A watcher on `api`, restarted when stuck, with bounded backoff.
    fn watch<K>(
        &self,
        api: Api<K>,
        selector: Option<&str>,
    ) -> impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        watch_with(&self.config, api, selector)
    }

    fn node_watch(&self) -> BoxStream<'static, Item> {
        let spec = Arc::clone(&self.spec);
        let nodes: Api<Node> = Api::all(self.client.clone());
        self.watch(nodes, spec.node_selector.as_deref())
            .map(move |r| match r {
                Ok(e) => Item::Node(step(e, |n| {
                    reduce::node(n, &spec).map(|o| (o.name.to_string(), o))
                })),
                Err(e) => Item::Failed(Domain::KubeNodes, e),
            })
            .boxed()
    }

    /// The ResourceSlice and DeviceTaintRule watches (`health.device_faults`).
    fn device_watches(&self) -> [BoxStream<'static, Item>; 2] {
        let slices: Api<ResourceSlice> = Api::all(self.client.clone());
        let rules: Api<DeviceTaintRule> = Api::all(self.client.clone());
        let failed = |e| Item::Failed(Domain::KubeNodes, e);
        [
            self.watch(slices, None)
                .map(move |r| r.map_or_else(failed, Item::Slice))
                .boxed(),
            self.watch(rules, None)
                .map(move |r| r.map_or_else(failed, Item::Rule))
                .boxed(),
        ]
    }

    /// The Eviction watch (`drain.eviction_responder`): the Evictions
    /// labelled with the responder's name, as Kubernetes labels those of
    /// every participant.
    fn eviction_watch(&self) -> Option<BoxStream<'static, Item>> {
        let responder = self.spec.eviction_responder.as_deref()?;
        let evictions: Api<Eviction> = match &self.spec.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        Some(
            self.watch(evictions, Some(responder))
                .map(|r| r.map_or_else(|e| Item::Failed(Domain::KubePods, e), Item::Eviction))
                .boxed(),
        )
    }

    /// The pod watch; none without a pod selector.
    fn pod_watch(&self) -> Option<BoxStream<'static, Item>> {
        let selector = self.spec.pod_selector.as_deref()?;
        let spec = Arc::clone(&self.spec);
        let pods: Api<Pod> = match &self.spec.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        Some(
            self.watch(pods, Some(selector))
                .map(move |r| match r {
                    Ok(e) => Item::Pod(step(e, |p| {
                        reduce::pod(p, &spec).map(|o| ((o.namespace.clone(), o.name.clone()), o))
                    })),
                    Err(e) => Item::Failed(Domain::KubePods, e),
                })
                .boxed(),
        )
    }

    /// One watch per kind of scale target, in the spec's order. A kind to
    /// discover is watched once discovery says which version and resource
    /// serve it; until then (its CRD not installed) its watch waits and asks
    /// again with bounded backoff, and the other watches go on.
    fn scale_target_watches(&self) -> Vec<BoxStream<'static, Item>> {
        let mut streams = Vec::new();
        for (i, kind) in self.spec.scale_kinds.iter().enumerate() {
            let (client, config) = (self.client.clone(), self.config.clone());
            let namespace = self.spec.namespace.clone();
            let selector = self.spec.scale_selector.clone();
            let watch = move |kind: ScaleKind| {
                let ar = kind.api_resource();
                let api: Api<DynamicObject> = match &namespace {
                    Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                    None => Api::all_with(client.clone(), &ar),
                };
                watch_with(&config, api, selector.as_deref())
                    .map(move |r| match r {
                        Ok(e) => Item::Scale(
                            i,
                            step(e, |o| {
                                reduce::scale_target(o, &kind).map(|t| (t.target.clone(), t))
                            }),
                        ),
                        Err(e) => Item::Failed(Domain::KubeScaleTargets, e),
                    })
                    .boxed()
            };
            if kind.needs_discovery() {
                let found = discovered(self.client.clone(), kind.clone(), self.config.clone());
                streams.push(futures::stream::once(found).flat_map(watch).boxed());
            } else {
                streams.push(watch(kind.clone()));
            }
        }
        streams
    }
}

/// The running watches, merged into one stream (one task, no locks); each
/// can be stopped on its own.
#[derive(Default)]
struct Watches {
    merged: SelectAll<BoxStream<'static, Item>>,
    nodes: Option<AbortHandle>,
    devices: Vec<AbortHandle>,
    pods: Option<AbortHandle>,
    evictions: Option<AbortHandle>,
    scale_targets: Vec<AbortHandle>,
}

impl Watches {
    /// Merges `watch` in. Its handle stops it: it yields nothing more, and
    /// leaves the merged stream the next time that is polled.
    fn add(&mut self, watch: BoxStream<'static, Item>) -> AbortHandle {
        let (watch, handle) = futures::stream::abortable(watch);
        self.merged.push(watch.boxed());
        handle
    }
}

/// The watcher configuration of `config` for objects matching `selector`.
fn watcher_config(config: &ObserverConfig, selector: Option<&str>) -> watcher::Config {
    let mut c = watcher::Config::default()
        .timeout(config.watch_timeout_s)
        .page_size(config.page_size);
    if let Some(s) = selector {
        c = c.labels(s);
    }
    if config.streaming_lists {
        c = c.streaming_lists();
    }
    c
}

/// A watcher on `api`, restarted when stuck, with bounded backoff.
fn watch_with<K>(
    config: &ObserverConfig,
    api: Api<K>,
    selector: Option<&str>,
) -> impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let watcher_config = watcher_config(config, selector);
    restarting(
        move || watcher(api.clone(), watcher_config.clone()).boxed(),
        config.watch_server_errors_max,
    )
    .backoff(WatchBackoff::new(config))
}

/// `kind` as discovery gives it, asked until it answers: each failure waits
/// the observer's backoff (up to `backoff_max_ms`). The first failure is a
/// warning, the ones after it debug lines.
async fn discovered(client: Client, kind: ScaleKind, config: ObserverConfig) -> ScaleKind {
    let mut backoff = Backoff::new(config.backoff_initial_ms, config.backoff_max_ms);
    loop {
        match discover(&client, &kind).await {
            Ok(found) => {
                tracing::info!(
                    group = %found.group,
                    kind = %found.kind,
                    version = %found.version,
                    resource = %found.plural,
                    "scale target kind discovered; watching it"
                );
                return found;
            }
            Err(e) if backoff.failures() == 0 => {
                tracing::warn!(error = %e, "scale target kind not watched yet; asking again");
            }
            Err(e) => tracing::debug!(error = %e, "scale target kind still not served"),
        }
        tokio::time::sleep(backoff.failed()).await;
    }
}

/// Loads a client configuration: from `kubeconfig` if given, else the usual
/// inference (`$KUBECONFIG`, `~/.kube/config`, in-cluster service account).
pub async fn load_config(kubeconfig: Option<&std::path::Path>) -> Result<kube::Config> {
    match kubeconfig {
        Some(path) => {
            let file =
                kube::config::Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
                    path: path.to_owned(),
                    source,
                })?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| Error::Kubeconfig {
                    path: path.to_owned(),
                    source,
                })
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::Client(Box::new(kube::Error::InferConfig(e)))),
    }
}

/// A watcher made by `make`, made anew (so it lists again) after
/// `server_errors_max` consecutive 5xx errors inside its watch. An `Init` is
/// no progress (the watcher emits it before trying to list).
fn restarting<K, F>(
    make: F,
    server_errors_max: u32,
) -> impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: Send + 'static,
    F: Fn() -> BoxStream<'static, watcher::Result<watcher::Event<K>>> + Send + 'static,
{
    let server_errors_max = server_errors_max.max(1);
    futures::stream::unfold(
        (make, None, 0u32),
        move |(make, current, errors)| async move {
            let mut stream = current.unwrap_or_else(&make);
            let item = stream.next().await?;
            let mut errors = errors;
            match &item {
                Err(watcher::Error::WatchError(status)) if status.code >= 500 => errors += 1,
                Err(_) | Ok(watcher::Event::Init) => {}
                Ok(_) => errors = 0,
            }
            let next = if errors >= server_errors_max {
                tracing::warn!(
                    errors,
                    "kubernetes watch keeps failing server-side; listing again"
                );
                errors = 0;
                None
            } else {
                Some(stream)
            };
            Some((item, (make, next, errors)))
        },
    )
}

/// One watcher's output, reduced.
enum Item {
    Node(Option<Step<String, KubeNode>>),
    Slice(watcher::Event<ResourceSlice>),
    Rule(watcher::Event<DeviceTaintRule>),
    Eviction(watcher::Event<Eviction>),
    Pod(Option<Step<(String, String), KubePod>>),
    Scale(usize, Option<Step<ScaleTargetRef, KubeScaleTarget>>),
    Failed(Domain, watcher::Error),
}

/// Reduces one watcher event; `None` for an object that cannot be keyed.
fn step<K, Key, O: Observed>(
    e: watcher::Event<K>,
    reduce: impl Fn(&K) -> Option<(Key, O)>,
) -> Option<Step<Key, O>> {
    Some(match e {
        watcher::Event::Init => Step::Init,
        watcher::Event::InitDone => Step::InitDone,
        watcher::Event::InitApply(o) => {
            let (k, o) = reduce(&o)?;
            Step::Listed(k, o)
        }
        watcher::Event::Apply(o) => {
            let (k, o) = reduce(&o)?;
            Step::Applied(k, o)
        }
        watcher::Event::Delete(o) => {
            let (k, o) = reduce(&o)?;
            Step::Deleted(k, o.version())
        }
    })
}

/// Whether lockstep currently sees the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sight {
    /// Nothing said yet (start).
    Unknown,
    /// The last call worked.
    Visible,
    /// A call failed in a way that means we cannot see; probing.
    Blind,
}

/// The observer's state: one tracker per watcher, and sight.
struct State {
    nodes: Tracker<KubeNode>,
    /// Each node's device faults, which its observation carries.
    devices: Devices,
    /// Each pod's eviction under way, which its observation carries.
    evictions: Evictions,
    pods: Tracker<KubePod>,
    scales: Vec<Tracker<KubeScaleTarget>>,
    sight: Sight,
}

impl State {
    fn new(spec: &ObserveSpec) -> Self {
        let shared = spec.scale_kinds.len() > 1;
        Self {
            nodes: Tracker::new(true),
            devices: Devices::default(),
            evictions: Evictions::new(spec.eviction_responder.as_deref().unwrap_or_default()),
            pods: Tracker::new(true),
            scales: spec
                .scale_kinds
                .iter()
                .map(|_| Tracker::new(!shared))
                .collect(),
            sight: Sight::Unknown,
        }
    }

    fn blind(&self) -> bool {
        self.sight == Sight::Blind
    }

    /// The spec changes from `old` to `new`: what the restarted watches
    /// will list again keeps its trackers (their next listing says what is
    /// gone); what is no longer watched at all is gone now.
    fn respec(
        &mut self,
        old: &ObserveSpec,
        new: &ObserveSpec,
        changed: ChangedWatches,
        out: &mut Vec<Event>,
    ) {
        if changed.pods && new.pod_selector.is_none() {
            self.pods.forget_all(out);
        }
        if changed.pods {
            self.evictions = Evictions::new(new.eviction_responder.as_deref().unwrap_or_default());
        }
        if changed.scale_targets {
            let shared = new.scale_kinds.len() > 1;
            let mut before: Vec<(&ScaleKind, Tracker<KubeScaleTarget>)> =
                old.scale_kinds.iter().zip(self.scales.drain(..)).collect();
            self.scales = new
                .scale_kinds
                .iter()
                .map(|kind| {
                    let mut t = match before.iter().position(|(k, _)| *k == kind) {
                        Some(i) => before.swap_remove(i).1,
                        None => Tracker::new(!shared),
                    };
                    t.set_sync_markers(!shared);
                    t
                })
                .collect();
            for (_, mut t) in before {
                t.forget_all(out);
            }
        }
    }

    fn handle(&mut self, item: Item, out: &mut Vec<Event>) {
        // Every step but Init means an answer from the API server (Init is
        // emitted before the list call is made).
        let (contact, n_before) = (
            !matches!(
                item,
                Item::Node(Some(Step::Init) | None)
                    | Item::Slice(watcher::Event::Init)
                    | Item::Rule(watcher::Event::Init)
                    | Item::Eviction(watcher::Event::Init)
                    | Item::Pod(Some(Step::Init) | None)
                    | Item::Scale(_, Some(Step::Init) | None)
                    | Item::Failed(..)
            ),
            out.len(),
        );
        // Once blind, only a probe that reads every watched kind restores
        // sight: one watcher's answer does not mean the others can read
        // (a missing RBAC rule on one kind would make sight flap).
        if contact && self.sight == Sight::Unknown {
            self.see(out);
        }
        match item {
            Item::Node(Some(s)) => {
                let s = match s {
                    Step::Listed(k, mut o) => {
                        o.devices = self.devices.of(&k);
                        Step::Listed(k, o)
                    }
                    Step::Applied(k, mut o) => {
                        o.devices = self.devices.of(&k);
                        Step::Applied(k, o)
                    }
                    s => s,
                };
                self.nodes.step(s, out);
            }
            Item::Slice(e) => {
                let changed = self.devices.slice(e);
                self.devices_changed(changed, out);
            }
            Item::Rule(e) => {
                let changed = self.devices.rule(e);
                self.devices_changed(changed, out);
            }
            Item::Pod(Some(s)) => {
                let with = |(ns, name): &(String, String), mut o: KubePod| {
                    o.eviction = self.evictions.of(ns, name, &o.uid);
                    o
                };
                let s = match s {
                    Step::Listed(k, o) => {
                        let o = with(&k, o);
                        Step::Listed(k, o)
                    }
                    Step::Applied(k, o) => {
                        let o = with(&k, o);
                        Step::Applied(k, o)
                    }
                    s => s,
                };
                self.pods.step(s, out);
            }
            Item::Eviction(e) => {
                for key in self.evictions.step(e) {
                    if let Some(mut o) = self.pods.get(&key).cloned() {
                        let eviction = self.evictions.of(&key.0, &key.1, &o.uid);
                        if eviction != o.eviction {
                            o.eviction = eviction;
                            self.pods.step(Step::Applied(key, o), out);
                        }
                    }
                }
            }
            Item::Scale(i, Some(s)) => self.scales[i].step(s, out),
            Item::Node(None) | Item::Pod(None) | Item::Scale(_, None) => {
                tracing::debug!("kubernetes object without a name ignored");
            }
            Item::Failed(domain, e) => self.failed(domain, e, out),
        }
        if out.len() > n_before {
            tracing::trace!(
                events = out.len() - n_before,
                nodes = self.nodes.len(),
                pods = self.pods.len(),
                "kubernetes observations"
            );
        }
    }

    /// The device faults of `nodes` changed: each node known is observed
    /// again with them (one not known yet gets them when it is).
    fn devices_changed(&mut self, nodes: Vec<String>, out: &mut Vec<Event>) {
        for name in nodes {
            if let Some(mut o) = self.nodes.get(&name).cloned() {
                o.devices = self.devices.of(&name);
                self.nodes.step(Step::Applied(name, o), out);
            }
        }
    }

    fn failed(&mut self, domain: Domain, e: watcher::Error, out: &mut Vec<Event>) {
        let what = format!("watch {}", domain.name());
        let (err, in_stream) = match e {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => (Error::from_kube(what, e), false),
            // An error event inside a working watch (410 Gone: the watcher
            // relists; 504 while the server's cache warms up): the server
            // answered, so this says nothing about sight.
            watcher::Error::WatchError(status) => {
                (Error::from_kube(what, kube::Error::Api(status)), true)
            }
            watcher::Error::NoResourceVersion => (
                Error::Malformed {
                    what,
                    detail: "object without resourceVersion; relisting".to_owned(),
                },
                true,
            ),
        };
        if !in_stream && err.blinds() {
            if self.sight != Sight::Blind {
                tracing::warn!(error = %err, "kubernetes api out of sight");
                self.sight = Sight::Blind;
                out.push(Event::ConnectorStatus {
                    connector: Connector::Kubernetes,
                    visible: false,
                    detail: err.to_string(),
                });
            }
        } else {
            tracing::info!(error = %err, "kubernetes watch restarts");
        }
    }

    fn probed(&mut self, result: Result<()>, out: &mut Vec<Event>) {
        match result {
            Ok(()) => self.see(out),
            Err(e) => tracing::debug!(error = %e, "kubernetes api still out of sight"),
        }
    }

    fn see(&mut self, out: &mut Vec<Event>) {
        if self.sight != Sight::Visible {
            if self.sight == Sight::Blind {
                tracing::info!("kubernetes api in sight again");
            }
            self.sight = Sight::Visible;
            out.push(Event::ConnectorStatus {
                connector: Connector::Kubernetes,
                visible: true,
                detail: String::new(),
            });
        }
    }
}

/// Whether every watched kind can be read (one object of each).
async fn probe_api(client: Client, spec: Arc<ObserveSpec>, timeout_ms: u64) -> Result<()> {
    let what = "probe kubernetes api";
    let one = ListParams::default().limit(1);
    let reads = async {
        Api::<Node>::all(client.clone())
            .list_metadata(&one)
            .await
            .map_err(|e| Error::from_kube("probe: list nodes", e))?;
        if spec.pod_selector.is_some() {
            let pods: Api<Pod> = match &spec.namespace {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            };
            pods.list_metadata(&one)
                .await
                .map_err(|e| Error::from_kube("probe: list pods", e))?;
        }
        // A kind still to discover is not watched yet: nothing to read (its
        // CRD may be missing, which is not blindness).
        for kind in spec.scale_kinds.iter().filter(|k| !k.needs_discovery()) {
            let ar = kind.api_resource();
            let api: Api<DynamicObject> = match &spec.namespace {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                None => Api::all_with(client.clone(), &ar),
            };
            api.list_metadata(&one)
                .await
                .map_err(|e| Error::from_kube(format!("probe: list {}", kind.plural), e))?;
        }
        if spec.eviction_responder.is_some() {
            let evictions: Api<Eviction> = match &spec.namespace {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            };
            evictions
                .list_metadata(&one)
                .await
                .map_err(|e| Error::from_kube("probe: list evictions", e))?;
        }
        if spec.device_faults {
            Api::<ResourceSlice>::all(client.clone())
                .list_metadata(&one)
                .await
                .map_err(|e| Error::from_kube("probe: list resourceslices", e))?;
            Api::<DeviceTaintRule>::all(client.clone())
                .list_metadata(&one)
                .await
                .map_err(|e| Error::from_kube("probe: list devicetaintrules", e))?;
        }
        Ok(())
    };
    match tokio::time::timeout(Duration::from_millis(timeout_ms), reads).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            what: what.to_owned(),
            timeout_ms,
        }),
    }
}

/// Exponential backoff for one watcher, bounded by `backoff_max_ms`.
///
/// It ignores the per-item resets of kube-runtime's `StreamBackoff`: a
/// watcher emits `Init` (an `Ok`) before every list attempt, so resetting on
/// each `Ok` would keep an outage at the initial delay forever. It starts
/// over instead once no failure has happened for `backoff_reset_after_ms`.
struct WatchBackoff {
    backoff: Backoff,
    reset_after: Duration,
    last_failure: Option<tokio::time::Instant>,
}

impl WatchBackoff {
    fn new(c: &ObserverConfig) -> Self {
        Self {
            backoff: Backoff::new(c.backoff_initial_ms, c.backoff_max_ms),
            reset_after: Duration::from_millis(c.backoff_reset_after_ms),
            last_failure: None,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = tokio::time::Instant::now();
        if self
            .last_failure
            .is_some_and(|t| now.duration_since(t) > self.reset_after)
        {
            self.backoff.reset();
        }
        self.last_failure = Some(now);
        Some(self.backoff.failed())
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watcher_stuck_on_server_errors_starts_over() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let made = Arc::new(AtomicU32::new(0));
        let status = |code| {
            Err(watcher::Error::WatchError(Box::new(kube::core::Status {
                code,
                ..kube::core::Status::default()
            })))
        };
        let make = {
            let made = Arc::clone(&made);
            move || {
                made.fetch_add(1, Ordering::SeqCst);
                // Lists fine, then its watch fails server-side for ever.
                futures::stream::iter([Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)])
                    .chain(futures::stream::repeat_with(move || status(500)))
                    .boxed()
            }
        };
        let got: Vec<&str> = restarting::<(), _>(make, 3)
            .take(12)
            .map(|r| match r {
                Ok(watcher::Event::Init) => "init",
                Ok(watcher::Event::InitDone) => "done",
                Ok(_) => "other",
                Err(_) => "500",
            })
            .collect()
            .await;
        assert_eq!(
            got,
            [
                "init", "done", "500", "500", "500", "init", "done", "500", "500", "500", "init",
                "done"
            ]
        );
        assert_eq!(made.load(Ordering::SeqCst), 3);

        // 410 and request errors do not count: kube-runtime handles them.
        let make = move || {
            futures::stream::iter([Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)])
                .chain(futures::stream::repeat_with(move || status(410)))
                .boxed()
        };
        let n_init = restarting::<(), _>(make, 3)
            .take(20)
            .filter(|r| std::future::ready(matches!(r, Ok(watcher::Event::Init))))
            .count()
            .await;
        assert_eq!(n_init, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_grows_to_its_bound_and_resets_after_quiet() {
        let mut b = WatchBackoff::new(&ObserverConfig {
            backoff_initial_ms: 100,
            backoff_max_ms: 1_000,
            backoff_reset_after_ms: 5_000,
            ..ObserverConfig::default()
        });
        let got: Vec<u64> = (0..6)
            .map(|_| u64::try_from(b.next().unwrap().as_millis()).unwrap())
            .collect();
        assert_eq!(got, [100, 200, 400, 800, 1_000, 1_000]);
        kube::runtime::utils::Backoff::reset(&mut b);
        assert_eq!(
            b.next(),
            Some(Duration::from_millis(1_000)),
            "Ok items do not reset"
        );
        tokio::time::advance(Duration::from_millis(5_001)).await;
        assert_eq!(b.next(), Some(Duration::from_millis(100)), "quiet resets");
    }

    fn blinding() -> watcher::Error {
        watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(kube::core::Status {
            code: 503,
            ..kube::core::Status::default()
        })))
    }

    #[test]
    fn sight_table() {
        let spec = ObserveSpec::from_policy(&lockstep_schemas::Policy::default(), &[]);
        let mut s = State::new(&spec);
        let mut out = Vec::new();
        let visible = |out: &mut Vec<Event>| -> Vec<bool> {
            out.drain(..)
                .filter_map(|e| match e {
                    Event::ConnectorStatus { visible, .. } => Some(visible),
                    _ => None,
                })
                .collect()
        };
        // Init is no contact.
        s.handle(Item::Node(Some(Step::Init)), &mut out);
        assert_eq!(visible(&mut out), Vec::<bool>::new());
        // The first answer says visible once.
        s.handle(Item::Node(Some(Step::InitDone)), &mut out);
        s.handle(Item::Pod(Some(Step::Init)), &mut out);
        s.handle(Item::Pod(Some(Step::InitDone)), &mut out);
        assert_eq!(visible(&mut out), vec![true]);
        // A 410 inside a watch is no loss of sight.
        let gone = watcher::Error::WatchError(Box::new(kube::core::Status {
            code: 410,
            ..kube::core::Status::default()
        }));
        s.handle(Item::Failed(Domain::KubeNodes, gone), &mut out);
        assert_eq!(visible(&mut out), Vec::<bool>::new());
        // Failures that blind say so once, until a probe or an answer.
        s.handle(Item::Failed(Domain::KubeNodes, blinding()), &mut out);
        s.handle(Item::Failed(Domain::KubePods, blinding()), &mut out);
        assert!(s.blind());
        s.probed(
            Err(Error::Timeout {
                what: "probe".to_owned(),
                timeout_ms: 1,
            }),
            &mut out,
        );
        assert_eq!(visible(&mut out), vec![false]);
        // A watcher's answer does not restore sight; a probe of all kinds does.
        s.handle(Item::Node(Some(Step::InitDone)), &mut out);
        assert!(s.blind());
        s.probed(Ok(()), &mut out);
        s.handle(Item::Node(Some(Step::InitDone)), &mut out);
        assert_eq!(visible(&mut out), vec![true]);
    }
}
