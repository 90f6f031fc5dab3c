//! Opening what the service runs on: the event log (waiting while it does
//! not answer), the store, and the engine restored from its checkpoint.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use lockstep_connectors::backoff::{retry, Backoff};
use lockstep_engine::Engine;
use lockstep_schemas::Policy;
use lockstep_store::store::Error as StoreError;
use lockstep_store::{EventLog, Store};
use tracing::{error, info};

use crate::config::Config;
use crate::telemetry::{self, Health};

/// Opens the configured log, waiting (with bounded backoff) while it does
/// not answer: a NATS cluster without a majority of its servers has no
/// JetStream to create or find the streams. Why it waits is on `/readyz`
/// and in the log. `None` when `shutdown` came first.
pub(super) async fn open_log_when_available(
    cfg: &Config,
    health: &Health,
    shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<Option<EventLog>> {
    let mut backoff = Backoff::new(500, cfg.service.retry_backoff_max_ms);
    let opening = retry(
        &mut backoff,
        || crate::storage::open_log(cfg, LOCK_WAIT),
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

/// How long `run` waits for the locks of the store and of the embedded log
/// ([`crate::storage::open_store`], [`crate::storage::open_log`]): a
/// lockstep killed just before this one started releases them within tens
/// of milliseconds.
pub const LOCK_WAIT: Duration = Duration::from_secs(5);

/// A store without a checkpoint, or whose checkpoint the log no longer
/// continues (its retention discarded the records after it), starts from the
/// newest snapshot kept beside the log that is newer and that the log
/// continues: the snapshot becomes the store's checkpoint, and the service
/// restores from it as from its own. Nothing to do for the embedded log
/// (it keeps no snapshots), or when no snapshot fits; the service then
/// folds what the log holds, and stops where it cannot.
pub async fn bootstrap(store: &Store, log: &EventLog) -> Result<()> {
    let snapshots = log
        .snapshots()
        .await
        .context("listing the snapshots kept beside the event log")?;
    if snapshots.is_empty() {
        return Ok(());
    }
    let checkpoint = store.checkpoint_seq().context("reading the checkpoint")?;
    let state = log.state().await.context("reading the event log's state")?;
    let next = checkpoint.map_or(1, |seq| seq + 1);
    if checkpoint.is_some() && next >= state.first_seq {
        // The log continues the store's own checkpoint.
        return Ok(());
    }
    let usable = snapshots.iter().rev().find(|s| {
        s.layout == lockstep_engine::LAYOUT
            && s.seq >= next
            && s.seq + 1 >= state.first_seq
            && s.seq <= state.last_seq
    });
    let Some(snapshot) = usable else {
        info!(
            first_held = state.first_seq,
            newest_snapshot = snapshots.last().map(|s| s.seq),
            "no snapshot kept beside the event log fits this store; folding the log"
        );
        return Ok(());
    };
    let started = Instant::now();
    let download = store.download_path();
    let bytes = log
        .fetch_snapshot(&snapshot.name, &download)
        .await
        .with_context(|| format!("downloading snapshot {}", snapshot.name))?;
    let seq = store
        .adopt_checkpoint(&download)
        .with_context(|| format!("checking snapshot {}", snapshot.name))?;
    info!(
        seq,
        state_hash = %snapshot.state_hash,
        bytes,
        written_by = %snapshot.version,
        took_ms = started.elapsed().as_millis() as u64,
        "starting from the snapshot kept beside the event log"
    );
    Ok(())
}

/// The engine and next sequence to apply, from the store's checkpoint,
/// decoded as it is read. A damaged or unreadable checkpoint is reported
/// and the engine rebuilds from the start of the log instead.
pub fn restore(store: &Store) -> Result<(Engine, u64)> {
    let started = Instant::now();
    match store.read_checkpoint(|r| Engine::restore_from(r)) {
        Ok(Some((seq, Ok(engine)))) => {
            info!(
                seq,
                took_ms = started.elapsed().as_millis() as u64,
                "resuming from checkpoint"
            );
            Ok((engine, seq + 1))
        }
        Ok(Some((seq, Err(e)))) => {
            error!(seq, error = %e, "checkpoint does not restore; rebuilding from the log");
            Ok((Engine::new(Policy::default()), 1))
        }
        Ok(None) => Ok((Engine::new(Policy::default()), 1)),
        Err(e @ StoreError::CorruptCheckpoint { .. }) => {
            error!(error = %e, "rebuilding from the log instead of starting from bad state");
            Ok((Engine::new(Policy::default()), 1))
        }
        Err(e) => Err(e).context("reading the checkpoint"),
    }
}
