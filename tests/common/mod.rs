//! What the tests on the real local stack share.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};

/// Where `deploy/local/*/up.sh` keep their state in these tests.
pub const STATE: &str = "/tmp/lockstep-local";

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The kubectl that `deploy/local/kube/up.sh` built (its env.sh names the directory).
pub fn kubectl_path() -> PathBuf {
    let env = std::fs::read_to_string(Path::new(STATE).join("kube/env.sh")).unwrap();
    let dir = env
        .split("PATH='")
        .nth(1)
        .and_then(|s| s.split('\'').next())
        .expect("env.sh names the kubectl directory");
    PathBuf::from(dir).join("kubectl")
}

/// A `lockstep run` child: stopped with SIGTERM by the test, or killed if
/// the test ends early, so a failed test leaves none behind.
pub struct Reap(pub Option<Child>);

impl Reap {
    /// SIGTERM, then waits for the exit.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.0.take().expect("still running");
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        child.wait().unwrap()
    }
}

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
