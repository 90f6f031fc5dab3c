//! What the tests on the real local stack share.

#![allow(dead_code)]

pub mod node;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};

pub use lockstep_testkit::{repo, wait_for};

/// Where `deploy/local/*/up.sh` keep their state in these tests.
pub const STATE: &str = "/tmp/lockstep-local";

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

/// The whole local stack: a real Slurm (slurmctld, slurmd, slurmrestd) and
/// a real kube-apiserver, started (or found running) by `deploy/local`, and
/// the kubeconfig of lockstep's ServiceAccount bound to
/// `deploy/kubernetes/rbac.yaml`.
pub struct Stack {
    /// What `deploy/local/slurm/env.sh` exports (for the Slurm version
    /// asked for: `SLURM_CONF`, `SLURMRESTD_URL`, `SLURM_JWT_FILE`,
    /// `LOCKSTEP_SLURM_BIN`, ...).
    pub slurm: std::collections::BTreeMap<String, String>,
    /// The cluster-admin kubeconfig (for the test's own kubectl).
    pub admin_kubeconfig: PathBuf,
    /// lockstep's ServiceAccount kubeconfig (for `lockstep run`).
    pub lockstep_kubeconfig: PathBuf,
    /// kubectl.
    pub kubectl_bin: PathBuf,
}

/// Runs an up.sh and returns the variables its env.sh exports.
pub fn up(script: &str, env_file: &str) -> std::collections::BTreeMap<String, String> {
    let out = Command::new(repo().join(script))
        .env("LOCKSTEP_STATE_DIR", STATE)
        .output()
        .unwrap_or_else(|e| panic!("{script}: {e}"));
    assert!(
        out.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(Path::new(STATE).join(env_file))
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            (
                k.to_owned(),
                v.trim_matches('\'').trim_matches('"').to_owned(),
            )
        })
        .collect()
}

/// The Slurm versions `deploy/local/slurm/up.sh` runs; the newest is where
/// the tests that run on one version only run.
pub const SLURM_VERSIONS: [&str; 3] = ["22.05", "24.11", "26.05"];
/// The newest Slurm the tests run.
pub const SLURM_NEWEST: &str = "26.05";

/// Runs `deploy/local/slurm/up.sh` for Slurm `version` (22.05, 24.11 or
/// 26.05; it builds the version's Debian root the first time) and returns
/// the variables it exports. Several versions run side by side, each on its
/// own ports and state dir.
pub fn slurm_up(version: &str) -> std::collections::BTreeMap<String, String> {
    let script = repo().join("deploy/local/slurm/up.sh");
    let out = Command::new(&script)
        .env("LOCKSTEP_STATE_DIR", STATE)
        .env("LOCKSTEP_SLURM_VERSION", version)
        .env_remove("LOCKSTEP_SLURM_STATE_DIR")
        .env_remove("SLURM_JWT")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    assert!(
        out.status.success(),
        "deploy/local/slurm/up.sh for Slurm {version} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env: std::collections::BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(
        env.get("LOCKSTEP_SLURM_VERSION").map(String::as_str),
        Some(version)
    );
    env
}

/// Applies `deploy/kubernetes/rbac.yaml` to the running local API server and
/// returns the kubeconfig of lockstep's ServiceAccount: what lockstep runs
/// with in these tests, never cluster-admin.
pub fn lockstep_kubeconfig() -> PathBuf {
    let out = Command::new(repo().join("deploy/local/kube/service-account.sh"))
        .env("LOCKSTEP_STATE_DIR", STATE)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "service-account.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

impl Stack {
    /// Starts what is not running (Slurm 22.05); fails loudly if anything
    /// cannot start.
    pub fn up() -> Self {
        Self::with_slurm("22.05")
    }

    /// The same with Slurm `version` (see [`SLURM_VERSIONS`]).
    pub fn with_slurm(version: &str) -> Self {
        let slurm = slurm_up(version);
        let kube = up("deploy/local/kube/up.sh", "kube/env.sh");
        Self {
            slurm,
            admin_kubeconfig: PathBuf::from(&kube["KUBECONFIG"]),
            lockstep_kubeconfig: lockstep_kubeconfig(),
            kubectl_bin: kubectl_path(),
        }
    }

    /// kubectl as cluster-admin; `Err(stderr)` when it fails.
    pub fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write;
        let mut child = Command::new(&self.kubectl_bin)
            .args(args)
            .env("KUBECONFIG", &self.admin_kubeconfig)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            let mut input = input;
            input.write_all(s.as_bytes()).unwrap();
        } else {
            drop(input);
        }
        let out = child.wait_with_output().unwrap();
        if out.status.success() {
            Ok(String::from_utf8(out.stdout).unwrap())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// kubectl as cluster-admin; panics when it fails.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        self.try_kubectl(args, stdin)
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"))
    }

    /// `kubectl apply` of one object.
    pub fn apply(&self, object: &serde_json::Value) {
        self.kubectl(&["apply", "-f", "-"], Some(&object.to_string()));
    }

    /// `kubectl get ... -o json`, or `None` when it does not exist.
    pub fn get(&self, args: &[&str]) -> Option<serde_json::Value> {
        let mut a = vec!["get"];
        a.extend(args);
        a.extend(["-o", "json"]);
        match self.try_kubectl(&a, None) {
            Ok(s) => Some(serde_json::from_str(&s).unwrap()),
            Err(e) if e.contains("NotFound") => None,
            Err(e) => panic!("kubectl {a:?}: {e}"),
        }
    }

    /// The Slurm version this stack runs.
    pub fn slurm_version(&self) -> &str {
        &self.slurm["LOCKSTEP_SLURM_VERSION"]
    }

    /// `PATH` with this Slurm's client programs first (up.sh's wrappers:
    /// the right version and `SLURM_CONF`), for `lockstep run`.
    pub fn slurm_path(&self) -> String {
        format!(
            "{}:{}",
            self.slurm["LOCKSTEP_SLURM_BIN"],
            std::env::var("PATH").unwrap_or_default()
        )
    }

    /// A Slurm command of this stack's version, with its `SLURM_CONF`;
    /// `Err(stderr)` when it fails.
    pub fn try_slurm(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let out = Command::new(Path::new(&self.slurm["LOCKSTEP_SLURM_BIN"]).join(program))
            .args(args)
            .env("SLURM_CONF", &self.slurm["SLURM_CONF"])
            .env_remove("SLURM_JWT")
            .current_dir("/tmp")
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// A Slurm command; panics when it fails.
    pub fn slurm(&self, program: &str, args: &[&str]) -> String {
        self.try_slurm(program, args)
            .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"))
    }

    /// `scontrol show node N -o`.
    pub fn slurm_node(&self, node: &str) -> String {
        self.slurm("scontrol", &["show", "node", node, "-o"])
    }

    /// `scontrol update nodename=N state=drain reason=R`, as an admin does.
    pub fn admin_drain(&self, node: &str, reason: &str) {
        let (node, reason) = (format!("nodename={node}"), format!("reason={reason}"));
        self.slurm("scontrol", &["update", &node, "state=drain", &reason]);
    }

    /// `scontrol update nodename=N state=resume`, as an admin does.
    pub fn admin_resume(&self, node: &str) {
        let node = format!("nodename={node}");
        self.slurm("scontrol", &["update", &node, "state=resume"]);
    }

    /// Submits `sbatch --wrap CMD` with these options; returns the job id.
    pub fn sbatch(&self, options: &[&str], cmd: &str) -> String {
        let mut a = vec!["--parsable", "--output=/dev/null"];
        a.extend(options);
        a.extend(["--wrap", cmd]);
        self.slurm("sbatch", &a).trim().to_owned()
    }

    /// `squeue` state of a job (`PENDING`, `RUNNING`, ...), `None` once gone.
    pub fn job_state(&self, id: &str) -> Option<String> {
        let s = self
            .try_slurm("squeue", &["-h", "-j", id, "-o", "%T"])
            .unwrap_or_default();
        let s = s.trim();
        (!s.is_empty()).then(|| s.to_owned())
    }
}

/// One `lockstep run`, in its own directory, killed when dropped.
pub struct Lockstep {
    /// The process.
    pub child: Reap,
    /// Its directory (config, policy, data, `run.log`).
    pub dir: PathBuf,
    /// Its telemetry address.
    pub telemetry: String,
}

impl Lockstep {
    /// Starts `lockstep run` with `config` (TOML, without `[telemetry]`,
    /// which this adds) and `policy` (JSON) in `dir`.
    pub fn start(dir: &Path, config: &str, policy: &serde_json::Value) -> Self {
        Self::start_with_env(dir, config, policy, &[])
    }

    /// The same with more environment variables (e.g. `PATH` with the
    /// stack's Slurm programs first: [`Stack::slurm_path`]).
    pub fn start_with_env(
        dir: &Path,
        config: &str,
        policy: &serde_json::Value,
        env: &[(&str, String)],
    ) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("policy.json"), policy.to_string()).unwrap();
        let telemetry = format!("127.0.0.1:{}", lockstep_testkit::free_port());
        std::fs::write(
            dir.join("lockstep.toml"),
            format!(
                "data_dir = \"data\"\npolicy_file = \"policy.json\"\n{config}\n[telemetry]\nlisten = \"{telemetry}\"\n"
            ),
        )
        .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockstep"));
        cmd.args(["run", "--config"])
            .arg(dir.join("lockstep.toml"))
            .env_remove("SLURM_JWT")
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .env("RUST_LOG", "info");
        Self::spawn(cmd, dir, telemetry)
    }

    /// A `lockstep` started from `cmd` as the caller built it (its stderr
    /// to `dir/run.log`), answering on `telemetry`.
    pub fn spawn(mut cmd: Command, dir: &Path, telemetry: String) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("run.log")).unwrap())
            .spawn()
            .unwrap();
        Self {
            child: Reap(Some(child)),
            dir: dir.to_owned(),
            telemetry,
        }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("run.log")).unwrap_or_default()
    }

    /// Its `/status`, or `None` while it does not answer.
    pub fn status(&self) -> Option<serde_json::Value> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.telemetry).ok()?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .ok()?;
        s.write_all(b"GET /status HTTP/1.0\r\nHost: x\r\n\r\n")
            .ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).ok()?;
        let body = buf.split("\r\n\r\n").nth(1)?;
        serde_json::from_str(body).ok()
    }

    /// Whether it leads and acts.
    pub fn leads(&self) -> bool {
        self.status().is_some_and(|s| s["leader"] == true)
    }

    /// SIGKILL, no goodbye.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.0.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }
}

/// Every record of a log up to its head (a read returns what is at hand, in
/// batches).
pub async fn read_all(log: &lockstep_store::EventLog) -> Vec<lockstep_schemas::EventRecord> {
    let head = log.head().await.unwrap();
    let mut out: Vec<lockstep_schemas::EventRecord> = Vec::new();
    let mut next = 1;
    while next <= head {
        let batch = log
            .read(next, 4096, std::time::Duration::from_secs(5))
            .await
            .unwrap();
        assert!(
            !batch.is_empty(),
            "the log stopped at {next} before its head {head}"
        );
        next = batch.last().unwrap().seq + 1;
        out.extend(batch);
    }
    out
}
