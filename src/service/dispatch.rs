//! Dispatch: publish actions on the action stream, record them, and hand
//! those this instance was first to publish to its actuators.

use anyhow::{Context, Result};
use lockstep_connectors::backoff::{retry, Backoff};
use lockstep_schemas::IssuedAction;
use lockstep_store::{EventLog, Store};

use super::connectors::{Actuators, APPEND_BACKOFF_MAX_MS};
use crate::telemetry;

/// Actions published, recorded and handed over at a time: what one
/// publication holds in memory (payloads and acks) is bounded by it, not by
/// how many actions a batch or a take-over has.
pub(super) const DISPATCH_PAGE: usize = 1024;

/// Publishes actions the ledger has not dispatched, records them, then
/// hands those this call was first to publish and that `carry_out` accepts
/// to the actuators of this process; [`DISPATCH_PAGE`] actions at a time,
/// in order.
pub(super) async fn dispatch(
    store: &Store,
    log: &EventLog,
    actuators: &Actuators,
    actions: &[IssuedAction],
    carry_out: impl Fn(&IssuedAction) -> bool,
) -> Result<()> {
    for page in actions.chunks(DISPATCH_PAGE) {
        dispatch_page(store, log, actuators, page, &carry_out).await?;
    }
    Ok(())
}

async fn dispatch_page(
    store: &Store,
    log: &EventLog,
    actuators: &Actuators,
    actions: &[IssuedAction],
    carry_out: &impl Fn(&IssuedAction) -> bool,
) -> Result<()> {
    let mut todo = Vec::with_capacity(actions.len());
    for a in actions {
        if store.ledger_entry(&a.id)?.is_some_and(|e| e.dispatched > 0) {
            continue;
        }
        todo.push(a.clone());
    }
    if todo.is_empty() {
        return Ok(());
    }
    let fresh = retry(
        &mut Backoff::new(100, APPEND_BACKOFF_MAX_MS),
        || log.publish_actions(&todo),
        |e, retry_in| {
            if e.is_retryable() {
                telemetry::LogUnavailable {
                    what: "publish actions",
                    error: e,
                    retry_in,
                }
                .emit();
            }
            e.is_retryable()
        },
    )
    .await
    .context("publishing actions")?;
    let ids: Vec<_> = todo.iter().map(|a| a.id.clone()).collect();
    store.mark_dispatched(&ids)?;
    store.flush().await?;
    // Only the instance whose publication was the first carries an action
    // out: an action id is executed at most once, whoever leads.
    let (ours, theirs): (Vec<_>, Vec<_>) = todo.into_iter().zip(fresh).partition(|(_, f)| *f);
    let ours: Vec<_> = ours
        .into_iter()
        .map(|(a, _)| a)
        .filter(|a| carry_out(a))
        .collect();
    let theirs: Vec<_> = theirs.into_iter().map(|(a, _)| a.id).collect();
    telemetry::ActionsDispatched { count: ours.len() }.emit();
    telemetry::ActionsAlreadyPublished { ids: &theirs }.emit();
    actuators.hand_over(&ours).await;
    Ok(())
}
