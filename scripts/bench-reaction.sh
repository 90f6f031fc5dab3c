#!/usr/bin/env bash
# Reaction latency of the whole loop (docs/src/benchmarks.md): starts the local
# stack (kube-apiserver, a Slurm with 4 slurmd, and a second Slurm with 1,000
# nodes of which 4 run slurmd), then runs benches/examples/reaction_latency.rs
# against each: cordon -> DRAIN in slurmctld, and Slurm drain -> pod
# condition in the API server.
#
#   scripts/bench-reaction.sh [trials]        (default 200 per measurement)
#
# LOCKSTEP_BENCH_POLL_MS sets the Slurm observer's poll interval (1000);
# LOCKSTEP_BENCH_SIZES which setups run ("4 1000"); LOCKSTEP_BENCH_NATS=cluster
# puts the log on a three-server JetStream cluster (streams replicated three
# times) instead of one nats-server.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-rust.sh
scripts/ensure-nats.sh
trials=${1:-200}
poll=${LOCKSTEP_BENCH_POLL_MS:-1000}
sizes=${LOCKSTEP_BENCH_SIZES:-4 1000}
cluster=()
case ${LOCKSTEP_BENCH_NATS:-single} in
  single) ;;
  cluster) cluster=(--cluster) ;;
  *) echo "LOCKSTEP_BENCH_NATS is single or cluster, not $LOCKSTEP_BENCH_NATS" >&2; exit 2 ;;
esac
state=${LOCKSTEP_STATE_DIR:-/tmp/lockstep-local}
big=/tmp/lockstep-bench-slurm

echo "building lockstep and the bench (release) ..." >&2
cargo build --release --quiet --bin lockstep
cargo build --release --quiet -p lockstep-benches --example reaction_latency

LOCKSTEP_STATE_DIR=$state deploy/local/kube/up.sh >/dev/null
kubeconfig=$state/kube/kubeconfig
lockstep_kubeconfig=$(LOCKSTEP_STATE_DIR=$state deploy/local/kube/service-account.sh)

run() { # slurm-state-dir nodes
  # shellcheck disable=SC1091
  (. "$1/env.sh"
   KUBECONFIG=$kubeconfig LOCKSTEP_KUBECONFIG=$lockstep_kubeconfig \
     ./target/release/examples/reaction_latency --trials "$trials" --nodes "$2" --slurmd 4 --poll-ms "$poll" "${cluster[@]}")
}

for size in $sizes; do
  case $size in
    4)
      echo "== 4 Slurm nodes, 4 Kubernetes nodes" >&2
      LOCKSTEP_STATE_DIR=$state deploy/local/slurm/up.sh >/dev/null 2>&1
      run "$state/slurm" 4
      ;;
    *)
      echo "== $size Slurm nodes (4 with slurmd), $size Kubernetes nodes" >&2
      # Own state dir and ports, so the test suite's Slurm is left alone.
      trap 'LOCKSTEP_SLURM_STATE_DIR=$big deploy/local/slurm/down.sh >/dev/null 2>&1 || true' EXIT
      LOCKSTEP_SLURM_STATE_DIR=$big deploy/local/slurm/down.sh >/dev/null 2>&1 || true
      LOCKSTEP_SLURM_STATE_DIR=$big LOCKSTEP_SLURM_NODES=$size LOCKSTEP_SLURMD_MAX=4 \
        LOCKSTEP_SLURMCTLD_PORT=16917 LOCKSTEP_SLURMRESTD_PORT=6920 LOCKSTEP_SLURMD_PORT_BASE=17000 \
        deploy/local/slurm/up.sh >/dev/null 2>&1
      run "$big" "$size"
      ;;
  esac
done
