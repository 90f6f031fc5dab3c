//! The reducer: applies log records in sequence order to the model, then
//! re-evaluates every node the record touched (level-triggered: the whole
//! observed state decides, never the event alone) and every node whose timer
//! is due.

use std::io::{Read, Write};

use lockstep_schemas::{EventRecord, Phase, Policy, Target};
use rustc_hash::FxHashSet;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cause::Cause;
use crate::cow::CowMap;
use crate::drain::{Ownership, SlurmSide};
use crate::flights::Flights;
use crate::health;
use crate::maintenance;
use crate::model::{Model, Name};
use crate::retired::Retired;
use crate::scaling;
use crate::stale::Tombstones;
use crate::timers::{Timers, Wake};

use crate::ctx::Ctx;
pub use crate::ctx::Output;
use crate::node::NodeCtl;

// The loop's parts, children of this module so that they share the
// engine's private state without widening it.
/// Applying a record to the model, and which wakes it raises.
mod observe;
/// Action outcomes into their slots.
mod outcome;
/// The router of wakes: each to the policy it belongs to.
mod route;
/// `Engine::stats`: counts for metrics, read-only.
mod stats;

pub use stats::{Stats, STATS_PARTS_MAX};

/// The reducer.
///
/// Feed it records in sequence order with [`Engine::apply`]; read what it
/// decided from the [`Output`]. The same records give the same state hash,
/// transitions and action ids, however they are batched.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Engine {
    /// [`LAYOUT`] when written (absent, so 0, before layouts were numbered).
    #[serde(default)]
    layout: u32,
    policy: Policy,
    last_seq: u64,
    now_ms: u64,
    model: Model,
    ctl: CowMap<Name, NodeCtl>,
    timers: Timers,
    /// Health damping's cluster-wide rate bounds.
    damping: health::Cluster,
    /// Actions in flight, one slot per target.
    flights: Flights,
    /// Scaling's state: per target, victims, idle clocks.
    scaling: scaling::Book,
    /// Deleted objects and the version they were deleted at, so that an
    /// older observation re-delivered later does not bring them back.
    #[serde(default, skip_serializing_if = "Tombstones::is_empty")]
    tombstones: Tombstones,
    /// Names earlier policies made lockstep set that the current one does
    /// not: cleaned up, and drains under old prefixes still owned.
    #[serde(default, skip_serializing_if = "Retired::is_empty")]
    retired: Retired,
    /// Maintenance's reservations, by Kubernetes node.
    #[serde(default, skip_serializing_if = "maintenance::Reservations::is_empty")]
    reservations: maintenance::Reservations,
    /// `--policy` replays: ignore `PolicyChanged` records.
    #[serde(skip)]
    pinned: bool,
    /// Which nodes' `NodeCtl::fresh_after` may be set: derived, rebuilt
    /// on restore.
    #[serde(skip)]
    fresh: FreshIndex,
    #[serde(skip)]
    dirty: Vec<Wake>,
    /// Buffers reused between evaluations.
    #[serde(skip)]
    scratch: Scratch,
}

/// The Slurm nodes whose [`NodeCtl::fresh_after`] may be set: every one
/// that is, and perhaps some whose mark has cleared. An observation of a node
/// outside it skips the look-up of its `NodeCtl`, a table of every node and
/// mostly out of cache on a large cluster. Unknown (every node may be) until
/// rebuilt from the `NodeCtl`s, as after decoding a snapshot.
#[derive(Debug, Clone, Default)]
struct FreshIndex(Option<FxHashSet<Name>>);

impl FreshIndex {
    /// The index of an engine with no node yet.
    fn empty() -> Self {
        Self(Some(FxHashSet::default()))
    }

    /// Whether `name`'s `fresh_after` may be set.
    fn may_hold(&self, name: &str) -> bool {
        self.0.as_ref().is_none_or(|f| f.contains(name))
    }

    /// Follows a node's `fresh_after` after a change of it.
    fn follow(&mut self, name: &str, set: bool) {
        if let Some(f) = &mut self.0 {
            if set {
                if !f.contains(name) {
                    f.insert(name.into());
                }
            } else {
                f.remove(name);
            }
        }
    }

    /// Rebuilds the index from every node's `NodeCtl`.
    fn rebuild(&mut self, ctl: &CowMap<Name, NodeCtl>) {
        self.0 = Some(
            ctl.iter()
                .filter(|(_, c)| c.fresh_after.is_some())
                .map(|(n, _)| n.clone())
                .collect(),
        );
    }
}

/// Buffers reused between evaluations, so that evaluating allocates
/// little.
#[derive(Debug, Clone, Default)]
struct Scratch {
    causes: Vec<Cause>,
    names: Vec<String>,
    /// Slurm nodes a job's change turned busy or idle.
    flipped: Vec<crate::model::Name>,
}

/// How lockstep tells its own drains under `policy`, and under the earlier
/// policies `retired` remembers.
fn ownership<'a>(policy: &'a Policy, retired: &'a Retired) -> Ownership<'a> {
    Ownership {
        prefix: &policy.drain.reason_prefix,
        earlier_prefixes: &retired.prefixes,
        slurm_user: policy.drain.slurm_user.as_deref(),
    }
}

/// Whether what Slurm shows of node `name` is about to change: the effect of
/// lockstep's last drain, down or resume of it does not show yet.
fn slurm_unseen(
    ctl: &CowMap<Name, NodeCtl>,
    flights: &Flights,
    model: &Model,
    own: &Ownership<'_>,
    name: &str,
) -> bool {
    if ctl.get(name).is_some_and(|c| c.fresh_after.is_some()) {
        return true;
    }
    let Some(action) = flights.state_action(name) else {
        return false;
    };
    model
        .slurm_nodes
        .get(name)
        .is_some_and(|n| SlurmSide::of(&n.obs, own).see(Some(action), &n.obs).unseen)
}

/// Writes to `inner` and feeds what it wrote to a SHA-256: [`Engine::hash`]
/// without the snapshot's bytes in memory (`inner` a sink), or of the
/// snapshot being written.
struct HashingWriter<W> {
    inner: W,
    sha: Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// SHA-256 of `bytes` in hex: [`Engine::hash`] of the engine whose
/// [`Engine::snapshot`] they are.
pub(crate) fn hex_sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The engine's state at one point of the log, apart from the engine
/// ([`Engine::frozen`]): only to be encoded.
#[derive(Debug, Clone)]
pub struct Frozen(Engine);

impl Frozen {
    /// Sequence of the last record applied to the state.
    pub fn last_seq(&self) -> u64 {
        self.0.last_seq
    }

    /// [`Engine::snapshot`] of the engine at that point.
    pub fn snapshot(&self) -> Vec<u8> {
        self.0.snapshot()
    }

    /// [`Engine::snapshot_to`] of the engine at that point.
    pub fn snapshot_to(&self, w: impl Write) -> Result<(), rmp_serde::encode::Error> {
        self.0.snapshot_to(w)
    }

    /// [`Engine::snapshot_hashed_to`] of the engine at that point.
    pub fn snapshot_hashed_to(&self, w: impl Write) -> Result<String, rmp_serde::encode::Error> {
        self.0.snapshot_hashed_to(w)
    }
}

/// Errors restoring a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The bytes are not an engine snapshot of this version.
    #[error("engine snapshot does not decode")]
    Decode(#[source] rmp_serde::decode::Error),
    /// A snapshot of another state layout (an older or newer lockstep).
    #[error("engine snapshot has state layout {found}; this lockstep has layout {LAYOUT}")]
    Layout {
        /// The snapshot's layout (0: written before layouts were numbered).
        found: u32,
    },
}

/// The layout of the engine's state in a snapshot. A snapshot of another
/// layout is not restored: the state is rebuilt from the log instead, which
/// gives the same decisions (the log is the truth; a snapshot only saves
/// time). Raised whenever the state's shape changes.
pub const LAYOUT: u32 = 2;

impl Engine {
    /// A reducer with nothing applied yet.
    pub fn new(policy: Policy) -> Self {
        let mut model = Model::new();
        model.rebuild_indexes(&policy);
        Self {
            layout: LAYOUT,
            policy,
            last_seq: 0,
            now_ms: 0,
            model,
            ctl: CowMap::default(),
            timers: Timers::default(),
            damping: health::Cluster::default(),
            flights: Flights::default(),
            scaling: scaling::Book::default(),
            tombstones: Tombstones::default(),
            retired: Retired::default(),
            reservations: maintenance::Reservations::default(),
            pinned: false,
            fresh: FreshIndex::empty(),
            dirty: Vec::new(),
            scratch: Scratch::default(),
        }
    }

    /// Keeps this policy whatever `PolicyChanged` records say: "what would
    /// this policy have done".
    pub fn pin_policy(&mut self) {
        self.pinned = true;
    }

    /// Whether [`Engine::pin_policy`] holds.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The log time of the engine's next timer (a grace period ending, an
    /// action's timeout or retry, scaling's next look): the first record at
    /// or after it, a `Tick` if nothing else, lets it fire. `None`: nothing
    /// is waiting on time, so a quiet log needs no `Tick` at all.
    pub fn next_wake_ms(&self) -> Option<u64> {
        self.timers.next()
    }

    /// How lockstep tells its own drains under the policy in force (and the
    /// prefixes of earlier policies): what the Slurm actuator follows, so that
    /// it never replaces or lifts a drain lockstep did not set.
    pub fn reason_ownership(&self) -> lockstep_schemas::ReasonOwnership {
        self.ownership().into()
    }

    fn ownership(&self) -> Ownership<'_> {
        ownership(&self.policy, &self.retired)
    }

    /// Sequence of the last applied record (0 before the first).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The reducer's clock: the largest append time seen (ms).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Every known Slurm node's phase, by name.
    pub fn phases(&self) -> Vec<(String, Phase)> {
        let mut v: Vec<_> = self
            .ctl
            .iter()
            .map(|(n, c)| (n.to_string(), c.status.phase))
            .collect();
        v.sort();
        v
    }

    /// One Slurm node's phase.
    pub fn phase(&self, node: &str) -> Phase {
        self.ctl
            .get(node)
            .map_or(Phase::Unknown, |c| c.status.phase)
    }

    /// Targets with an action sent and no outcome yet, sorted.
    pub fn pending(&self) -> Vec<(Target, lockstep_schemas::ActionId)> {
        self.flights.pending()
    }

    /// Ids of the actions in flight (sent, no outcome yet), in no
    /// particular order: what [`Self::pending`] lists, without copying.
    pub fn pending_ids(&self) -> impl Iterator<Item = &lockstep_schemas::ActionId> {
        self.flights.pending_ids()
    }

    /// Number of Slurm nodes, Kubernetes nodes, pods and jobs in the model.
    pub fn sizes(&self) -> [usize; 4] {
        [
            self.model.slurm_nodes.len(),
            self.model.kube_nodes.len(),
            self.model.pods.len(),
            self.model.jobs.len(),
        ]
    }

    /// The Kubernetes node a Slurm node runs on, if known.
    pub fn placement(&self, node: &str) -> Option<String> {
        self.model.placement(node, &self.policy).map(str::to_owned)
    }

    /// `namespace/name` of the pod that runs a Slurm node, if any.
    pub fn pod_key_of(&self, node: &str) -> Option<String> {
        self.model.pod_of(node).map(|(k, _)| k.to_owned())
    }

    /// Jobs holding a Slurm node.
    pub fn jobs_on(&self, node: &str) -> u32 {
        self.model.jobs_on(node)
    }

    /// The whole state as named-field MessagePack, maps in key order.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        self.snapshot_to(&mut bytes)
            .expect("engine state always encodes");
        bytes
    }

    /// [`Engine::snapshot`], written to `w` as it is encoded: the same
    /// bytes, without holding them all. Buffer `w` (a `BufWriter`): the
    /// encoder writes many small pieces.
    pub fn snapshot_to(&self, mut w: impl Write) -> Result<(), rmp_serde::encode::Error> {
        rmp_serde::encode::write_named(&mut w, self)
    }

    /// The state as it is now, apart from the engine: a checkpoint of it is
    /// encoded off the apply loop while the engine goes on applying. Costs
    /// little: the large tables are shared copy-on-write (a change the
    /// engine makes meanwhile copies one shard of one table), and what is
    /// derived from the rest is left out. Its snapshot is the engine's
    /// snapshot at this point, byte for byte.
    pub fn frozen(&self) -> Frozen {
        // Every field named, so that a field added later is not forgotten.
        let Self {
            layout,
            policy,
            last_seq,
            now_ms,
            model,
            ctl,
            timers,
            damping,
            flights,
            scaling,
            tombstones,
            retired,
            reservations,
            pinned,
            fresh: _,
            dirty: _,
            scratch: _,
        } = self;
        Frozen(Self {
            layout: *layout,
            policy: policy.clone(),
            last_seq: *last_seq,
            now_ms: *now_ms,
            model: model.frozen(),
            ctl: ctl.clone(),
            timers: timers.frozen(),
            damping: damping.clone(),
            flights: flights.frozen(),
            scaling: scaling.frozen(),
            tombstones: tombstones.clone(),
            retired: retired.clone(),
            reservations: reservations.clone(),
            pinned: *pinned,
            fresh: FreshIndex::default(),
            dirty: Vec::new(),
            scratch: Scratch::default(),
        })
    }

    /// Rebuilds an engine from [`Engine::snapshot`].
    pub fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        Self::restore_from(bytes)
    }

    /// [`Engine::restore`], decoding from `r` as it is read: no buffer of
    /// the whole snapshot. Buffer `r` (a `BufReader`): the decoder reads
    /// many small pieces.
    pub fn restore_from(r: impl Read) -> Result<Self, SnapshotError> {
        let mut e: Self = rmp_serde::from_read(r).map_err(SnapshotError::Decode)?;
        if e.layout != LAYOUT {
            return Err(SnapshotError::Layout { found: e.layout });
        }
        for ctl in e.ctl.values_mut() {
            ctl.health.upgrade(ctl.cleared.as_ref().map(|o| o.ms));
        }
        e.model.rebuild_indexes(&e.policy);
        e.tombstones.rebuild();
        e.timers.rebuild();
        e.flights.rebuild();
        e.scaling.rebuild_busy(&e.model, &e.policy);
        e.fresh.rebuild(&e.ctl);
        Ok(e)
    }

    /// SHA-256 of the snapshot, in hex: equal on every machine for the same log.
    pub fn hash(&self) -> String {
        self.snapshot_hashed_to(std::io::sink())
            .expect("engine state always encodes")
    }

    /// [`Engine::snapshot_to`], returning the [`Engine::hash`] of what it
    /// wrote: a checkpoint and its hash from one encoding.
    pub fn snapshot_hashed_to(&self, w: impl Write) -> Result<String, rmp_serde::encode::Error> {
        let mut hashing = HashingWriter {
            inner: w,
            sha: Sha256::new(),
        };
        self.snapshot_to(&mut hashing)?;
        Ok(hex::encode(hashing.sha.finalize()))
    }

    /// Applies one record.
    ///
    /// # Panics
    /// If `rec.seq` does not follow the last applied sequence: log readers
    /// reject such input, so reaching here is a bug.
    pub fn apply(&mut self, rec: &EventRecord, out: &mut Output) {
        assert!(
            rec.seq > self.last_seq,
            "sequence numbers must go up: {} after {}",
            rec.seq,
            self.last_seq
        );
        self.last_seq = rec.seq;
        // One clock for all sources, and it never goes back.
        self.now_ms = self.now_ms.max(rec.time_ms);
        let ctx = Ctx {
            seq: rec.seq,
            now_ms: self.now_ms,
            event: &rec.envelope.id,
        };
        self.dirty.clear();
        self.handle_event(&rec.envelope.event, &ctx);
        while let Some(wake) = self.timers.pop_due(ctx.now_ms) {
            self.dirty.push(wake);
        }
        self.route(|_| true, &ctx, out);
        // Kubernetes nodes whose Slurm nodes changed what lockstep shows of
        // them while being evaluated just now.
        self.route(|w| matches!(w, Wake::Kube(_) | Wake::Maint(_)), &ctx, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_of_another_layout_is_not_restored() {
        let mut e = Engine::new(Policy::default());
        assert!(Engine::restore(&e.snapshot()).is_ok());
        e.layout = LAYOUT - 1;
        let err = Engine::restore(&e.snapshot()).expect_err("refused");
        assert!(matches!(err, SnapshotError::Layout { found } if found == LAYOUT - 1));
        assert!(err.to_string().contains("state layout"));
    }

    #[test]
    fn a_streamed_snapshot_is_the_same_bytes_and_restores_from_a_reader() {
        let e = Engine::new(Policy::default());
        let mut streamed = Vec::new();
        e.snapshot_to(&mut streamed).expect("encodes");
        assert_eq!(streamed, e.snapshot());
        let digest = Sha256::digest(&streamed);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(e.hash(), hex);
        let back =
            Engine::restore_from(std::io::BufReader::new(streamed.as_slice())).expect("restores");
        assert_eq!(back.hash(), e.hash());
        let mut hashed = Vec::new();
        let hash = e.snapshot_hashed_to(&mut hashed).expect("encodes");
        assert_eq!((hashed, hash), (streamed, e.hash()));
    }

    #[test]
    fn the_fresh_index_is_rebuilt_on_restore_and_unknown_until_then() {
        let mut e = Engine::new(Policy::default());
        for (name, fresh_after) in [("n1", Some(7)), ("n2", None)] {
            let ctl = NodeCtl {
                fresh_after,
                ..NodeCtl::default()
            };
            e.ctl.insert(name.into(), ctl);
        }
        assert!(!e.fresh.may_hold("n1"), "nothing followed yet");
        let back = Engine::restore(&e.snapshot()).expect("restores");
        assert!(back.fresh.may_hold("n1"));
        assert!(!back.fresh.may_hold("n2"));
        // Decoded without a rebuild, every node may await one.
        let decoded: Engine = rmp_serde::from_slice(&e.snapshot()).expect("decodes");
        assert!(decoded.fresh.may_hold("n2"));
        let mut index = FreshIndex::empty();
        index.follow("n3", true);
        assert!(index.may_hold("n3"));
        index.follow("n3", false);
        assert!(!index.may_hold("n3"));
    }
}
