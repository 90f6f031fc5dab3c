//! The JWT slurmrestd wants in `X-SLURM-USER-TOKEN`: read from a file or an
//! environment variable, re-read before it expires and after a 401, and never
//! logged (its `Debug` is redacted).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::clock::now_s;

use super::error::{Error, Result};

/// Where the JWT comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// A file holding the token, as `scontrol token` prints it (with or
    /// without the `SLURM_JWT=` prefix). Re-read when it may have changed.
    File(PathBuf),
    /// An environment variable holding the token (e.g. `SLURM_JWT`). Note
    /// that Slurm's own programs switch to JWT auth when `SLURM_JWT` is set
    /// in their environment; a file keeps it out of every child's.
    Env(String),
}

impl TokenSource {
    fn describe(&self) -> String {
        match self {
            Self::File(p) => format!("file {}", p.display()),
            Self::Env(v) => format!("environment variable {v}"),
        }
    }

    /// Reads the token now.
    pub(crate) fn read(&self) -> Result<Token> {
        let raw = match self {
            Self::File(p) => std::fs::read_to_string(p).map_err(|e| Error::Token {
                from: self.describe(),
                detail: e.kind().to_string(),
                source: Some(e),
            })?,
            Self::Env(v) => std::env::var(v).map_err(|e| Error::Token {
                from: self.describe(),
                detail: e.to_string(),
                source: None,
            })?,
        };
        let value = raw.trim();
        let value = value.strip_prefix("SLURM_JWT=").unwrap_or(value).trim();
        if value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::Token {
                from: self.describe(),
                detail: "empty or not a single token".to_owned(),
                source: None,
            });
        }
        let exp_s = jwt_exp(value);
        if let Some(exp) = exp_s {
            if exp <= now_s() {
                tracing::warn!(
                    source = %self.describe(),
                    expired_at = exp,
                    "the slurm jwt has expired; slurmrestd will reject it until it is replaced"
                );
            }
        }
        Ok(Token {
            value: value.to_owned(),
            exp_s,
            read_at: Instant::now(),
        })
    }
}

/// A JWT as read, with its expiry.
#[derive(Clone)]
pub(crate) struct Token {
    pub(crate) value: String,
    /// `exp` claim, Unix seconds, if the token has one.
    pub(crate) exp_s: Option<u64>,
    pub(crate) read_at: Instant,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("value", &"<redacted>")
            .field("exp_s", &self.exp_s)
            .finish()
    }
}

impl Token {
    /// Whether to read the source again before using it: it is older than
    /// `reread`, or it expires within `refresh_before`.
    pub(crate) fn stale(&self, reread: Duration, refresh_before: Duration) -> bool {
        self.read_at.elapsed() >= reread
            || self
                .exp_s
                .is_some_and(|exp| now_s() + refresh_before.as_secs() >= exp)
    }
}

/// The `exp` claim of a JWT, without checking anything else (slurmctld
/// checks the signature; lockstep only needs to know when to re-read).
fn jwt_exp(token: &str) -> Option<u64> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64url_decode(payload)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v.get("exp")?.as_u64()
}

fn base64url_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // {"alg":"HS256","typ":"JWT"} . {"exp":1796088376,"iat":1796001976,"sun":"root"} . sig
    const JWT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJleHAiOjE3OTYwODgzNzYsImlhdCI6MTc5NjAwMTk3Niwic3VuIjoicm9vdCJ9.c2ln";

    #[test]
    fn exp_is_read_from_the_payload() {
        assert_eq!(jwt_exp(JWT), Some(1_796_088_376));
        assert_eq!(jwt_exp("not-a-jwt"), None);
    }

    #[test]
    fn file_tokens_accept_the_scontrol_prefix_and_are_never_printed() {
        let dir = std::env::temp_dir().join(format!("lockstep-token-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, format!("SLURM_JWT={JWT}\n")).unwrap();
        let t = TokenSource::File(path.clone()).read().unwrap();
        assert_eq!(t.value, JWT);
        assert!(!format!("{t:?}").contains("eyJ"));
        std::fs::write(&path, "two words\n").unwrap();
        let e = TokenSource::File(path).read().unwrap_err();
        assert!(e.retryable());
        assert!(!e.to_string().contains("two"), "{e}");
        let missing = TokenSource::File(dir.join("missing")).read().unwrap_err();
        assert!(
            missing.to_string().contains("cannot read the slurm jwt"),
            "{missing}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
