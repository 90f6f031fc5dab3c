//! lockstep-testkit: what lockstep's tests and benchmark programs share.
//!
//! - [`nats`]: a real nats-server, and a real three-server JetStream
//!   cluster whose servers a test kills, wipes, freezes and thaws;
//! - [`kube`]: a real kube-apiserver (and etcd) started by
//!   `deploy/local/kube/up.sh`, kubectl against it, and the objects the
//!   tests create;
//! - [`net`]: free loopback ports and a TCP proxy a test can cut;
//! - [`gen`]: synthetic logs of a cluster (the benchmarks measure them, the
//!   tests replay and serve them);
//! - `soak` (feature `soak`): the crash and fault harness that drives
//!   `lockstep run` processes and checks what they leave behind;
//! - here: temporary directories, the repository root, waits, and actions
//!   as the reducer would issue them.
//!
//! No crate that ships depends on it (the tests, and the benchmark programs
//! of lockstep-benches, which does not ship), so nothing here may be needed
//! to run lockstep. It starts real servers and
//! fails loudly when one is missing, never skips.

pub mod gen;
pub mod kube;
pub mod nats;
pub mod net;
#[cfg(feature = "soak")]
pub mod soak;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lockstep_schemas::{Action, ActionId, EventId, IssuedAction};

pub use nats::{NatsCluster, NatsServer, StreamPeers, JETSTREAM_CONF};
pub use net::{free_port, Proxy};

/// The repository root (where `deploy/` and `scripts/` are).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ is in the repository")
        .to_owned()
}

/// A fresh temporary directory, never another call's (even on another
/// thread in the same nanosecond).
pub fn temp_dir(name: &str) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "lockstep-{name}-{}-{}-{call}",
        std::process::id(),
        nanos()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Nanoseconds since 1970: a suffix or seed that differs between runs.
pub(crate) fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// An HTTP GET of `path` on `127.0.0.1:port` (lockstep's telemetry
/// endpoint): status code and body; `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_owned();
    Some((code, body))
}

/// Waits until `f` gives a value, polling every 100 ms; panics after `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    wait_showing(what, limit, || f().ok_or_else(String::new))
}

/// Waits until `f` gives `Ok`, polling every 100 ms; panics after `limit`,
/// naming what `f` saw last (its `Err`, when not empty).
pub fn wait_showing<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let t = Instant::now();
    loop {
        let seen = match f() {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        if t.elapsed() >= limit {
            if seen.is_empty() {
                panic!("{what}: not within {limit:?}");
            }
            panic!("{what}: not within {limit:?} (last seen: {seen})");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `action` as the reducer would issue it at sequence `seq` (its id derived
/// from the sequence, kind and target; cause and rule `test`; first attempt).
pub fn issued(seq: u64, action: Action) -> IssuedAction {
    IssuedAction {
        id: ActionId::derive(seq, action.kind(), &action.target()),
        seq,
        time_ms: 0,
        cause: EventId("test".to_owned()),
        rule: "test".to_owned(),
        attempt: 1,
        action,
    }
}
