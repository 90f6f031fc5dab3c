//! Applying a batch: fold it into the engine, commit the ledger entries and
//! the audit rows in one transaction and flush them, then write the
//! checkpoint when one is due.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use lockstep_engine::Engine;
use lockstep_schemas::{Event, EventRecord};
use lockstep_store::{Commit, LogPosition, Store};
use tracing::info;

use super::Service;
use crate::telemetry;

impl Service {
    /// Applies one batch and commits it (ledger, audit), then writes a
    /// checkpoint when one is due.
    pub(super) async fn apply_batch(&mut self, batch: &[EventRecord]) -> Result<()> {
        let started = Instant::now();
        self.out.clear();
        let mut outcomes = Vec::new();
        for rec in batch {
            if rec.seq < self.next {
                continue;
            }
            self.engine.apply(rec, &mut self.out);
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
        if due {
            let seq = write_checkpoint(&self.store, &self.engine)?;
            self.since_checkpoint = (0, Instant::now());
            self.health.checkpoint_seq.store(seq, Ordering::Relaxed);
        }
        self.health
            .applied_seq
            .store(self.next - 1, Ordering::Relaxed);
        Ok(())
    }
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
pub(super) fn write_checkpoint(store: &Store, engine: &Engine) -> Result<u64> {
    let started = Instant::now();
    let seq = engine.last_seq();
    info!(seq, "writing a checkpoint");
    let bytes = store
        .write_checkpoint(seq, |w| {
            engine.snapshot_to(w).map_err(std::io::Error::other)
        })
        .with_context(|| format!("writing the checkpoint at seq {seq}"))?;
    telemetry::CheckpointWritten {
        seq,
        bytes,
        took: started.elapsed(),
    }
    .emit();
    Ok(seq)
}
