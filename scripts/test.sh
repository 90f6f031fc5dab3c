#!/usr/bin/env bash
# The whole test suite: formatting, lints, the reducer's purity, and every
# test of the workspace. Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-rust.sh
scripts/ensure-nats.sh

step() { printf '\n== %s\n' "$*"; }

# The connector tests start a real kube-apiserver (deploy/local/kube) and a
# real Slurm of each version (deploy/local/slurm: 22.05, 24.11, 26.05)
# themselves; stop them, and unmount what the newer ones mounted, when we
# are done.
cleanup() {
  for state in /tmp/lockstep-local /tmp/lockstep-kube-disrupt; do
    [ -x deploy/local/kube/down.sh ] && LOCKSTEP_STATE_DIR=$state deploy/local/kube/down.sh >/dev/null 2>&1 || true
  done
  for v in 22.05 24.11 26.05; do
    [ -x deploy/local/slurm/down.sh ] && LOCKSTEP_SLURM_VERSION=$v deploy/local/slurm/down.sh >/dev/null 2>&1 || true
  done
  # The Slurm that the service's NATS cluster tests act on (tests/common/soak.rs).
  [ -x deploy/local/slurm/down.sh ] && LOCKSTEP_SLURM_STATE_DIR=/tmp/lockstep-soak-slurm \
    deploy/local/slurm/down.sh >/dev/null 2>&1 || true
  # The real node of tests/node_e2e.rs, its Slurm and NATS (its reaper does
  # this too when the test process ends); node-down.sh restores the host.
  [ -x deploy/local/kube/demo.sh ] && deploy/local/kube/demo.sh down >/dev/null 2>&1 || true
}
trap cleanup EXIT

# Slurm 24.11 and 26.05 run from Debian roots cached under
# ~/.cache/lockstep/slurm (debootstrap, a few minutes on a fresh machine;
# nothing when cached): build them now, beside the compilation below.
root_pids=()
for v in 24.11 26.05; do
  deploy/local/slurm/root.sh "$v" >"/tmp/lockstep-slurm-root-$v.log" 2>&1 &
  root_pids+=("$!")
done

# Kubernetes (control plane and node), containerd, runc, crictl and helm,
# from the Go module proxy, throttled (go build -p 1, nice 15), cached under
# ~/.cache/lockstep/kube: about 20-30 min on a fresh 2-core machine, nothing
# when cached. Beside the compilation below, like the Debian roots.
deploy/local/kube/build.sh all >/tmp/lockstep-kube-build.log 2>&1 &
kube_build_pid=$!

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "the reducer is pure: no tokio, sled, kube or async-nats under lockstep-engine"
impure=$(cargo tree -p lockstep-engine -e normal --prefix none --format '{p}' | awk '{print $1}' \
  | grep -E '^(tokio|sled|kube|kube-runtime|kube-client|async-nats)$' || true)
if [ -n "$impure" ]; then
  echo "lockstep-engine depends on: $impure" >&2
  exit 1
fi
echo "ok"

step "Debian roots for Slurm 24.11 and 26.05"
for i in "${!root_pids[@]}"; do
  if ! wait "${root_pids[$i]}"; then
    v=$([ "$i" = 0 ] && echo 24.11 || echo 26.05)
    tail -n 30 "/tmp/lockstep-slurm-root-$v.log" >&2
    echo "building the Debian root of Slurm $v failed" >&2
    exit 1
  fi
done
cat /tmp/lockstep-slurm-root-*.log

step "Kubernetes, containerd, runc, helm (deploy/local/kube/build.sh all)"
if ! wait "$kube_build_pid"; then
  tail -n 30 /tmp/lockstep-kube-build.log >&2
  echo "building Kubernetes, containerd, runc or helm failed" >&2
  exit 1
fi
grep -E 'built in|done in' /tmp/lockstep-kube-build.log || echo "all cached"

step "the Helm chart: helm lint, helm template, refused values (deploy/helm/check.sh)"
deploy/helm/check.sh

# Each fuzz target for 30 s (fuzz/run.sh: AFL++ through cargo-afl), only
# when the instrumented build is cached on this machine (building it from
# nothing takes longer than the rest of this script). Adds about 3.5 min:
# 6 targets x 30 s, and an incremental rebuild of lockstep's own crates.
step "fuzz: each target for 30 s"
fuzz_cache=${LOCKSTEP_FUZZ_TARGET_DIR:-$HOME/.cache/lockstep/fuzz-target}/release
if cargo afl --version >/dev/null 2>&1 && [ -x "$fuzz_cache/slurm_rest" ]; then
  LOCKSTEP_FUZZ_OUT=$(mktemp -d /tmp/lockstep-fuzz.XXXXXX) fuzz/run.sh all 30
else
  echo "not run: no cached fuzz build in $fuzz_cache (fuzz/run.sh TARGET SECONDS builds it)"
fi

step "cargo test --workspace"
cargo test --workspace 2>&1 | tee /tmp/lockstep-test.log
grep -E '^test result:' /tmp/lockstep-test.log | awk '{p+=$4; f+=$6} END {printf "\n%d passed, %d failed\n", p, f}'
