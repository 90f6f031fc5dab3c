//! The one error type of the Kubernetes connector.

use std::path::PathBuf;

/// Everything that can go wrong talking to the Kubernetes API.
///
/// [`Error::retryable`] says whether trying the same thing again later may
/// help; the actuator copies it into
/// [`OutcomeResult::Failed`](lockstep_schemas::OutcomeResult::Failed).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig file could not be read or used. Not retryable.
    #[error("cannot use kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No client could be built from the configuration (TLS setup, bad
    /// URL). Not retryable.
    #[error("cannot build kubernetes client: {0}")]
    Client(#[source] Box<kube::Error>),
    /// The object does not exist (HTTP 404). Not retryable.
    #[error("{what}: not found")]
    NotFound {
        /// What was asked for, e.g. `get pod default/p1`.
        what: String,
    },
    /// The API server answered with an error status. Retryable for 409
    /// (conflict), 429 (too many requests) and 5xx; not retryable for the
    /// other 4xx (400 and 422 are invalid requests, 401/403 are missing
    /// rights that waiting will not grant).
    #[error("{what}: kubernetes api answered {code} {reason}: {message}")]
    Api {
        /// What was asked for.
        what: String,
        /// HTTP status code.
        code: u16,
        /// Machine-readable reason (`Conflict`, `Invalid`, ...).
        reason: String,
        /// The server's message.
        message: String,
        /// The client error.
        #[source]
        source: Box<kube::Error>,
    },
    /// A delete's UID precondition failed: the pod with that name is not the
    /// pod the action meant. Not retryable: the reducer must decide again
    /// about the new pod.
    #[error("{what}: refused, uid precondition failed: {message}")]
    UidPrecondition {
        /// What was asked for.
        what: String,
        /// The server's (or our own check's) message.
        message: String,
    },
    /// The API server could not be reached, or the connection broke
    /// (connect error, TLS error, reset, read timeout). Retryable.
    #[error("{what}: cannot reach the kubernetes api: {source}")]
    Unreachable {
        /// What was asked for.
        what: String,
        /// The client error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The API server's answer could not be understood. Not retryable.
    #[error("{what}: cannot read the kubernetes api's answer: {source}")]
    Decode {
        /// What was asked for.
        what: String,
        /// The client error.
        #[source]
        source: Box<kube::Error>,
    },
    /// A call or a whole action did not finish in time. Retryable.
    #[error("{what}: timed out after {timeout_ms} ms")]
    Timeout {
        /// What was asked for.
        what: String,
        /// The bound that was hit.
        timeout_ms: u64,
    },
    /// A scale target's kind is not one the policy in force names (see
    /// [`scale_kinds`](super::scale_kinds)), so the actuator does not scale
    /// it. Not retryable.
    #[error("unknown scale target kind {kind} in api group {group:?}")]
    UnknownScaleKind {
        /// API group.
        group: String,
        /// Kind.
        kind: String,
    },
    /// A scale target's kind is not served by the API server (no such API
    /// group or kind: its CRD is not installed), or is served without a
    /// scale subresource. Not retryable: installing the CRD is not
    /// something waiting does; the next action asks again.
    #[error("scale target kind {kind} in api group {group:?} {why}")]
    UnservedScaleKind {
        /// API group.
        group: String,
        /// Kind.
        kind: String,
        /// What discovery said.
        why: &'static str,
    },
    /// An object lacks a field lockstep needs (a node without a name). Not
    /// retryable.
    #[error("{what}: {detail}")]
    Malformed {
        /// What was read.
        what: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The action is not a Kubernetes action; it was sent to the wrong
    /// actuator. Not retryable.
    #[error("not a kubernetes action: {0}")]
    NotKubernetes(&'static str),
}

/// Results of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether trying again later may help (timeouts, conflicts, throttling,
    /// server errors, connection errors).
    pub fn retryable(&self) -> bool {
        match self {
            Self::Api { code, .. } => status_retryable(*code),
            Self::Unreachable { .. } | Self::Timeout { .. } => true,
            Self::Kubeconfig { .. }
            | Self::Client(_)
            | Self::NotFound { .. }
            | Self::UidPrecondition { .. }
            | Self::Decode { .. }
            | Self::UnknownScaleKind { .. }
            | Self::UnservedScaleKind { .. }
            | Self::Malformed { .. }
            | Self::NotKubernetes(_) => false,
        }
    }

    /// Classifies a client error from the call described by `what`.
    pub fn from_kube(what: impl Into<String>, err: kube::Error) -> Self {
        let what = what.into();
        match err {
            kube::Error::Api(ref status) if status.code == 404 => Self::NotFound { what },
            kube::Error::Api(ref status)
                if status.code == 409
                    && status.message.to_ascii_lowercase().contains("precondition") =>
            {
                Self::UidPrecondition {
                    what,
                    message: status.message.clone(),
                }
            }
            kube::Error::Api(ref status) => Self::Api {
                what,
                code: status.code,
                reason: status.reason.clone(),
                message: status.message.clone(),
                source: Box::new(err),
            },
            kube::Error::HyperError(_)
            | kube::Error::Service(_)
            | kube::Error::ReadEvents(_)
            | kube::Error::RustlsTls(_)
            | kube::Error::Auth(_) => Self::Unreachable {
                what,
                source: Box::new(err),
            },
            _ => Self::Decode {
                what,
                source: Box::new(err),
            },
        }
    }

    /// Whether this error means lockstep cannot see the cluster (as opposed
    /// to one request being wrong): connection errors, timeouts, server
    /// errors, and missing rights.
    pub fn blinds(&self) -> bool {
        match self {
            Self::Api { code, .. } => *code >= 500 || *code == 401 || *code == 403,
            Self::Unreachable { .. } | Self::Timeout { .. } => true,
            _ => false,
        }
    }
}

/// Whether an HTTP status from the API server is worth retrying.
pub(crate) const fn status_retryable(code: u16) -> bool {
    matches!(code, 409 | 429) || code >= 500
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.to_owned(),
            message: message.to_owned(),
            ..kube::core::Status::default()
        }))
    }

    #[test]
    fn classification_table() {
        // (code, reason, message, retryable, blinds)
        let cases = [
            (400, "BadRequest", "bad", false, false),
            (401, "Unauthorized", "no", false, true),
            (403, "Forbidden", "no", false, true),
            (404, "NotFound", "gone", false, false),
            (409, "Conflict", "the object has been modified", true, false),
            (
                409,
                "Conflict",
                "Precondition failed: UID in precondition: a, UID in object meta: b",
                false,
                false,
            ),
            (410, "Expired", "too old resource version", false, false),
            (422, "Invalid", "invalid label", false, false),
            (429, "TooManyRequests", "slow down", true, false),
            (500, "InternalError", "etcd", true, true),
            (503, "ServiceUnavailable", "etcd", true, true),
            (504, "Timeout", "etcd", true, true),
        ];
        for (code, reason, message, retryable, blinds) in cases {
            let e = Error::from_kube("get pod default/p", api(code, reason, message));
            assert_eq!(e.retryable(), retryable, "{code} {message}: {e}");
            assert_eq!(e.blinds(), blinds, "{code} {message}: {e}");
        }
    }

    #[test]
    fn messages_are_lowercase_and_name_the_call() {
        let e = Error::from_kube("get pod default/p", api(404, "NotFound", "x"));
        assert_eq!(e.to_string(), "get pod default/p: not found");
        let e = Error::Timeout {
            what: "patch node n".to_owned(),
            timeout_ms: 5,
        };
        assert_eq!(e.to_string(), "patch node n: timed out after 5 ms");
        assert!(e.retryable());
    }
}
