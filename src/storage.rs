//! Opening the configured event log and store: the same for `lockstep run`
//! and for the commands that read them (replay, audit, history, rollback),
//! so that neither imports the other. What to do when the log does not
//! answer (wait, give up) is the caller's.

use std::time::Duration;

use anyhow::{Context, Result};
use lockstep_store::{EventLog, Store};

use crate::config::Config;

/// Opens the configured log: the NATS stream at `[log] nats_url`, or the
/// embedded log in the data directory, waiting up to `wait` for another
/// process's lock on it (as [`open_store`] does).
pub async fn open_log(cfg: &Config, wait: Duration) -> Result<EventLog> {
    match &cfg.log.nats_url {
        Some(url) => EventLog::connect_nats(url, &cfg.stream_limits())
            .await
            .with_context(|| format!("connecting to the event log at {url}")),
        None => {
            let dir = cfg.data_dir.join("log");
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            EventLog::open_embedded_waiting(&dir, wait).with_context(|| {
                format!(
                    "opening the embedded log in {} (is another lockstep running on it?)",
                    dir.display()
                )
            })
        }
    }
}

/// Opens the store, waiting up to `wait` for another process's lock (the
/// service: [`crate::service::LOCK_WAIT`]; commands that read the
/// store: none).
pub fn open_store(cfg: &Config, wait: Duration) -> Result<Store> {
    let dir = cfg.data_dir.join("store");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Store::open_waiting(&dir, wait).with_context(|| {
        format!(
            "opening the store in {} (is another lockstep running on it?)",
            dir.display()
        )
    })
}
