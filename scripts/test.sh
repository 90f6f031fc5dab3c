#!/usr/bin/env bash
# The whole test suite: formatting, lints, the reducer's purity, and every
# test of the workspace. Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-rust.sh
scripts/ensure-nats.sh

step() { printf '\n== %s\n' "$*"; }

# The connector tests start a real kube-apiserver (deploy/local/kube) and a
# real Slurm (deploy/local/slurm) themselves; stop them when we are done.
cleanup() {
  for state in /tmp/lockstep-local /tmp/lockstep-kube-disrupt; do
    [ -x deploy/local/kube/down.sh ] && LOCKSTEP_STATE_DIR=$state deploy/local/kube/down.sh >/dev/null 2>&1 || true
  done
  [ -x deploy/local/slurm/down.sh ] && deploy/local/slurm/down.sh >/dev/null 2>&1 || true
}
trap cleanup EXIT

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

step "cargo test --workspace"
cargo test --workspace 2>&1 | tee /tmp/lockstep-test.log
grep -E '^test result:' /tmp/lockstep-test.log | awk '{p+=$4; f+=$6} END {printf "\n%d passed, %d failed\n", p, f}'
