//! The real-node test bed: a real kubelet, kube-controller-manager,
//! kube-scheduler and containerd (`deploy/local/kube/node-up.sh`), a real
//! Slurm whose slurmd run in pods of that node (`deploy/local/slurm`, its
//! own state dir and ports, nodes pre-declared as `slurmd-0` ..
//! `slurmd-5` with no slurmd of their own), a nats-server, and the images of
//! `deploy/images/build.sh` imported into the node's containerd.
//!
//! Everything runs on this machine and listens on loopback (the kubelet on
//! the node's bridge address): the pods reach the API server through the
//! `kubernetes` Service IP, and slurmctld, slurmrestd and NATS at the
//! bridge address, which node-up.sh forwards to their loopback ports.
//!
//! The first test of a process that brings the bed up registers the process
//! as a user of the bed (`ROOT/users/<pid>`) and starts a reaper: a detached
//! shell that waits for this test process to exit, however it exits, removes
//! it from the users and, unless another live test process uses the bed
//! meanwhile, runs `node-down.sh --wipe` (which restores the host), Slurm's
//! `down.sh --purge` and stops the nats-server. Registering and reaping
//! serialise on `ROOT/.bed.lock`, so a reaper never tears down a node that a
//! later test process has started to use. Each test removes the Kubernetes
//! objects it made; the node stays up for the next test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use super::{repo, wait_for};

/// State of the node, its control plane and its Slurm.
pub const ROOT: &str = "/tmp/lockstep-node";
/// The Kubernetes node's name.
pub const NODE_NAME: &str = "lockstep-node";
// Every fixed port of the bed (these and node-up.sh's defaults for its API
// server, etcd, controller manager, scheduler and kubelet health) is in
// 27000-27999, which nothing else of the tests takes (testkit's NATS
// clusters pick their ports below it).
/// Slurm of the bed: slurmctld, slurmrestd, and slurmd `slurmd-i` on base+i+1.
pub const SLURMCTLD_PORT: u16 = 27817;
/// slurmrestd's port.
pub const SLURMRESTD_PORT: u16 = 27820;
/// slurmd ports start after this.
pub const SLURMD_PORT_BASE: u16 = 27830;
/// The nats-server of the bed.
pub const NATS_PORT: u16 = 27422;
/// Slurm nodes `slurmd-0` .. `slurmd-{SLURM_NODES - 1}` (StatefulSet pod names).
pub const SLURM_NODES: usize = 6;
/// Where the slurmd StatefulSet runs.
pub const SLURM_NS: &str = "slurm";
/// Where the chart installs lockstep.
pub const LOCKSTEP_NS: &str = "lockstep-system";
/// The Helm release.
pub const RELEASE: &str = "lockstep";

/// One test at a time on the node.
pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
static REAPER: std::sync::Once = std::sync::Once::new();

/// What the bed's scripts give.
pub struct Bed {
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The cached bin dir (kubectl, helm, ctr, crictl).
    pub bin: PathBuf,
    /// What the node's env.sh exports (LOCKSTEP_NODE_*).
    pub node: BTreeMap<String, String>,
    /// What the bed's Slurm env.sh exports.
    pub slurm: BTreeMap<String, String>,
    /// What deploy/images/build.sh wrote (image refs).
    pub images: BTreeMap<String, String>,
    /// The Slurm state dir.
    pub slurm_state: PathBuf,
}

/// The environment every script of the bed runs with.
fn bed_env(cmd: &mut Command) -> &mut Command {
    let nodes: Vec<String> = (0..SLURM_NODES).map(|i| format!("slurmd-{i}")).collect();
    cmd.env("LOCKSTEP_STATE_DIR", ROOT)
        .env(
            "LOCKSTEP_NODE_HOST_PORTS",
            format!("{SLURMCTLD_PORT} {SLURMRESTD_PORT} {NATS_PORT}"),
        )
        .env("LOCKSTEP_SLURM_STATE_DIR", format!("{ROOT}/slurm"))
        .env("LOCKSTEP_SLURM_VERSION", "22.05")
        .env("LOCKSTEP_SLURM_NODES", nodes.join(","))
        .env("LOCKSTEP_SLURMD_MAX", "0")
        .env("LOCKSTEP_SLURMCTLD_PORT", SLURMCTLD_PORT.to_string())
        .env("LOCKSTEP_SLURMD_PORT_BASE", SLURMD_PORT_BASE.to_string())
        .env("LOCKSTEP_SLURMRESTD_PORT", SLURMRESTD_PORT.to_string())
        .env_remove("SLURM_JWT")
}

/// Runs a script of the repository with the bed's environment, its output in
/// `ROOT/logs/<name>.log`; panics with the log's tail when it fails.
pub fn script(path: &str, args: &[&str]) -> String {
    let logs = Path::new(ROOT).join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let name = Path::new(path)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let log = logs.join(format!(
        "{}-{name}.log",
        path.split('/').rev().nth(1).unwrap_or("x")
    ));
    let out = bed_env(&mut Command::new(repo().join(path)))
        .args(args)
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .output()
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        out.status.success(),
        "{path} {args:?} failed ({}); its log {}:\n{}",
        out.status,
        log.display(),
        text.lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `KEY=value` and `export KEY=value` lines of a file.
pub fn env_file(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| l.strip_prefix("export ").unwrap_or(l))
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            (
                k.trim().to_owned(),
                v.trim().trim_matches('\'').trim_matches('"').to_owned(),
            )
        })
        .collect()
}

/// Registers this process as a user of the bed and starts its reaper, once
/// per test process (see the module doc).
fn reaper() {
    REAPER.call_once(|| {
        let repo = repo();
        std::fs::create_dir_all(Path::new(ROOT).join("logs")).unwrap();
        let pid = std::process::id();
        let lock = format!("{ROOT}/.bed.lock");
        // Waits for a reaper that is tearing the bed down right now.
        let status = Command::new("flock")
            .args([&lock, "sh", "-c", &format!("mkdir -p {ROOT}/users && touch {ROOT}/users/{pid}")])
            .status()
            .expect("flock");
        assert!(status.success(), "registering as a user of the bed: {status}");
        let teardown = format!(
            "export LOCKSTEP_STATE_DIR={ROOT} LOCKSTEP_SLURM_STATE_DIR={ROOT}/slurm LOCKSTEP_SLURM_VERSION=22.05; \
             rm -f {ROOT}/users/{pid}; \
             for u in {ROOT}/users/*; do [ -e \"$u\" ] || continue; \
               if kill -0 \"${{u##*/}}\" 2>/dev/null; then echo \"bed still used by ${{u##*/}}\"; exit 0; fi; rm -f \"$u\"; done; \
             {kube}/node-down.sh --wipe; \
             {slurm}/down.sh --purge; \
             p=$(cat {ROOT}/nats.pid 2>/dev/null) && [ \"$(cat /proc/$p/comm 2>/dev/null)\" = nats-server ] && kill $p; \
             rm -rf {ROOT}/nats.pid {ROOT}/nats",
            kube = repo.join("deploy/local/kube").display(),
            slurm = repo.join("deploy/local/slurm").display(),
        );
        std::fs::write(Path::new(ROOT).join(format!("logs/teardown-{pid}.sh")), &teardown).unwrap();
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             flock {lock} sh {ROOT}/logs/teardown-{pid}.sh >> {ROOT}/logs/reaper.log 2>&1; \
             rm -f {ROOT}/logs/teardown-{pid}.sh"
        );
        // Detached (--fork: setsid returns at once), in its own session:
        // neither this process's end nor a Ctrl-C of cargo stops it.
        let status = Command::new("setsid")
            .args(["--fork", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("setsid sh: the reaper");
        assert!(status.success(), "starting the reaper: {status}");
    });
}

/// A fresh nats-server (JetStream, empty store) on NATS_PORT, detached: the
/// reaper stops it.
fn restart_nats() {
    let pid_file = Path::new(ROOT).join("nats.pid");
    if let Ok(pid) = std::fs::read_to_string(&pid_file) {
        let pid = pid.trim();
        if std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim() == "nats-server")
        {
            let _ = Command::new("kill").arg(pid).status();
            wait_for(
                "the old nats-server to stop",
                Duration::from_secs(20),
                || (!Path::new(&format!("/proc/{pid}")).exists()).then_some(()),
            );
        }
    }
    let dir = Path::new(ROOT).join("nats");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Detached like the reaper, which stops it; it writes its own pid.
    let conf = dir.join("nats.conf");
    std::fs::write(&conf, lockstep_testkit::JETSTREAM_CONF).unwrap();
    let run = format!(
        "echo $$ > {pid}; exec nats-server -c {conf} -js -a 127.0.0.1 -p {NATS_PORT} -sd {js} 2> {log}",
        pid = pid_file.display(),
        conf = conf.display(),
        js = dir.join("js").display(),
        log = dir.join("nats.log").display(),
    );
    let status = Command::new("setsid")
        .args(["--fork", "sh", "-c", &run])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("setsid nats-server (scripts/ensure-nats.sh installs it)");
    assert!(status.success(), "starting nats-server: {status}");
    wait_for("nats-server listening", Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", NATS_PORT))
            .ok()
            .map(|_| ())
    });
}

impl Bed {
    /// Brings up (or finds running) the node, its control plane, helm, the
    /// images (built if their inputs changed, imported if missing); resets
    /// Slurm (a fresh cluster: no jobs, no drains) and NATS (an empty log).
    pub fn up() -> Self {
        reaper();
        script("deploy/local/kube/node-up.sh", &[]);
        script("deploy/local/kube/build.sh", &["helm"]);
        let bin = PathBuf::from(script("deploy/local/kube/build.sh", &["--print-bin-dir"]).trim());
        script("deploy/images/build.sh", &["--import"]);
        let images_dir = std::env::var("LOCKSTEP_IMAGE_DIR").map_or_else(
            |_| {
                PathBuf::from(std::env::var("LOCKSTEP_CACHE_DIR").unwrap_or_else(|_| {
                    format!("{}/.cache/lockstep", std::env::var("HOME").unwrap())
                }))
                .join("images")
            },
            PathBuf::from,
        );
        let slurm_state = Path::new(ROOT).join("slurm");
        script("deploy/local/slurm/down.sh", &["--purge"]);
        std::fs::create_dir_all(&slurm_state).unwrap();
        script("deploy/local/slurm/up.sh", &[]);
        restart_nats();
        let node = env_file(&Path::new(ROOT).join("node/env.sh"));
        Self {
            kubeconfig: Path::new(ROOT).join("kube/kubeconfig"),
            bin,
            node,
            slurm: env_file(&slurm_state.join("env.sh")),
            images: env_file(&images_dir.join("images.env")),
            slurm_state,
        }
    }

    /// The address at which pods reach the host's slurmctld, slurmrestd and NATS.
    pub fn gateway(&self) -> &str {
        &self.node["LOCKSTEP_NODE_GATEWAY"]
    }

    /// kubectl as cluster-admin; `Err(stderr)` when it fails.
    pub fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        run(&self.bin.join("kubectl"), args, stdin, &self.kubeconfig)
    }

    /// kubectl; panics when it fails.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        self.try_kubectl(args, stdin)
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"))
    }

    /// helm; `Err(stderr)` when it fails.
    pub fn try_helm(&self, args: &[&str]) -> Result<String, String> {
        run(&self.bin.join("helm"), args, None, &self.kubeconfig)
    }

    /// helm; panics when it fails.
    pub fn helm(&self, args: &[&str]) -> String {
        self.try_helm(args)
            .unwrap_or_else(|e| panic!("helm {args:?}: {e}"))
    }

    /// `kubectl apply` of one object.
    pub fn apply(&self, object: &Value) {
        self.kubectl(&["apply", "-f", "-"], Some(&object.to_string()));
    }

    /// `kubectl get ... -o json`, or `None` when it does not exist.
    pub fn get(&self, args: &[&str]) -> Option<Value> {
        let mut a = vec!["get"];
        a.extend(args);
        a.extend(["-o", "json"]);
        match self.try_kubectl(&a, None) {
            Ok(s) => Some(serde_json::from_str(&s).unwrap()),
            Err(e) if e.contains("NotFound") => None,
            Err(e) => panic!("kubectl {a:?}: {e}"),
        }
    }

    /// A Slurm command of the bed's cluster; `Err(stderr)` when it fails.
    pub fn try_slurm(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let out = Command::new(program)
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

    /// The Slurm node's state word(s), e.g. `IDLE`, `IDLE+DRAIN`, `DOWN+NOT_RESPONDING`.
    pub fn slurm_state(&self, node: &str) -> String {
        let show = self.slurm_node(node);
        show.split_whitespace()
            .find_map(|f| f.strip_prefix("State="))
            .unwrap_or("")
            .to_owned()
    }

    /// Submits `sbatch --wrap CMD` with these options; returns the job id.
    pub fn sbatch(&self, options: &[&str], cmd: &str) -> String {
        let mut a = vec!["--parsable", "--output=/dev/null", "--chdir=/tmp"];
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

    /// How the job ended (`sacct` needs a database; `scontrol show job`
    /// keeps it for MinJobAge): `COMPLETED`, `CANCELLED`, `FAILED`, `NODE_FAIL`, ...
    pub fn job_end_state(&self, id: &str) -> Option<String> {
        let show = self
            .try_slurm("scontrol", &["show", "job", id, "-o"])
            .ok()?;
        show.split_whitespace()
            .find_map(|f| f.strip_prefix("JobState="))
            .map(str::to_owned)
    }

    /// The kubelet's pid (node-up.sh's pid file).
    pub fn kubelet_pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(Path::new(ROOT).join("node/run/kubelet.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim() == "kubelet")
            .then_some(pid)
    }

    /// Imports a second name for an image already in the node's containerd
    /// (a new tag for a rolling update).
    pub fn tag_image(&self, from: &str, to: &str) {
        let out = Command::new(self.bin.join("ctr"))
            .args(["--address", &self.node["LOCKSTEP_NODE_CRI"], "-n", "k8s.io"])
            .args(["images", "tag", "--force", from, to])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ctr images tag: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn run(
    program: &Path,
    args: &[&str],
    stdin: Option<&str>,
    kubeconfig: &Path,
) -> Result<String, String> {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}
