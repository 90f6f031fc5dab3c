//! The whole loop on real parts: `lockstep run` with Slurm and Kubernetes
//! sections, a real Slurm (`deploy/local/slurm`: slurmctld, slurmd,
//! slurmrestd), a real kube-apiserver (`deploy/local/kube`) and a real
//! nats-server. `kubectl cordon` drains the Slurm node in slurmctld;
//! `kubectl uncordon` resumes it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{kubectl_path, lockstep_kubeconfig, up, Reap};
use lockstep_store::testing::{temp_dir, NatsServer};

const NODE: &str = "ls-n4";

fn scontrol_node(slurm_conf: &str) -> String {
    let out = Command::new("scontrol")
        .args(["show", "node", NODE, "-o"])
        .env("SLURM_CONF", slurm_conf)
        .env_remove("SLURM_JWT")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn kubectl_cordon_drains_the_slurm_node_and_uncordon_resumes_it() {
    let slurm = up("deploy/local/slurm/up.sh", "slurm/env.sh");
    let kube = up("deploy/local/kube/up.sh", "kube/env.sh");
    let slurm_conf = slurm["SLURM_CONF"].clone();
    let kubeconfig = kube["KUBECONFIG"].clone();
    let kubectl_bin = kubectl_path();
    let kubectl = |args: &[&str], stdin: Option<&str>| {
        use std::io::Write;
        let mut child = Command::new(&kubectl_bin)
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(s) = stdin {
            child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // Host mode: the Kubernetes node under slurmd has the Slurm node's name.
    kubectl(
        &["apply", "-f", "-"],
        Some(&format!(
            r#"{{"apiVersion": "v1", "kind": "Node", "metadata": {{"name": "{NODE}"}}}}"#
        )),
    );
    kubectl(&["uncordon", NODE], None);
    // Start from an idle node nobody drained.
    Command::new("scontrol")
        .args(["update", &format!("nodename={NODE}"), "state=resume"])
        .env("SLURM_CONF", &slurm_conf)
        .env_remove("SLURM_JWT")
        .output()
        .unwrap();

    let nats = NatsServer::start();
    let dir = temp_dir("slurm-loop");
    std::fs::write(dir.join("policy.json"), r#"{"mapping": {"mode": "host"}}"#).unwrap();
    let config = dir.join("lockstep.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"data\"\npolicy_file = \"policy.json\"\n[log]\nnats_url = \"{nats}\"\n[telemetry]\nlisten = \"127.0.0.1:0\"\n\
             [kubernetes]\nkubeconfig = \"{lockstep}\"\n\
             [slurm]\nrest_url = \"{rest}\"\nrest_user = \"{user}\"\njwt_file = \"{jwt}\"\nslurm_conf = \"{slurm_conf}\"\npoll_interval_ms = 200\n",
            nats = nats.url(),
            lockstep = lockstep_kubeconfig().display(),
            rest = slurm["SLURMRESTD_URL"],
            user = slurm.get("SLURM_JWT_USER").map_or("root", String::as_str),
            jwt = slurm["SLURM_JWT_FILE"],
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["run", "--config"])
        .arg(&config)
        .env_remove("SLURM_JWT")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("run.log")).unwrap())
        .spawn()
        .map(|c| Reap(Some(c)))
        .unwrap();
    let run_log = || std::fs::read_to_string(dir.join("run.log")).unwrap_or_default();

    std::thread::sleep(Duration::from_secs(2));
    kubectl(&["cordon", NODE], None);
    let started = Instant::now();
    wait_for(
        "DRAIN in slurmctld after kubectl cordon",
        Duration::from_secs(60),
        || {
            let s = scontrol_node(&slurm_conf);
            s.contains("DRAIN") && s.contains("Reason=lockstep: kubernetes node ls-n4 cordoned")
        },
    );
    eprintln!(
        "cordon -> DRAIN visible in slurmctld: {:?}",
        started.elapsed()
    );

    kubectl(&["uncordon", NODE], None);
    wait_for(
        "resumed in slurmctld after kubectl uncordon",
        Duration::from_secs(60),
        || !scontrol_node(&slurm_conf).contains("DRAIN"),
    );

    let status = child.stop();
    assert!(status.success(), "{}", run_log());
    kubectl(&["delete", "node", NODE], None);
    let _ = std::fs::remove_dir_all(dir);
}
