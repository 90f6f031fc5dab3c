#!/usr/bin/env bash
# The whole test suite: formatting, lints, the reducer's purity, and every
# test of the workspace. Exits non-zero when anything fails.
#
# What takes time on a fresh 2-core machine is building Kubernetes from the
# Go module proxy (deploy/local/kube/build.sh) and the real-node scenarios
# (tests/node_e2e.rs, ~8 min, mostly waiting on kubelet and controllers).
# So the parts run as soon as what they need is there:
#
#   background  Debian roots of Slurm 24.11 / 26.05; Kubernetes: the control
#               plane first, then the node and helm; mdbook (cached after the
#               first time)
#   foreground  fmt; compile every test; the book (build, links); the tests
#               that need no Kubernetes;
#               once the control plane is built and the Slurm tests have
#               ended, the tests that need Kubernetes; clippy
#   background  once every test is compiled and the roots are there: the
#               tests of every Slurm version (tests/slurm.rs of the
#               connectors)
#   background  beside the control-plane tests: each fuzz target for 30 s
#               (when its instrumented build is cached on this machine)
#   background  once the node is built: deploy/helm/check.sh, tests/chart.rs,
#               tests/node_e2e.rs (its own API server, Slurm and NATS on their
#               own ports)
#
# Each test target belongs to one group below; a target in none fails the
# run (add it to a group). Every group runs even when an earlier one failed;
# the summary names each failing target.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-rust.sh
scripts/ensure-nats.sh
scripts/ensure-packages.sh

started=$SECONDS
elapsed() { local s=$((SECONDS - started)); printf '%d:%02d' $((s / 60)) $((s % 60)); }
step() { printf '\n== [%s] %s\n' "$(elapsed)" "$*"; }
logs=$(mktemp -d /tmp/lockstep-test.XXXXXX)
# Free space where the build goes, and in /tmp where the beds live (a node
# short of disk evicts the pods of the real-node tests).
disk_free() { df -h --output=avail "$@" | tail -n +2 | tr -d ' ' | paste -sd/; }
disk_at_start=$(disk_free . /tmp)

# ---- the groups ---------------------------------------------------------------
# package:target. No Kubernetes needed (real Slurm, NATS, Prometheus and
# Chromium where a test needs them):
no_kube=(
  lockstep-schemas:codec lockstep-schemas:documents lockstep-schemas:versions
  lockstep-engine:order lockstep-engine:properties lockstep-engine:stats
  lockstep-replay-tests:compat lockstep-replay-tests:incidents lockstep-replay-tests:world
  lockstep-connectors:slurm_parse lockstep-connectors:slurm_fields
  lockstep-connectors:slurm_api lockstep-connectors:slurm_client_protocol
  lockstep-store:log lockstep-store:store lockstep-store:cluster
  lockstep:bundles lockstep:docs lockstep:html lockstep:metrics lockstep:policy_history lockstep:service
)
# Real Slurm of every version (needs the Debian roots):
slurm_versions=(lockstep-connectors:slurm)
# The local control plane (kube-apiserver, kubectl):
control_plane=(
  lockstep-connectors:kube
  lockstep:cli lockstep:kube_loop lockstep:slurm_loop lockstep:e2e
)
# The real node (kubelet, controllers, containerd) and helm:
real_node=(lockstep:chart lockstep:node_e2e)

cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  for state in /tmp/lockstep-local /tmp/lockstep-kube-disrupt; do
    LOCKSTEP_STATE_DIR=$state deploy/local/kube/down.sh >/dev/null 2>&1 || true
  done
  for v in 22.05 24.11 26.05; do
    LOCKSTEP_SLURM_VERSION=$v deploy/local/slurm/down.sh >/dev/null 2>&1 || true
  done
  # The Slurm that the service's NATS cluster tests act on (testkit/src/soak.rs).
  LOCKSTEP_SLURM_STATE_DIR=/tmp/lockstep-soak-slurm deploy/local/slurm/down.sh >/dev/null 2>&1 || true
  # The real node of tests/node_e2e.rs, its Slurm and NATS (its reaper does
  # this too when the test process ends); node-down.sh restores the host.
  deploy/local/kube/demo.sh down >/dev/null 2>&1 || true
}
trap cleanup EXIT

# ---- background work ------------------------------------------------------------
# Its exit status is kept in a file, not by the shell: bash may forget the
# status of a child that ended long before it is waited for ("wait: pid N is
# not a child of this shell"), and `wait PID` then fails for work that passed.
declare -A bg_pids=()
# background NAME CMD...: runs CMD in the background; its status goes to
# $logs/NAME.rc once it ends.
background() {
  local name=$1; shift
  (
    "$@" && rc=0 || rc=$?
    echo "$rc" >"$logs/$name.rc.tmp" && mv "$logs/$name.rc.tmp" "$logs/$name.rc"
  ) &
  bg_pids[$name]=$!
}
# joined NAME: waits until NAME has ended; 0 when it passed.
joined() {
  local rc=$logs/$1.rc
  while [[ ! -e $rc ]] && kill -0 "${bg_pids[$1]}" 2>/dev/null; do sleep 1; done
  [[ -e $rc && $(<"$rc") == 0 ]]
}

# ---- background builds ----------------------------------------------------------
# Slurm 24.11 and 26.05 run from Debian roots cached under
# ~/.cache/lockstep/slurm (debootstrap, about a minute each on a fresh
# machine; nothing when cached).
for v in 24.11 26.05; do
  background "slurm-root-$v" deploy/local/slurm/root.sh "$v" >"$logs/slurm-root-$v.log" 2>&1
done
# Kubernetes from the Go module proxy, cached under ~/.cache/lockstep/kube
# (nothing when cached), under nice so that compiling and testing lockstep
# come first: the control plane (~5 min of CPU), then the node and helm.
(
  export LOCKSTEP_KUBE_BUILD_P=${LOCKSTEP_KUBE_BUILD_P:-2}
  deploy/local/kube/build.sh control-plane >"$logs/kube-control-plane.log" 2>&1
  touch "$logs/kube-control-plane.ok"
  deploy/local/kube/build.sh node helm >"$logs/kube-node.log" 2>&1
  touch "$logs/kube-node.ok"
) &
kube_build=$!

# mdbook for the book (docs/): built once into ~/.cache/lockstep, under nice.
background mdbook nice scripts/ensure-mdbook.sh >"$logs/mdbook.log" 2>&1

# Waits for background work to leave `stamp` (or fail): 0 when it did.
await() {
  local stamp=$1 pid=$2
  while [[ ! -e $stamp ]] && kill -0 "$pid" 2>/dev/null; do sleep 2; done
  [[ -e $stamp ]]
}

# ---- checks that need no build -------------------------------------------------
step "cargo fmt --check"
cargo fmt --all -- --check

step "the reducer is pure: no tokio, sled, kube or async-nats under lockstep-engine"
impure=$(cargo tree -p lockstep-engine -e normal --prefix none --format '{p}' | awk '{print $1}' \
  | grep -E '^(tokio|sled|kube|kube-runtime|kube-client|async-nats)$' || true)
if [[ -n $impure ]]; then
  echo "lockstep-engine depends on: $impure" >&2
  exit 1
fi
echo "ok"

step "every test target is in a group"
listed=" ${no_kube[*]} ${slurm_versions[*]} ${control_plane[*]} ${real_node[*]} "
unlisted=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"]:
            print(p["name"] + ":" + t["name"])
' | while read -r t; do [[ $listed == *" $t "* ]] || echo "$t"; done)
if [[ -n $unlisted ]]; then
  echo "test targets in no group of scripts/test.sh: $unlisted" >&2
  exit 1
fi
echo "ok"

step "compile every test (cargo test --workspace --no-run)"
cargo test --workspace --no-run --quiet

# The real node's lockstep image carries this build's binary (stripped), so
# that the suite compiles lockstep once, not again in the release profile.
mkdir -p "$logs/image-bin"
strip -o "$logs/image-bin/lockstep" target/debug/lockstep
export LOCKSTEP_IMAGE_BINARY="$logs/image-bin/lockstep"

# ---- running tests ----------------------------------------------------------------
failed=()
# run LOG package:target...: one cargo test per package, each target once,
# all of them even when one fails; a package's tests that run 40 min are
# stopped. Output goes to LOG, and to the terminal unless `quiet=1`.
quiet=0
run() {
  local log=$1; shift
  local -A by_pkg=()
  local t
  for t in "$@"; do by_pkg[${t%%:*}]+=" --test ${t#*:}"; done
  local pkg rc=0
  for pkg in "${!by_pkg[@]}"; do
    # shellcheck disable=SC2086
    if ! timeout --kill-after=30s 40m cargo test --no-fail-fast -p "$pkg" ${by_pkg[$pkg]} 2>&1 \
      | if ((quiet)); then cat >>"$log"; else tee -a "$log"; fi; then
      echo "FAILED: cargo test -p $pkg${by_pkg[$pkg]}" >>"$log"
      rc=1
    fi
  done
  return $rc
}

# The real node's tests, in the background, once the node is built.
real_node_tests() {
  if ! await "$logs/kube-node.ok" "$kube_build"; then
    echo "FAILED: building the Kubernetes node or helm (deploy/local/kube/build.sh node helm)" >"$logs/real-node.log"
    tail -n 30 "$logs/kube-node.log" >>"$logs/real-node.log" 2>/dev/null || true
    return 1
  fi
  echo "real node: started at $(elapsed)" >"$logs/real-node.log"
  rc=0
  echo "== the Helm chart: helm lint, helm template, refused values (deploy/helm/check.sh)" >>"$logs/real-node.log"
  if ! deploy/helm/check.sh >>"$logs/real-node.log" 2>&1; then
    echo "FAILED: deploy/helm/check.sh" >>"$logs/real-node.log"
    rc=1
  fi
  quiet=1
  run "$logs/real-node.log" "${real_node[@]}" || rc=1
  return $rc
}
background real-node real_node_tests

# Real Slurm of every version, in the background beside the tests that need
# no Kubernetes: they mostly wait on slurmctld, and those use Slurms of
# their own (state dirs and ports apart). The control-plane tests share
# these clusters, so they start once this has ended.
slurm_versions_tests() {
  local v
  for v in 24.11 26.05; do
    if ! joined "slurm-root-$v"; then
      { echo "FAILED: building the Debian root of Slurm $v (deploy/local/slurm/root.sh $v)"
        tail -n 30 "$logs/slurm-root-$v.log"; } >>"$logs/slurm.log" 2>/dev/null
      return 1
    fi
  done
  echo "real Slurm of every version: started at $(elapsed)" >>"$logs/slurm.log"
  quiet=1
  run "$logs/slurm.log" "${slurm_versions[@]}"
}
background slurm-versions slurm_versions_tests

step "the book: mdbook build docs, every relative link and anchor (scripts/book.sh)"
if joined mdbook && scripts/book.sh 2>&1 | tee "$logs/book.log"; then
  :
else
  cat "$logs/mdbook.log" >&2
  failed+=("the book (scripts/book.sh)")
fi

step "unit tests and doc tests of every crate"
cargo test --workspace --no-fail-fast --lib --bins 2>&1 | tee "$logs/units.log" || failed+=("unit tests")
cargo test --workspace --no-fail-fast --doc 2>&1 | tee -a "$logs/units.log" || failed+=("doc tests")

step "tests that need no Kubernetes: ${no_kube[*]}"
run "$logs/no-kube.log" "${no_kube[@]}" || failed+=("no-kube group")

step "real Slurm of every version: ${slurm_versions[*]} (started in the background)"
joined slurm-versions || failed+=("Slurm versions group")
cat "$logs"/slurm-root-*.log "$logs/slurm.log"

# Each fuzz target for 30 s (fuzz/run.sh: AFL++ through cargo-afl), only
# when the instrumented build is cached on this machine (building it from
# nothing takes longer than the rest of this script). In the background
# beside the control-plane tests, which mostly wait on the API server and
# Slurm: its incremental rebuild after a change takes minutes here.
fuzzing=0
fuzz_cache=${LOCKSTEP_FUZZ_TARGET_DIR:-$HOME/.cache/lockstep/fuzz-target}/release
if cargo afl --version >/dev/null 2>&1 && [[ -x $fuzz_cache/slurm_rest ]]; then
  echo "fuzz: started at $(elapsed)" >"$logs/fuzz.log"
  background fuzz env LOCKSTEP_FUZZ_OUT="$(mktemp -d /tmp/lockstep-fuzz.XXXXXX)" fuzz/run.sh all 30 >>"$logs/fuzz.log" 2>&1
  fuzzing=1
else
  echo "not run: no cached fuzz build in $fuzz_cache (fuzz/run.sh TARGET SECONDS builds it)" >"$logs/fuzz.log"
fi

step "Kubernetes control plane (deploy/local/kube/build.sh control-plane)"
if await "$logs/kube-control-plane.ok" "$kube_build"; then
  grep -E 'built in|done in' "$logs/kube-control-plane.log" || echo "all cached"
  step "tests on the control plane: ${control_plane[*]}"
  run "$logs/control-plane.log" "${control_plane[@]}" || failed+=("control-plane group")
else
  tail -n 30 "$logs/kube-control-plane.log" >&2
  failed+=("control-plane group (the control plane did not build)")
fi

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings || failed+=("clippy")

step "fuzz: each target for 30 s (started in the background)"
if ((fuzzing)); then
  joined fuzz || failed+=("fuzz")
fi
cat "$logs/fuzz.log"

step "the real node: ${real_node[*]} (started in the background)"
joined real-node || failed+=("real-node group")
grep -E 'built in|done in' "$logs/kube-node.log" 2>/dev/null || true
cat "$logs/real-node.log"
wait "$kube_build" || true

step "summary"
# A group that did not run has no log: not a reason to stop before the names of the failures.
{ cat "$logs"/units.log "$logs"/no-kube.log "$logs"/slurm.log "$logs"/control-plane.log \
  "$logs"/real-node.log 2>/dev/null || true; } | { grep -E '^test result:' || true; } \
  | awk '{p+=$4; f+=$6} END {printf "%d passed, %d failed\n", p, f}'
echo "took $(elapsed); logs in $logs"
echo "free disk (build, /tmp): $(disk_free . /tmp) (at the start: $disk_at_start); target/: $(du -sh target 2>/dev/null | cut -f1)"
if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  grep -h '^FAILED: ' "$logs"/*.log >&2 || true
  exit 1
fi
echo "all passed"
