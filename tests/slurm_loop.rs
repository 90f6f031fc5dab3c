//! The whole loop on real parts: `lockstep run` with Slurm and Kubernetes
//! sections, a real Slurm (`deploy/local/slurm`: slurmctld, slurmd,
//! slurmrestd), a real kube-apiserver (`deploy/local/kube`) and a real
//! nats-server. `kubectl cordon` drains the Slurm node in slurmctld;
//! `kubectl uncordon` resumes it.

use std::time::{Duration, Instant};

mod common;

use common::{wait_for, Lockstep, Stack};
use lockstep_store::testing::{temp_dir, NatsServer};

const NODE: &str = "ls-n4";

#[test]
fn kubectl_cordon_drains_the_slurm_node_and_uncordon_resumes_it() {
    let stack = Stack::up();
    // Host mode: the Kubernetes node under slurmd has the Slurm node's name.
    stack.apply(
        &serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
    );
    stack.kubectl(&["uncordon", NODE], None);
    // Start from an idle node nobody drained.
    let _ = stack.try_slurm(
        "scontrol",
        &["update", &format!("nodename={NODE}"), "state=resume"],
    );

    let nats = NatsServer::start();
    let dir = temp_dir("slurm-loop");
    let s = &stack.slurm;
    let mut lockstep = Lockstep::start(
        &dir,
        &format!(
            "[log]\nnats_url = \"{nats}\"\n\
             [kubernetes]\nkubeconfig = \"{kubeconfig}\"\n\
             [slurm]\nrest_url = \"{rest}\"\nrest_user = \"{user}\"\njwt_file = \"{jwt}\"\nslurm_conf = \"{conf}\"\npoll_interval_ms = 200\n",
            nats = nats.url(),
            kubeconfig = stack.lockstep_kubeconfig.display(),
            rest = s["SLURMRESTD_URL"],
            user = s.get("SLURM_JWT_USER").map_or("root", String::as_str),
            jwt = s["SLURM_JWT_FILE"],
            conf = s["SLURM_CONF"],
        ),
        &serde_json::json!({"mapping": {"mode": "host"}}),
    );
    wait_for("lockstep acting", Duration::from_secs(60), || {
        lockstep.leads().then_some(())
    });

    stack.kubectl(&["cordon", NODE], None);
    let started = Instant::now();
    wait_for(
        "DRAIN in slurmctld after kubectl cordon",
        Duration::from_secs(60),
        || {
            let s = stack.slurm_node(NODE);
            (s.contains("DRAIN") && s.contains("Reason=lockstep: kubernetes node ls-n4 cordoned"))
                .then_some(())
        },
    );
    eprintln!(
        "cordon -> DRAIN visible in slurmctld: {:?}",
        started.elapsed()
    );

    stack.kubectl(&["uncordon", NODE], None);
    wait_for(
        "resumed in slurmctld after kubectl uncordon",
        Duration::from_secs(60),
        || (!stack.slurm_node(NODE).contains("DRAIN")).then_some(()),
    );

    let status = lockstep.child.stop();
    assert!(status.success(), "{}", lockstep.log());
    stack.kubectl(&["delete", "node", NODE], None);
    let _ = std::fs::remove_dir_all(dir);
}
