//! Drains, downs and resumes carried out together: a node pool cordoned at
//! once (a Kubernetes upgrade) drains thousands of Slurm nodes, and one
//! read and one write per node would take seconds on slurmctld alone.
//!
//! The rules are those of one action ([`StateChange::decide`], the read
//! before the write, the reason Slurm keeps after a resume); only the
//! requests are shared:
//!
//! | step | one action | together (`n` nodes) |
//! |---|---|---|
//! | read | `GET /node/{name}` or `scontrol show node`, and again right before the write | once. Where scontrol lists ([`ActuatorConfig::list_through_scontrol`], or no slurmrestd): up to a quarter of the cluster in one `scontrol show node A,B,...` (scontrol prints those nodes alone; a listing of every node is 5 MB at 10,000 nodes), more in one listing of every node. Where slurmrestd lists: one listing of every node from [`ActuatorConfig::listing_read_min`] nodes and a quarter of the cluster on (a listing of 10,000 nodes costs it seconds), else one read per node, [`IN_FLIGHT_MAX`] at a time (one read: see `change_states`) |
//! | write | one per node | one per kind of write and reason, naming up to [`NODES_PER_WRITE_MAX`] nodes (`scontrol update nodename=A,B`; slurmrestd v0.0.42+'s `POST /nodes/`), [`IN_FLIGHT_MAX`] writes at a time; one per node where slurmrestd has no such endpoint (v0.0.39 - v0.0.41) |
//!
//! Slurm keeps one reason per write, and by default lockstep's reasons name
//! their cause's node (`kubernetes node K cordoned`), so the drains of a
//! pool share a write only where several Slurm nodes share a Kubernetes
//! node; the rest is the concurrency: slurmctld serves several requests at
//! once and holds its node lock only for the update itself. With
//! `drain.reason_names_nodes` off, every drain for one cause says the same
//! (`kubernetes node cordoned`), and a pool's drains take one write per
//! [`NODES_PER_WRITE_MAX`] nodes. Resumes carry no reason: the UNDRAINs of
//! drains share a write, as do the RESUMEs of lockstep's downs.
//!
//! A write that names several nodes and fails is tried again node by node,
//! so that each action reports its own node's answer (Slurm fails such a
//! write as a whole, whichever node it was about).
//!
//! [`ActuatorConfig::listing_read_min`]: super::ActuatorConfig::listing_read_min
//! [`ActuatorConfig::list_through_scontrol`]: super::ActuatorConfig::list_through_scontrol

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;

use futures::stream::{self, StreamExt};

use lockstep_schemas::{Action, ActionOutcome, IssuedAction, SlurmNode};

use super::{clean_reason, out_of_service, Actuator, Applied, StateChange, Write, RESUMED_REASON};
use crate::slurm::error::{Error, Result};
use crate::slurm::rest::Fetch;

/// Most nodes one write names: a `scontrol update` command line and a
/// slurmrestd request stay small, and slurmctld holds its node write lock
/// for one write at a time.
pub(super) const NODES_PER_WRITE_MAX: usize = 256;

/// Most requests of one batch in flight at a time.
pub(super) const IN_FLIGHT_MAX: usize = 8;

/// A drain, down or resume of one node, in a batch.
struct Item<'a> {
    /// Where it stands among the actions given.
    index: usize,
    issued: &'a IssuedAction,
    node: &'a str,
    change: StateChange<'a>,
}

/// The fewest nodes that [`Actuator::read_all`] reads from a listing of
/// every node rather than one by one: `listing_read_min`, and where
/// slurmrestd lists, a quarter of the `cluster` (the nodes the last listing
/// held), for its listing of 10,000 nodes takes seconds.
fn listing_least(listing_read_min: usize, cluster: usize, through_scontrol: bool) -> usize {
    let least = if through_scontrol {
        listing_read_min
    } else {
        listing_read_min.max(cluster / 4)
    };
    least.max(1)
}

impl Actuator {
    /// Carries out `issued` and reports how each ended, in the same order.
    /// The drains, downs and resumes among them, one per node, are carried
    /// out together (see the module docs), bounded as a whole by
    /// `action_timeout_ms`; then the others, and a second change of a node
    /// already in the batch, one at a time as [`Actuator::execute`] does.
    /// Never panics.
    pub async fn execute_all(&self, issued: &[IssuedAction]) -> Vec<ActionOutcome> {
        let mut outcomes: Vec<Option<ActionOutcome>> = vec![None; issued.len()];
        // Kept alive for the items' borrows of them.
        let reasons: Vec<Option<Result<String>>> = issued
            .iter()
            .map(|a| match &a.action {
                Action::SlurmDrain { reason, .. } | Action::SlurmDown { reason, .. } => {
                    Some(clean_reason(reason))
                }
                _ => None,
            })
            .collect();
        let mut together = Vec::new();
        let mut alone = Vec::new();
        let mut nodes = HashSet::new();
        for (index, a) in issued.iter().enumerate() {
            let change = match (&a.action, &reasons[index]) {
                (Action::SlurmDrain { node, .. }, Some(Ok(r))) => {
                    Some((node, StateChange::Drain(r.as_str())))
                }
                (Action::SlurmDown { node, .. }, Some(Ok(r))) => {
                    Some((node, StateChange::Down(r.as_str())))
                }
                (Action::SlurmResume { node }, _) => Some((node, StateChange::Resume)),
                _ => None,
            };
            match change {
                Some((node, change)) if nodes.insert(node.as_str()) => together.push(Item {
                    index,
                    issued: a,
                    node,
                    change,
                }),
                _ => alone.push(index),
            }
        }
        if together.len() < 2 {
            alone.extend(together.drain(..).map(|it| it.index));
            alone.sort_unstable();
        } else {
            let results =
                match tokio::time::timeout(self.timeout(), self.change_states(&together)).await {
                    Ok(results) => results,
                    Err(_) => together
                        .iter()
                        .map(|it| Err(self.timed_out(&it.issued.action)))
                        .collect(),
                };
            for (it, result) in together.iter().zip(results) {
                outcomes[it.index] = Some(self.conclude(it.issued, result));
            }
        }
        for index in alone {
            outcomes[index] = Some(self.execute(&issued[index]).await);
        }
        outcomes
            .into_iter()
            .map(|o| o.expect("every action has its outcome"))
            .collect()
    }

    /// The drains, downs and resumes of `items` (one per node): read the
    /// nodes and decide with the ownership in force, write, and report how
    /// each ended, in order.
    ///
    /// One read, where one action reads twice: an action that finds
    /// something to write reads its node again right before the write, so
    /// that what happened while it decided is seen. Nothing comes between a
    /// batch's decisions and its writes, and a second read here would cost
    /// a second listing of every node (some 0.2 s at 10,000 nodes, or
    /// seconds through slurmrestd) to see what the first saw: the window
    /// from the last read to the write is this read either way.
    async fn change_states(&self, items: &[Item<'_>]) -> Vec<Result<Applied>> {
        let mut results: Vec<Option<Result<Applied>>> = items.iter().map(|_| None).collect();
        if let Some(hook) = &self.config.before_write {
            for it in items {
                (hook.0)(&it.issued.action).await;
            }
        }
        let names: Vec<&str> = items.iter().map(|it| it.node).collect();
        let own = self.ownership();
        let mut writes: BTreeMap<Write<'_>, Vec<usize>> = BTreeMap::new();
        for (k, read) in self.read_all(&names).await.into_iter().enumerate() {
            let change = items[k].change;
            let n = match read {
                Ok(n) => n,
                Err(e) => {
                    results[k] = Some(Err(e));
                    continue;
                }
            };
            match change.decide(&n, &own.borrow()) {
                None => writes.entry(change.write(&n)).or_default().push(k),
                Some(done) => results[k] = Some(Ok(done)),
            }
        }
        if let Some(hook) = &self.config.after_read {
            for &k in writes.values().flatten() {
                (hook.0)(&items[k].issued.action).await;
            }
        }
        // One write per chunk of a kind and reason, several at a time.
        let writes: Vec<(Write<'_>, Vec<usize>)> = writes
            .into_iter()
            .flat_map(|(w, ks)| {
                ks.chunks(NODES_PER_WRITE_MAX)
                    .map(|c| (w, c.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        // The futures are made here, not by a closure of the stream: a
        // closure returning a borrowing future is not `Send` for every
        // lifetime, and the service spawns this.
        let mut writing = Vec::with_capacity(writes.len());
        for (w, ks) in writes {
            let names: Vec<&str> = ks.iter().map(|&k| items[k].node).collect();
            writing.push(async move { (self.write_all(&names, w).await, ks) });
        }
        let written: Vec<(Vec<Result<()>>, Vec<usize>)> = stream::iter(writing)
            .buffer_unordered(IN_FLIGHT_MAX)
            .collect()
            .await;
        let mut resumed = Vec::new();
        for (written, ks) in written {
            for (&k, written) in ks.iter().zip(written) {
                if written.is_ok() && matches!(items[k].change, StateChange::Resume) {
                    resumed.push(items[k].node);
                }
                results[k] = Some(written.map(|()| Applied::Changed));
            }
        }
        // The resumes are done; replacing a reason Slurm kept is
        // housekeeping, and its failure does not undo them.
        self.replace_kept_reasons(&resumed).await;
        results
            .into_iter()
            .map(|r| r.expect("every node has its result"))
            .collect()
    }

    /// Reads `nodes`, in order. Where scontrol lists, several nodes fewer
    /// than a quarter of the cluster (as the last listing of every node
    /// showed; before any listing, fewer than `listing_read_min`) in one
    /// `scontrol show node A,B,...`. Otherwise from one listing of every
    /// node from `listing_read_min` nodes on, and from a quarter of the
    /// cluster on where slurmrestd lists, else one read each,
    /// [`IN_FLIGHT_MAX`] at a time. A node missing from what was read
    /// together (slurmctld does not know it; a listing may be incomplete),
    /// or nodes whose read together failed, are read alone.
    async fn read_all(&self, nodes: &[&str]) -> Vec<Result<SlurmNode>> {
        let cluster = self.nodes_listed.load(Ordering::Relaxed);
        let listing = nodes.len()
            >= listing_least(
                self.config.listing_read_min,
                cluster,
                self.lists_through_scontrol(),
            );
        let by_name = self
            .scontrol
            .as_ref()
            .filter(|_| self.reads_by_name(nodes.len(), cluster, listing));
        let mut listed: HashMap<String, SlurmNode> = if let Some(sc) = by_name {
            match sc.nodes_named(nodes).await {
                Ok(found) => found.into_iter().map(|n| (n.name.to_string(), n)).collect(),
                Err(e) => {
                    tracing::warn!(error = %e, nodes = nodes.len(), "cannot read slurm nodes together; reading each");
                    HashMap::new()
                }
            }
        } else if listing {
            match self.list().await {
                Ok(all) => {
                    self.nodes_listed.store(all.len(), Ordering::Relaxed);
                    all.into_iter().map(|n| (n.name.to_string(), n)).collect()
                }
                Err(e) => {
                    tracing::warn!(error = %e, nodes = nodes.len(), "cannot list slurm nodes; reading each");
                    HashMap::new()
                }
            }
        } else {
            HashMap::new()
        };
        // Made here, not by a closure of the stream (see `change_states`).
        let mut reading = Vec::with_capacity(nodes.len());
        for node in nodes {
            let found = listed.remove(*node);
            reading.push(async move {
                match found {
                    Some(n) => Ok(n),
                    None => self.read(node).await,
                }
            });
        }
        stream::iter(reading)
            .buffered(IN_FLIGHT_MAX)
            .collect()
            .await
    }

    /// Whether `nodes` nodes are read together by name: where scontrol
    /// lists, several nodes fewer than a quarter of the `cluster` (before
    /// any listing, `cluster` 0: too few for a `listing`).
    fn reads_by_name(&self, nodes: usize, cluster: usize, listing: bool) -> bool {
        let few = if cluster == 0 {
            !listing
        } else {
            nodes * 4 < cluster
        };
        self.lists_through_scontrol() && nodes > 1 && few
    }

    /// Every node Slurm knows, in one request.
    async fn list(&self) -> Result<Vec<SlurmNode>> {
        match (&self.rest, &self.scontrol) {
            (_, Some(sc)) if self.lists_through_scontrol() => sc.nodes().await,
            (Some(rest), _) => match rest.nodes(None).await? {
                Fetch::Changed(listing) => Ok(listing.items),
                Fetch::Unchanged => Err(Error::Config(
                    "slurmrestd answered a full node listing with 'unchanged'".to_owned(),
                )),
            },
            (None, Some(sc)) => sc.nodes().await,
            (None, None) => Err(Error::Config(
                "the slurm actuator needs slurmrestd or scontrol".to_owned(),
            )),
        }
    }

    /// Whether listings of every node go through scontrol: there is no
    /// slurmrestd, or the configuration asks for it.
    fn lists_through_scontrol(&self) -> bool {
        self.scontrol.is_some() && (self.rest.is_none() || self.config.list_through_scontrol)
    }

    /// Writes `w` to `nodes`: together, [`NODES_PER_WRITE_MAX`] at a time,
    /// where Slurm takes several nodes in one write; a write of several
    /// that fails, and every write where Slurm takes one node at a time,
    /// node by node. How it went for each node, in order.
    async fn write_all(&self, nodes: &[&str], w: Write<'_>) -> Vec<Result<()>> {
        let mut written = Vec::with_capacity(nodes.len());
        for chunk in nodes.chunks(NODES_PER_WRITE_MAX) {
            if chunk.len() > 1 {
                match self.write_together(chunk, w).await {
                    Some(Ok(())) => {
                        written.extend(chunk.iter().map(|_| Ok(())));
                        continue;
                    }
                    Some(Err(e)) => tracing::warn!(
                        nodes = chunk.len(), error = %e,
                        "a write of several slurm nodes failed; writing each alone"
                    ),
                    None => {}
                }
            }
            for node in chunk {
                written.push(self.write(node, w).await);
            }
        }
        written
    }

    /// [`Actuator::replace_kept_reason`] of each of `nodes`, sharing the
    /// reads and the writes; failures are reported, not returned.
    async fn replace_kept_reasons(&self, nodes: &[&str]) {
        if nodes.is_empty() {
            return;
        }
        let own = self.ownership();
        let mut kept = Vec::new();
        for (node, after) in nodes.iter().zip(self.read_all(nodes).await) {
            match after {
                Ok(after) => {
                    let kept_own = after.reason.as_deref().is_some_and(|r| r != RESUMED_REASON)
                        && own.borrow().owns(&after);
                    if !out_of_service(&after) && kept_own {
                        kept.push(*node);
                    }
                }
                Err(e) => {
                    tracing::warn!(node, error = %e, "cannot replace the reason slurm kept after a resume");
                }
            }
        }
        for (node, written) in kept
            .iter()
            .zip(self.write_all(&kept, Write::Reason(RESUMED_REASON)).await)
        {
            if let Err(e) = written {
                tracing::warn!(node, error = %e, "cannot replace the reason slurm kept after a resume");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::listing_least;

    #[test]
    fn a_listing_through_scontrol_pays_whatever_the_cluster_size() {
        // slurmrestd: a quarter of the cluster at least.
        assert_eq!(listing_least(32, 10_000, false), 2_500);
        assert_eq!(listing_least(32, 40, false), 32);
        assert_eq!(listing_least(32, 0, false), 32);
        // scontrol: the configured least alone.
        assert_eq!(listing_least(32, 10_000, true), 32);
        // Never zero: an empty batch reads nothing.
        assert_eq!(listing_least(0, 0, true), 1);
        assert_eq!(listing_least(0, 2, false), 1);
    }
}
