//! Applying a batch: fold it into the engine, commit the ledger entries and
//! the audit rows in one transaction and flush them, then write the
//! checkpoint when one is due.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use lockstep_engine::Frozen;
use lockstep_schemas::{Event, EventRecord};
use lockstep_store::snapshots::SnapshotInfo;
use lockstep_store::{Commit, LogPosition, Store};
use tracing::info;

use super::Service;
use crate::telemetry;

/// Actions one commit of the loop holds: once the records of a batch have
/// issued this many, the rest of the batch is applied after they are
/// committed and dispatched.
pub(super) const ACTIONS_PER_COMMIT: usize = 512;

/// A record that takes the engine this long is logged (at debug level),
/// with what it was: the apply loop's pauses, laid beside their causes.
const SLOW_RECORD: std::time::Duration = std::time::Duration::from_millis(20);

impl Service {
    /// Applies a batch, or its first records that issue
    /// [`ACTIONS_PER_COMMIT`] actions, and commits them (ledger, audit),
    /// then starts a checkpoint when one is due; returns how many records
    /// it took.
    pub(super) async fn apply_batch(&mut self, batch: &[EventRecord]) -> Result<usize> {
        let started = Instant::now();
        self.out.clear();
        let mut outcomes = Vec::new();
        let mut used = 0;
        // One clock read per record: each record's time runs from the end
        // of the one before.
        let mut mark = started;
        for rec in batch {
            if self.out.actions.len() >= ACTIONS_PER_COMMIT {
                break;
            }
            used += 1;
            if rec.seq < self.next {
                continue;
            }
            let actions = self.out.actions.len();
            self.engine.apply(rec, &mut self.out);
            let now = Instant::now();
            let took = now - std::mem::replace(&mut mark, now);
            if took >= SLOW_RECORD {
                telemetry::SlowRecord {
                    seq: rec.seq,
                    time_ms: rec.time_ms,
                    event: rec.envelope.event.kind(),
                    actions: self.out.actions.len() - actions,
                    took,
                }
                .emit();
            }
            if let Event::ActionOutcome(o) = &rec.envelope.event {
                telemetry::OutcomeApplied {
                    kind: o.kind.name(),
                    result: telemetry::outcome_result(&o.result),
                }
                .emit();
                outcomes.push((o.action_id.clone(), o.result.clone()));
            }
            self.next = rec.seq + 1;
        }
        let apply = started.elapsed();
        let batch = &batch[..used];
        let position = batch
            .last()
            .filter(|r| r.seq + 1 == self.next)
            .map(|r| LogPosition {
                log_id: self.log_id.clone(),
                seq: r.seq,
                envelope_id: r.envelope.id.0.clone(),
            });
        let commit = Commit {
            issued: &self.out.actions,
            outcomes,
            transitions: &self.out.transitions,
            position: position.as_ref(),
        };
        let commit_started = Instant::now();
        self.store.commit(&commit).context("committing a batch")?;
        self.store.flush().await.context("flushing the store")?;
        telemetry::BatchCommitted {
            records: batch.len(),
            last_seq: self.next - 1,
            output: &self.out,
            apply,
            commit: commit_started.elapsed(),
        }
        .emit();
        let service = &self.cfg.service;
        self.since_checkpoint.0 += batch.len() as u64;
        let due = self.since_checkpoint.0 >= service.checkpoint_every_records
            || self.since_checkpoint.1.elapsed()
                >= Duration::from_millis(service.checkpoint_every_ms);
        self.snapshots.records_since += batch.len() as u64;
        self.checkpoint_written(false).await?;
        if due && self.checkpointing.is_none() {
            self.checkpoint_off_loop(false);
        }
        self.health
            .applied_seq
            .store(self.next - 1, Ordering::Relaxed);
        Ok(used)
    }
}

impl Service {
    /// Whether the leader keeps a snapshot beside the log now: it leads on
    /// NATS, and none was kept since it leads, `snapshot_every_ms` has
    /// passed, or the records since take a quarter of the stream's
    /// `max_bytes` (the log's retention then keeps at least three more).
    fn snapshot_due(&self) -> bool {
        if self.role.acting().is_none() {
            return false;
        }
        let s = &self.snapshots;
        let every = Duration::from_millis(self.cfg.service.snapshot_every_ms);
        let max_bytes = u64::try_from(self.cfg.log.max_bytes).unwrap_or(0);
        s.last.is_none_or(|t| t.elapsed() >= every)
            || (max_bytes > 0 && s.records_since.saturating_mul(s.record_bytes) >= max_bytes / 4)
    }

    /// When one is due, writes a checkpoint and keeps it beside the log as
    /// a snapshot (also on a quiet log: the snapshot must stay inside the
    /// log's retention window). Both off the loop: the checkpoint (with its
    /// hash, from the same encoding) from a frozen copy of the engine, then
    /// the snapshot from a link to that file, which the next checkpoint
    /// does not replace.
    pub(super) async fn snapshot_if_due(&mut self) -> Result<()> {
        self.snapshot_kept(false).await;
        self.checkpoint_written(false).await?;
        // One at a time; a checkpoint being written is waited out (the
        // snapshot is still due once it is).
        if self.snapshots.keeping.is_some() || self.checkpointing.is_some() || !self.snapshot_due()
        {
            return Ok(());
        }
        self.checkpoint_off_loop(true);
        Ok(())
    }

    /// Starts writing a checkpoint of everything applied, off the loop,
    /// from a frozen copy of the engine (a few milliseconds at 50,000
    /// nodes, where encoding takes a few hundred); with `keep`, also staged
    /// to be kept beside the log as a snapshot.
    fn checkpoint_off_loop(&mut self, keep: bool) {
        let frozen = self.engine.frozen();
        let store = self.store.clone();
        self.since_checkpoint = (0, Instant::now());
        self.checkpointing = Some(tokio::task::spawn_blocking(move || {
            if !keep {
                let seq = write_checkpoint(&store, &frozen)?;
                return Ok(Written { seq, kept: None });
            }
            let (seq, hash) = write_checkpoint_hashed(&store, &frozen)?;
            let staged = store.checkpoint_path().with_extension("snapshot");
            let _ = std::fs::remove_file(&staged);
            std::fs::hard_link(store.checkpoint_path(), &staged)
                .or_else(|_| std::fs::copy(store.checkpoint_path(), &staged).map(|_| ()))
                .with_context(|| format!("staging the checkpoint as {}", staged.display()))?;
            Ok(Written {
                seq,
                kept: Some((hash, staged)),
            })
        }));
    }

    /// Takes in the checkpoint being written once it is (with `wait`,
    /// waits for it), and starts keeping it beside the log when it was
    /// staged to be. A checkpoint that could not be written stops the
    /// loop, as it did when written in it.
    pub(super) async fn checkpoint_written(&mut self, wait: bool) -> Result<()> {
        let done = self
            .checkpointing
            .as_ref()
            .is_some_and(tokio::task::JoinHandle::is_finished);
        if !(done || wait) {
            return Ok(());
        }
        let Some(task) = self.checkpointing.take() else {
            return Ok(());
        };
        let written = task.await.context("writing a checkpoint stopped")??;
        self.health
            .checkpoint_seq
            .store(written.seq, Ordering::Relaxed);
        let Some((hash, staged)) = written.kept else {
            return Ok(());
        };
        let meta = SnapshotInfo::new(
            written.seq,
            hash,
            lockstep_engine::LAYOUT,
            env!("CARGO_PKG_VERSION"),
        );
        let (log, kept) = (self.log.clone(), self.cfg.service.snapshots_kept);
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let result = log.put_snapshot(&staged, &meta, kept).await;
            let _ = std::fs::remove_file(&staged);
            (meta, started.elapsed(), result)
        });
        self.snapshots.keeping = Some(task);
        Ok(())
    }

    /// Takes in the snapshot being kept once it is (or failed); with
    /// `wait`, waits for it.
    pub(super) async fn snapshot_kept(&mut self, wait: bool) {
        let done = self
            .snapshots
            .keeping
            .as_ref()
            .is_some_and(tokio::task::JoinHandle::is_finished);
        if done || wait {
            if let Some(task) = self.snapshots.keeping.take() {
                match task.await {
                    Ok((meta, took, result)) => {
                        if self.snapshot_result(&meta, took, result) {
                            // The embedded log may now discard what this
                            // snapshot covers.
                            self.apply_retention();
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "keeping a snapshot stopped"),
                }
            }
        }
    }

    /// Reports how keeping the snapshot `meta` went; whether it was kept. A
    /// failure is tried again when the next is due (at once); the loop goes
    /// on.
    fn snapshot_result(
        &mut self,
        meta: &SnapshotInfo,
        took: Duration,
        result: lockstep_store::log::Result<()>,
    ) -> bool {
        match result {
            Ok(()) => {
                telemetry::SnapshotKept {
                    seq: meta.seq,
                    state_hash: &meta.state_hash,
                    took,
                }
                .emit();
                self.snapshots.last = Some(Instant::now());
                self.snapshots.records_since = 0;
                true
            }
            Err(e) => {
                let seq = meta.seq;
                tracing::warn!(seq, error = %e, "keeping a snapshot beside the event log failed; trying again");
                // Not at once: as often as a checkpoint.
                self.snapshots.last = Some(
                    Instant::now()
                        .checked_sub(Duration::from_millis(
                            self.cfg
                                .service
                                .snapshot_every_ms
                                .saturating_sub(self.cfg.service.checkpoint_every_ms),
                        ))
                        .unwrap_or_else(Instant::now),
                );
                false
            }
        }
    }
}

impl Service {
    /// Applies the retention horizon as often as a snapshot is kept, on a
    /// replica that keeps none (the leader applies it after each snapshot).
    pub(super) fn retention_if_due(&mut self) {
        let every = Duration::from_millis(self.cfg.service.snapshot_every_ms);
        let recent = self
            .snapshots
            .retention
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < every);
        if self.role.acting().is_none() && !recent {
            self.apply_retention();
        }
    }

    /// Applies the retention horizon (`[service] retention_s`, log time)
    /// off the loop, unless it is still being applied: the store drops the
    /// ledger entries and audit transitions before it, and, while this
    /// replica acts, the embedded log the records before `[log] max_age_s`
    /// that its oldest snapshot no longer needs.
    fn apply_retention(&mut self) {
        let running = self
            .snapshots
            .retention
            .as_ref()
            .is_some_and(|(_, task)| !task.is_finished());
        let now_ms = self.engine.now_ms();
        let Some(keep_ms) = self.cfg.retention_ms() else {
            return;
        };
        if running || now_ms == 0 {
            return;
        }
        let before_ms = now_ms.saturating_sub(keep_ms);
        let log_before_ms = now_ms.saturating_sub(self.cfg.log.max_age_s.saturating_mul(1000));
        let (store, log) = (self.store.clone(), self.log.clone());
        let discard = self.cfg.log.max_age_s > 0 && self.role.acting().is_some();
        let task = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let trimmed = match store.trim(before_ms) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(error = %e, "applying the retention horizon to the store failed; trying again later");
                    return;
                }
            };
            let records = if discard {
                log.discard_before(log_before_ms).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "discarding the embedded log's old records failed; trying again later");
                    0
                })
            } else {
                0
            };
            telemetry::RetentionApplied {
                before_ms,
                ledger: trimmed.ledger,
                transitions: trimmed.transitions,
                records,
                store_bytes: store.size_on_disk(),
                took: started.elapsed(),
            }
            .emit();
        });
        self.snapshots.retention = Some((Instant::now(), task));
    }
}

/// A checkpoint written off the loop: its sequence, and, when it is to be
/// kept beside the log, its state hash and the link it was staged as.
#[derive(Debug)]
pub(super) struct Written {
    seq: u64,
    kept: Option<(String, std::path::PathBuf)>,
}

/// Writes a checkpoint of everything the engine has applied, streamed to
/// the store's checkpoint file; returns its sequence.
///
/// Only after the batches it covers are committed and flushed: a crash
/// before the new checkpoint is on disk restarts from the old one and
/// re-applies those batches, which is harmless, because committing them
/// again changes nothing: the ledger inserts an action only if its id is
/// absent (and the same records issue the same ids), and audit rows are
/// keyed by (node, seq, place in the record), so they are overwritten with
/// the same transitions. A checkpoint ahead of its commits, on the other
/// hand, would lose them.
pub(super) fn write_checkpoint(store: &Store, engine: &Frozen) -> Result<u64> {
    checkpoint(store, engine, |w| {
        engine.snapshot_to(w).map_err(std::io::Error::other)
    })
}

/// [`write_checkpoint`], and the state hash of what it wrote.
fn write_checkpoint_hashed(store: &Store, engine: &Frozen) -> Result<(u64, String)> {
    let mut hash = String::new();
    let seq = checkpoint(store, engine, |w| {
        hash = engine
            .snapshot_hashed_to(w)
            .map_err(std::io::Error::other)?;
        Ok(())
    })?;
    Ok((seq, hash))
}

fn checkpoint(
    store: &Store,
    engine: &Frozen,
    body: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> Result<u64> {
    let started = Instant::now();
    let seq = engine.last_seq();
    info!(seq, "writing a checkpoint");
    let bytes = store
        .write_checkpoint(seq, body)
        .with_context(|| format!("writing the checkpoint at seq {seq}"))?;
    telemetry::CheckpointWritten {
        seq,
        bytes,
        took: started.elapsed(),
    }
    .emit();
    Ok(seq)
}
