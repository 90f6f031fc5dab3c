//! Applying a batch: fold it into the engine, then commit the checkpoint
//! (when due), the ledger entries and the audit rows in one transaction.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use lockstep_engine::Engine;
use lockstep_schemas::{Event, EventRecord};
use lockstep_store::{Checkpoint, Commit};

use super::Service;
use crate::telemetry;

impl Service {
    /// Applies one batch and commits it (checkpoint when due, ledger, audit).
    pub(super) async fn apply_batch(&mut self, batch: &[EventRecord]) -> Result<()> {
        let started = Instant::now();
        self.out.clear();
        let mut commit = Commit::default();
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
                commit
                    .outcomes
                    .push((o.action_id.clone(), o.result.clone()));
            }
            self.next = rec.seq + 1;
        }
        let apply = started.elapsed();
        let service = &self.cfg.service;
        self.since_checkpoint.0 += batch.len() as u64;
        let due = self.since_checkpoint.0 >= service.checkpoint_every_records
            || self.since_checkpoint.1.elapsed()
                >= Duration::from_millis(service.checkpoint_every_ms);
        if due {
            commit.checkpoint = Some(take_checkpoint(&self.engine));
            self.since_checkpoint = (0, Instant::now());
        }
        commit.issued.clone_from(&self.out.actions);
        commit.transitions.clone_from(&self.out.transitions);
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
        if let Some(cp) = &commit.checkpoint {
            self.health.checkpoint_seq.store(cp.seq, Ordering::Relaxed);
        }
        self.health
            .applied_seq
            .store(self.next - 1, Ordering::Relaxed);
        Ok(())
    }
}

/// A checkpoint of everything the engine has applied.
pub(super) fn take_checkpoint(engine: &Engine) -> Checkpoint {
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
