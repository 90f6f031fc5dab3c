//! The one error type of the Slurm connector.

use std::path::PathBuf;

/// Everything that can go wrong talking to Slurm (slurmrestd or scontrol).
///
/// [`Error::retryable`] says whether trying the same thing again later may
/// help; the actuator copies it into
/// [`OutcomeResult::Failed`](lockstep_schemas::OutcomeResult::Failed), and
/// the observer keeps polling (with backoff) whatever the error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The connector's configuration cannot work (a bad URL, an empty user).
    /// Not retryable.
    #[error("invalid slurm connector configuration: {0}")]
    Config(String),
    /// The JWT could not be read from its file or environment variable.
    /// Retryable: token files are rotated by other processes.
    #[error("cannot read the slurm jwt from {from}: {detail}")]
    Token {
        /// `file /path` or `environment variable NAME`.
        from: String,
        /// Why (never the token itself).
        detail: String,
        /// The I/O error, if there was one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// slurmrestd could not be reached or the connection broke (refused,
    /// reset, closed early). Retryable.
    #[error("{what}: cannot reach slurmrestd: {source}")]
    Unreachable {
        /// What was asked for, e.g. `GET /slurm/v0.0.38/nodes`.
        what: String,
        /// The transport error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A call (HTTP request or scontrol run) did not finish in time.
    /// Retryable.
    #[error("{what}: timed out after {timeout_ms} ms")]
    Timeout {
        /// What was asked for.
        what: String,
        /// The bound that was hit.
        timeout_ms: u64,
    },
    /// slurmrestd refused the token (HTTP 401 after re-reading it). Retryable:
    /// a new token may be written.
    #[error("{what}: slurmrestd rejected the jwt (http 401)")]
    Unauthorized {
        /// What was asked for.
        what: String,
    },
    /// slurmrestd answered with an HTTP status lockstep does not expect.
    /// Retryable for 5xx, 408 and 429.
    #[error("{what}: slurmrestd answered http {status}: {detail}")]
    Http {
        /// What was asked for.
        what: String,
        /// HTTP status code.
        status: u16,
        /// The errors slurmrestd listed, or the start of its body.
        detail: String,
    },
    /// slurmrestd answered, but listed errors (e.g. slurmctld unreachable,
    /// invalid node name). Whether it is retryable depends on the message
    /// (see [`classify_message`]).
    #[error("{what}: slurm reported: {detail}")]
    Slurm {
        /// What was asked for.
        what: String,
        /// The errors, joined.
        detail: String,
        /// Whether the message says the controller is unreachable or busy.
        retryable: bool,
    },
    /// slurmrestd's answer is not the JSON lockstep expects (truncated,
    /// malformed, a required field missing). Not retryable.
    #[error("{what}: cannot parse slurmrestd's answer: {source}")]
    Malformed {
        /// What was asked for.
        what: String,
        /// The JSON error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// The answer was larger than the configured bound. Not retryable.
    #[error("{what}: answer larger than {limit_bytes} bytes")]
    TooLarge {
        /// What was asked for.
        what: String,
        /// The bound.
        limit_bytes: usize,
    },
    /// slurmrestd serves none of the openapi versions lockstep speaks. Not
    /// retryable.
    #[error("slurmrestd at {url} serves none of the openapi versions lockstep speaks ({tried})")]
    NoApiVersion {
        /// Base URL.
        url: String,
        /// The versions tried, comma separated.
        tried: String,
    },
    /// A program (scontrol) could not be started. Not retryable.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// scontrol ran and failed. Whether it is retryable depends on its
    /// message (see [`classify_message`]).
    #[error("{what}: scontrol failed ({status}): {stderr}")]
    Command {
        /// What was asked for, e.g. `scontrol update nodename=n1 state=drain`.
        what: String,
        /// Exit status, as text.
        status: String,
        /// What it printed on stderr (trimmed).
        stderr: String,
        /// Whether the message says the controller is unreachable or busy.
        retryable: bool,
    },
    /// scontrol's output could not be understood. Not retryable.
    #[error("{what}: cannot parse scontrol output: {detail}")]
    ScontrolOutput {
        /// What was asked for.
        what: String,
        /// What is wrong.
        detail: String,
    },
    /// A hostlist expression (`n[1-3,5]`) is invalid or expands to more names
    /// than the bound. Not retryable.
    #[error("invalid hostlist {expr:?}: {detail}")]
    Hostlist {
        /// The expression (cut to 200 characters).
        expr: String,
        /// What is wrong.
        detail: String,
    },
    /// The node does not exist in slurmctld. Not retryable.
    #[error("slurm node {node:?} not found")]
    NodeNotFound {
        /// The node.
        node: String,
    },
    /// A name or value would not survive the trip to Slurm unchanged (a node
    /// name with a space, a feature with a comma). Not retryable.
    #[error("invalid value for {what}: {value:?}")]
    InvalidValue {
        /// Which field.
        what: &'static str,
        /// The value.
        value: String,
    },
    /// This Slurm cannot do what was asked (per-node topology before 25.05).
    /// Not retryable.
    #[error("not supported by this slurm: {0}")]
    Unsupported(String),
    /// The action is not a Slurm action; it was sent to the wrong actuator.
    /// Not retryable.
    #[error("not a slurm action: {0}")]
    NotSlurm(&'static str),
}

/// Results of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether trying again later may help: timeouts, connection errors,
    /// slurmctld down or busy, server errors, a token that may be replaced.
    pub fn retryable(&self) -> bool {
        match self {
            Self::Token { .. }
            | Self::Unreachable { .. }
            | Self::Timeout { .. }
            | Self::Unauthorized { .. } => true,
            Self::Http { status, .. } => *status >= 500 || matches!(status, 408 | 429),
            Self::Slurm { retryable, .. } | Self::Command { retryable, .. } => *retryable,
            Self::Config(_)
            | Self::Malformed { .. }
            | Self::TooLarge { .. }
            | Self::NoApiVersion { .. }
            | Self::Spawn { .. }
            | Self::ScontrolOutput { .. }
            | Self::Hostlist { .. }
            | Self::NodeNotFound { .. }
            | Self::InvalidValue { .. }
            | Self::Unsupported(_)
            | Self::NotSlurm(_) => false,
        }
    }
}

/// Messages (from scontrol's stderr or slurmrestd's error list) that mean
/// Slurm said no, and saying it again will not change its mind.
const FINAL_MESSAGES: &[&str] = &[
    "invalid node name",
    "invalid node state",
    "invalid state transition",
    "node state transition",
    "invalid feature",
    "invalid argument",
    "not found",
    "access/permission denied",
    "permission denied",
    "invalid user",
    "unrecognized option",
    "invalid partition",
    "invalid job id",
    // 25.05+: a node moved to a topology unit (a block) that topology.yaml
    // does not declare, or to a topology that does not exist.
    "requested topology configuration is not available",
];

/// Messages that mean slurmctld is unreachable, restarting or busy.
const RETRYABLE_MESSAGES: &[&str] = &[
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "connection reset",
    "zero bytes were transmitted or received",
    "resource temporarily unavailable",
    "slurm backup controller in standby mode",
    "communication connection failure",
    "slurmctld is not responding",
    "temporarily",
    "try again",
    "timed out",
];

/// Whether a Slurm error message means "try again later": slurmctld down,
/// restarting, busy or slow. Known final rejections (invalid node name,
/// invalid state transition, permission denied) are not retryable; messages
/// this version does not know are treated as retryable, because retries are
/// bounded by the policy and giving up on a transient failure would leave a
/// node in the wrong state.
pub fn classify_message(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    if RETRYABLE_MESSAGES.iter().any(|p| m.contains(p)) {
        return true;
    }
    !FINAL_MESSAGES.iter().any(|p| m.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_classified() {
        let cases: &[(&str, bool)] = &[
            (
                "slurm_update error: Unable to contact slurm controller (connect failure)",
                true,
            ),
            (
                "slurm_load_node error: Socket timed out on send/recv operation",
                true,
            ),
            ("Connection refused", true),
            ("slurm_update error: Invalid node name specified", false),
            ("slurm_update error: Invalid node state specified", false),
            ("Node ls-n9 not found", false),
            ("slurm_update error: Access/permission denied", false),
            (
                "Failure to update node ls-n2: Requested topology configuration is not available (error 2178)",
                false,
            ),
            ("something nobody has seen before", true),
        ];
        for (msg, want) in cases {
            assert_eq!(classify_message(msg), *want, "{msg}");
        }
    }

    #[test]
    fn retryable_follows_the_kind() {
        let t = Error::Timeout {
            what: "x".into(),
            timeout_ms: 1,
        };
        assert!(t.retryable());
        assert!(!Error::Unsupported("topology".into()).retryable());
        let h = |status| Error::Http {
            what: "x".into(),
            status,
            detail: String::new(),
        };
        assert!(h(503).retryable());
        assert!(h(429).retryable());
        assert!(!h(404).retryable());
        assert_eq!(
            Error::NodeNotFound { node: "n".into() }.to_string(),
            "slurm node \"n\" not found"
        );
    }
}
