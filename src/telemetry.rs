//! Telemetry: one typed event per thing that happens, whose `emit()` writes
//! both the log line and the metric (vector's instrumentation spec). Metric
//! names are `lockstep_<name>_<unit>`; labels come from small fixed sets,
//! never a node name.
//!
//! Also the HTTP endpoint: `/metrics` (Prometheus), `/livez`, `/readyz`,
//! `/status`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use lockstep_engine::Output;
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::PrometheusHandle;
use tracing::{debug, info, warn};

use crate::config::LogFormat;

/// Sets up `tracing` (filter from `RUST_LOG`, default `info`) on stderr,
/// in colour only on a terminal (and never with `NO_COLOR` set): a log file
/// or a container's log stays plain text.
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Installs the Prometheus recorder.
pub fn install_metrics() -> Result<PrometheusHandle> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")
}

/// What `/readyz` and `/status` report; shared with the apply loop.
#[derive(Debug, Default)]
pub struct Health {
    /// The loop has caught up with the log at least once.
    pub ready: AtomicBool,
    /// Last applied sequence.
    pub applied_seq: AtomicU64,
    /// Last known head of the log.
    pub head_seq: AtomicU64,
    /// Sequence of the last checkpoint.
    pub checkpoint_seq: AtomicU64,
    /// This instance leads: it observes, dispatches and carries out actions.
    pub leader: AtomicBool,
    /// Why the loop cannot start yet (the event log does not answer), for
    /// `/readyz`; `None` once it has the log.
    pub waiting: std::sync::Mutex<Option<String>>,
}

impl Health {
    /// What `/readyz` says while not ready.
    fn not_ready_reason(&self) -> String {
        match &*self.waiting.lock().expect("health lock poisoned") {
            Some(why) => format!("{why}\n"),
            None => "catching up with the log\n".to_owned(),
        }
    }
}

/// A batch was applied and committed.
pub struct BatchCommitted<'a> {
    /// Records in the batch.
    pub records: usize,
    /// Last sequence applied.
    pub last_seq: u64,
    /// What the batch produced.
    pub output: &'a Output,
    /// Time applying.
    pub apply: Duration,
    /// Time committing (transaction and flush).
    pub commit: Duration,
}

impl BatchCommitted<'_> {
    /// Logs and counts it.
    pub fn emit(&self) {
        debug!(
            records = self.records,
            last_seq = self.last_seq,
            transitions = self.output.transitions.len(),
            actions = self.output.actions.len(),
            "batch committed"
        );
        counter!("lockstep_events_applied_total").increment(self.records as u64);
        counter!("lockstep_transitions_total").increment(self.output.transitions.len() as u64);
        for a in &self.output.actions {
            counter!("lockstep_actions_issued_total", "kind" => a.action.kind().name())
                .increment(1);
        }
        histogram!("lockstep_apply_batch_seconds").record(self.apply.as_secs_f64());
        histogram!("lockstep_commit_seconds").record(self.commit.as_secs_f64());
        gauge!("lockstep_applied_seq").set(self.last_seq as f64);
    }
}

/// An action outcome was read from the log.
pub struct OutcomeApplied<'a> {
    /// The action's kind.
    pub kind: &'static str,
    /// `succeeded`, `already_done`, `failed_retryable`, `failed`.
    pub result: &'a str,
}

impl OutcomeApplied<'_> {
    /// Counts it.
    pub fn emit(&self) {
        counter!("lockstep_action_outcomes_total", "kind" => self.kind, "result" => self.result.to_owned()).increment(1);
    }
}

/// Actions were handed to the action stream.
pub struct ActionsDispatched {
    /// How many.
    pub count: usize,
}

impl ActionsDispatched {
    /// Logs and counts it.
    pub fn emit(&self) {
        if self.count > 0 {
            info!(count = self.count, "actions dispatched");
        }
        counter!("lockstep_actions_dispatched_total").increment(self.count as u64);
    }
}

/// Actions another instance (or an earlier life of this one) had already
/// published: this instance does not carry them out.
pub struct ActionsAlreadyPublished<'a> {
    /// Their ids.
    pub ids: &'a [lockstep_schemas::ActionId],
}

impl ActionsAlreadyPublished<'_> {
    /// Logs and counts it.
    pub fn emit(&self) {
        if self.ids.is_empty() {
            return;
        }
        info!(
            count = self.ids.len(),
            first = %self.ids[0].0,
            "actions already on the action stream; not carried out again (a lost one is retried by the reducer after its timeout)"
        );
        counter!("lockstep_actions_already_published_total").increment(self.ids.len() as u64);
    }
}

/// This instance started or stopped leading.
pub fn record_leader(leader: bool) {
    gauge!("lockstep_leader").set(if leader { 1.0 } else { 0.0 });
}

/// A checkpoint was written.
pub struct CheckpointWritten {
    /// Its sequence.
    pub seq: u64,
    /// Its size.
    pub bytes: usize,
    /// Time taking the snapshot.
    pub took: Duration,
}

impl CheckpointWritten {
    /// Logs and measures it.
    pub fn emit(&self) {
        info!(
            seq = self.seq,
            bytes = self.bytes,
            took_ms = self.took.as_millis() as u64,
            "checkpoint written"
        );
        gauge!("lockstep_checkpoint_bytes").set(self.bytes as f64);
        histogram!("lockstep_checkpoint_seconds").record(self.took.as_secs_f64());
    }
}

/// Reading or writing the log failed; the loop retries.
pub struct LogUnavailable<'a> {
    /// What failed.
    pub what: &'static str,
    /// The error.
    pub error: &'a dyn std::fmt::Display,
    /// Next try in.
    pub retry_in: Duration,
}

impl LogUnavailable<'_> {
    /// Logs and counts it.
    pub fn emit(&self) {
        warn!(what = self.what, error = %self.error, retry_in_ms = self.retry_in.as_millis() as u64, "event log unavailable; retrying");
        counter!("lockstep_log_reconnects_total").increment(1);
    }
}

/// The log's head moved.
pub fn record_lag(head: u64, applied: u64) {
    gauge!("lockstep_log_lag_records").set(head.saturating_sub(applied) as f64);
}

/// Serves `/metrics`, `/livez`, `/readyz` and `/status` until the task is dropped.
pub async fn serve(addr: SocketAddr, metrics: PrometheusHandle, health: Arc<Health>) -> Result<()> {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::{Response, StatusCode};

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the telemetry endpoint on {addr}"))?;
    info!(%addr, "serving /metrics /livez /readyz /status");
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "telemetry accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(
                move |req: hyper::Request<hyper::body::Incoming>| {
                    let metrics = metrics.clone();
                    let health = health.clone();
                    async move {
                        let (status, body) = match req.uri().path() {
                        "/metrics" => (StatusCode::OK, metrics.render()),
                        "/livez" => (StatusCode::OK, "ok\n".to_owned()),
                        "/readyz" if health.ready.load(Ordering::Relaxed) => (StatusCode::OK, "ok\n".to_owned()),
                        "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, health.not_ready_reason()),
                        "/status" => (
                            StatusCode::OK,
                            format!(
                                "{{\"ready\":{},\"leader\":{},\"applied_seq\":{},\"head_seq\":{},\"checkpoint_seq\":{}}}\n",
                                health.ready.load(Ordering::Relaxed),
                                health.leader.load(Ordering::Relaxed),
                                health.applied_seq.load(Ordering::Relaxed),
                                health.head_seq.load(Ordering::Relaxed),
                                health.checkpoint_seq.load(Ordering::Relaxed)
                            ),
                        ),
                        _ => (StatusCode::NOT_FOUND, "not found\n".to_owned()),
                    };
                        let mut resp = Response::new(Full::new(Bytes::from(body)));
                        *resp.status_mut() = status;
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                },
            );
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}
