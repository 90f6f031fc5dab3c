//! The whole loop on real parts: `lockstep run` with Slurm and Kubernetes
//! sections, a real Slurm (`deploy/local/slurm`: slurmctld, slurmd,
//! slurmrestd) of each version lockstep supports (22.05: writes through
//! scontrol; 24.11 and 26.05: through slurmrestd), a real kube-apiserver
//! (`deploy/local/kube`) and a real nats-server. `kubectl cordon` drains the
//! Slurm node in slurmctld; `kubectl uncordon` resumes it. On 26.05 (per-node
//! topology is 25.05+), the NVIDIA GPU operator's NVLink clique label on a
//! Kubernetes node moves the Slurm node into that clique's block.
//!
//! Host mode: the Kubernetes nodes carry the Slurm nodes' names, which every
//! version's cluster shares (ls-n1 ..), so the tests take turns (one API
//! server, one set of Kubernetes nodes).

use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;

use common::{wait_for, Lockstep, Stack};
use lockstep_testkit::{temp_dir, NatsServer};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `lockstep run` on `stack` with `policy`, leading.
fn lockstep(stack: &Stack, nats: &NatsServer, name: &str, policy: &serde_json::Value) -> Lockstep {
    let dir = temp_dir(name);
    let s = &stack.slurm;
    let lockstep = Lockstep::start_with_env(
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
        policy,
        &[("PATH", stack.slurm_path())],
    );
    wait_for("lockstep acting", Duration::from_secs(60), || {
        lockstep.leads().then_some(())
    });
    lockstep
}

fn kubectl_cordon_drains_the_slurm_node_and_uncordon_resumes_it(version: &str) {
    const NODE: &str = "ls-n4";
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let stack = Stack::with_slurm(version);
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
    let mut lockstep = lockstep(
        &stack,
        &nats,
        "slurm-loop",
        &serde_json::json!({"mapping": {"mode": "host"}}),
    );

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
        "Slurm {version}: cordon -> DRAIN visible in slurmctld: {:?}",
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
    let _ = std::fs::remove_dir_all(&lockstep.dir);
}

/// The NVLink preset (`deploy/policies/nvidia-gpu-clique.json`) in a real
/// `lockstep run`: labelling the Kubernetes node with an NVLink clique moves
/// the Slurm node into that block (a declared, empty block of up.sh's
/// topology.yaml), as `scontrol show topology` shows; no reconfigure, no
/// restart of slurmctld.
fn a_gpu_clique_label_moves_the_slurm_node_into_its_nvlink_block(version: &str) {
    const NODE: &str = "ls-n3";
    const CLIQUE: &str = "7f3c9a2e-5b1d-4c8e-9f60-1a2b3c4d5e6f.1";
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let stack = Stack::with_slurm(version);
    let block_nodes = |block: &str| -> String {
        stack
            .slurm("scontrol", &["show", "topology", "default"])
            .lines()
            .find(|l| l.starts_with(&format!("BlockName={block} ")))
            .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("Nodes=")))
            .unwrap_or("")
            .to_owned()
    };
    /// Puts the node back into its block of topology.yaml.
    struct Back<'a>(&'a Stack);
    impl Drop for Back<'_> {
        fn drop(&mut self) {
            let _ = self.0.try_slurm(
                "scontrol",
                &[
                    "update",
                    &format!("nodename={NODE}"),
                    "topology=default:b2,tree:sw_root:s2",
                ],
            );
            let _ = self.0.try_kubectl(&["delete", "node", NODE], None);
        }
    }
    let _back = Back(&stack);
    assert!(!block_nodes(CLIQUE).contains(NODE));
    let ctld_pid = std::fs::read_to_string(
        std::path::Path::new(&stack.slurm["SLURM_CONF"])
            .parent()
            .unwrap()
            .join("run/slurmctld.pid"),
    )
    .unwrap();

    stack.apply(&serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"nvidia.com/gpu.clique": CLIQUE}},
    }));
    let mut policy: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::repo().join("deploy/policies/nvidia-gpu-clique.json"))
            .unwrap(),
    )
    .unwrap();
    policy["mapping"] = serde_json::json!({"mode": "host"});
    let nats = NatsServer::start();
    let mut lockstep = lockstep(&stack, &nats, "slurm-loop-clique", &policy);
    let started = Instant::now();
    wait_for(
        "the Slurm node in its NVLink clique's block",
        Duration::from_secs(60),
        || block_nodes(CLIQUE).contains(NODE).then_some(()),
    );
    eprintln!(
        "Slurm {version}: gpu.clique label -> block in slurmctld: {:?}",
        started.elapsed()
    );
    assert!(
        stack
            .slurm_node(NODE)
            .contains(&format!("Topology=default:{CLIQUE}")),
        "{}",
        stack.slurm_node(NODE)
    );
    let now_pid = std::fs::read_to_string(
        std::path::Path::new(&stack.slurm["SLURM_CONF"])
            .parent()
            .unwrap()
            .join("run/slurmctld.pid"),
    )
    .unwrap();
    assert_eq!(ctld_pid, now_pid, "slurmctld was not restarted");

    let status = lockstep.child.stop();
    assert!(status.success(), "{}", lockstep.log());
    let _ = std::fs::remove_dir_all(&lockstep.dir);
}

/// `on!(scenario: v22_05, ...)`: the scenario as one test per version.
macro_rules! on {
    ($scenario:ident: $($v:ident = $name:literal),+) => {
        mod $scenario {
            $(
                #[test]
                fn $v() {
                    super::$scenario($name);
                }
            )+
        }
    };
}

on!(kubectl_cordon_drains_the_slurm_node_and_uncordon_resumes_it:
    v22_05 = "22.05", v24_11 = "24.11", v26_05 = "26.05");
on!(a_gpu_clique_label_moves_the_slurm_node_into_its_nvlink_block: v26_05 = "26.05");
