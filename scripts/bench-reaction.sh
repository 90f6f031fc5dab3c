#!/usr/bin/env bash
# Reaction latency of the whole loop (docs/src/benchmarks.md): starts the local
# stack (kube-apiserver, a Slurm with 4 slurmd, and a second Slurm with 1,000
# nodes of which 4 run slurmd), then runs benches/examples/reaction_latency.rs
# against each: cordon -> DRAIN in slurmctld, and Slurm drain -> pod
# condition in the API server.
#
#   scripts/bench-reaction.sh [trials]        (default 200 per measurement; 0: none)
#
# LOCKSTEP_BENCH_POLL_MS sets the Slurm observer's poll interval (1000);
# LOCKSTEP_BENCH_SIZES which setups run ("4 1000"); LOCKSTEP_BENCH_NATS=cluster
# puts the log on a three-server JetStream cluster (streams replicated three
# times) instead of one nats-server; LOCKSTEP_BENCH_POOL=N also cordons the
# first N nodes at once (a node pool upgraded) and measures until every one
# of their Slurm nodes shows DRAIN. LOCKSTEP_SLURM_VERSION picks the Slurm
# (22.05, the machine's own, by default; 24.11 or 26.05 from Debian roots);
# LOCKSTEP_BENCH_LOCKSTEP another lockstep binary to measure (an older build,
# for a comparison interleaved on the same machine); LOCKSTEP_BENCH_SLURM=scontrol
# has lockstep read and write Slurm through scontrol alone (no slurmrestd),
# =nodes-through-scontrol list nodes through scontrol and do the rest through
# slurmrestd (`[slurm] nodes_through_scontrol`). LOCKSTEP_BENCH_REASONS=unnamed
# runs lockstep with `drain.reason_names_nodes = false` (a pool's drains share
# their reason, and so Slurm's writes). LOCKSTEP_BENCH_QUIET_S=S first watches
# S seconds with nothing changing (lockstep's CPU, slurmctld's time on its
# requests; 0: none, the default).
#
# The API server is the bench's own (state in /tmp/lockstep-bench-kube, its
# own ports), stopped at the end: nothing it creates meets the test suite's.
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
quiet=(--quiet-s "${LOCKSTEP_BENCH_QUIET_S:-0}")
pool=()
if [[ -n ${LOCKSTEP_BENCH_POOL:-} ]]; then
  pool=(--pool "$LOCKSTEP_BENCH_POOL")
fi
via=()
case ${LOCKSTEP_BENCH_SLURM:-rest} in
  rest) ;;
  scontrol) via=(--scontrol) ;;
  nodes-through-scontrol) via=(--nodes-through-scontrol) ;;
  *) echo "LOCKSTEP_BENCH_SLURM is rest, scontrol or nodes-through-scontrol, not $LOCKSTEP_BENCH_SLURM" >&2; exit 2 ;;
esac
case ${LOCKSTEP_BENCH_REASONS:-named} in
  named) ;;
  unnamed) via+=(--reasons-without-names) ;;
  *) echo "LOCKSTEP_BENCH_REASONS is named or unnamed, not $LOCKSTEP_BENCH_REASONS" >&2; exit 2 ;;
esac
state=${LOCKSTEP_STATE_DIR:-/tmp/lockstep-bench-kube}
export LOCKSTEP_KUBE_API_PORT=${LOCKSTEP_KUBE_API_PORT:-16543}
export LOCKSTEP_ETCD_CLIENT_PORT=${LOCKSTEP_ETCD_CLIENT_PORT:-2579}
export LOCKSTEP_ETCD_PEER_PORT=${LOCKSTEP_ETCD_PEER_PORT:-2580}
big=/tmp/lockstep-bench-slurm
down() {
  LOCKSTEP_SLURM_STATE_DIR=$big deploy/local/slurm/down.sh >/dev/null 2>&1 || true
  LOCKSTEP_STATE_DIR=$state deploy/local/slurm/down.sh >/dev/null 2>&1 || true
  LOCKSTEP_STATE_DIR=$state deploy/local/kube/down.sh >/dev/null 2>&1 || true
}
trap down EXIT

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
     ./target/release/examples/reaction_latency --trials "$trials" --nodes "$2" --slurmd 4 --poll-ms "$poll" "${quiet[@]}" "${cluster[@]}" "${pool[@]}" "${via[@]}")
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
      LOCKSTEP_SLURM_STATE_DIR=$big deploy/local/slurm/down.sh >/dev/null 2>&1 || true
      # Node states start afresh (slurmctld keeps them across restarts).
      rm -rf "$big/ctld"
      LOCKSTEP_SLURM_STATE_DIR=$big LOCKSTEP_SLURM_NODES=$size LOCKSTEP_SLURMD_MAX=4 \
        LOCKSTEP_SLURMCTLD_PORT=16917 LOCKSTEP_SLURMRESTD_PORT=6920 LOCKSTEP_SLURMD_PORT_BASE=17000 \
        deploy/local/slurm/up.sh >/dev/null 2>&1
      run "$big" "$size"
      ;;
  esac
done
