#!/usr/bin/env bash
# The reducer's and replay's throughput as ratios against a reference build,
# both run interleaved on this machine (docs/src/benchmarks.md): absolute
# figures move several-fold from day to day here, ratios much less.
#
#   scripts/bench-reducer.sh [rounds] [slurm_nodes] [steady_events]
#
# Defaults: 3 rounds, 10,000 Slurm nodes, 1,000,000 steady-state events, with
# scaling and topology on (`reducer-figures N E full`). Each round runs the
# reference and this checkout's build once each, the order swapped every
# round. Prints each run's figures, then per measure the median of each
# build, the ratios of the rounds and their median, and replay beside
# decoding the same log alone (this build). This build's replay reads ahead
# on a second thread, as `lockstep replay` does; its replay on one thread is
# shown beside it, and the replay that checks every event's content id (what
# `lockstep replay` does with a file) against the reference's.
#
# LOCKSTEP_BENCH_REF names the reference commit (142c1c2 by default). Its
# tree is exported with `git archive` and built once into
# target/bench-ref/<commit> (a few minutes); later runs reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-rust.sh

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
case ${1:-} in -h | --help) usage; exit 0 ;; esac
rounds=${1:-3}
nodes=${2:-10000}
events=${3:-1000000}
for n in "$rounds" "$nodes" "$events"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench-reducer.sh: '$n' is not a positive whole number" >&2; usage >&2; exit 2; }
done
ref=${LOCKSTEP_BENCH_REF:-142c1c2}
ref_commit=$(git rev-parse --verify --quiet "$ref^{commit}") || {
  echo "bench-reducer.sh: LOCKSTEP_BENCH_REF=$ref is no commit of this repository" >&2
  exit 2
}
short=${ref_commit:0:7}

echo "== building this checkout's reducer-figures" >&2
cargo build --release -q -p lockstep-benches --bin reducer-figures
# A copy: a build in this checkout while the bench runs must not change it.
here=$(mktemp -d /tmp/lockstep-bench-reducer.XXXXXX)
trap 'rm -rf "$here"' EXIT
cp target/release/reducer-figures "$here/current"

ref_dir=target/bench-ref/$short
ref_bin=$ref_dir/target/release/reducer-figures
if [[ ! -x $ref_bin ]]; then
  echo "== building the reference $short into $ref_dir (once)" >&2
  rm -rf "$ref_dir/src"
  mkdir -p "$ref_dir/src"
  git archive "$ref_commit" | tar -x -C "$ref_dir/src"
  CARGO_TARGET_DIR=$PWD/$ref_dir/target cargo build --release -q \
    --manifest-path "$ref_dir/src/Cargo.toml" -p lockstep-benches --bin reducer-figures
fi

# run BIN LABEL ROUND: one run; its figures go to $here/figures as
# "label round measure value" lines.
run() {
  local out
  out=$("$1" "$nodes" "$events" full 2>/dev/null)
  printf '%s\n' "$out" | sed "s/^/  [$2, round $3] /" >&2
  printf '%s\n' "$out" | awk -v b="$2" -v r="$3" '
    /^apply:/ { m = "apply" }
    /^decode only:/ { m = "decode" }
    /^replay:/ { m = "replay" }
    /^replay \(one thread\)/ { m = "replay1" }
    /^replay \(verifying/ { m = "replayv" }
    m != "" && match($0, /= [0-9.]+ M events\/s/) {
      v = substr($0, RSTART + 2, RLENGTH - 13); print b, r, m, v; m = ""
    }' >>"$here/figures"
}

for ((r = 1; r <= rounds; r++)); do
  echo "== round $r of $rounds" >&2
  if ((r % 2)); then
    run "$ref_bin" ref "$r"
    run "$here/current" current "$r"
  else
    run "$here/current" current "$r"
    run "$ref_bin" ref "$r"
  fi
done

echo
echo "reducer-figures $nodes $events full, $rounds rounds interleaved; reference $short"
python3 - "$here/figures" "$short" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
ref = sys.argv[2]
fig = {}
for build, rnd, measure, value in rows:
    fig.setdefault((build, measure), {})[int(rnd)] = float(value)
def med(xs):
    return statistics.median(xs) if xs else float("nan")
targets = {"apply": (2.0, 1.8), "replay": (1.0, 1.7)}
print(f"{'measure':8} {'this build':>12} {ref:>12} {'ratios':>22} {'median':>7}  target")
for m in ("apply", "replay"):
    cur, old = fig.get(("current", m), {}), fig.get(("ref", m), {})
    ratios = [cur[r] / old[r] for r in sorted(cur) if r in old and old[r] > 0]
    speed, ratio = targets[m]
    mc, mr = med(list(cur.values())), med(ratios)
    verdict = "met" if mc >= speed and mr >= ratio else "not met"
    print(f"{m:8} {mc:9.2f} M/s {med(list(old.values())):9.2f} M/s "
          f"{' '.join(f'{x:.2f}' for x in ratios):>22} {mr:6.2f}x  >= {speed} M/s and >= {ratio}x: {verdict}")
cur, old = fig.get(("current", "replay1"), {}), fig.get(("ref", "replay"), {})
if cur:
    ratios = [cur[r] / old[r] for r in sorted(cur) if r in old and old[r] > 0]
    print(f"{'(replay on one thread)':24} {med(list(cur.values())):.2f} M/s, "
          f"ratios {' '.join(f'{x:.2f}' for x in ratios)}, median {med(ratios):.2f}x")
cur, old = fig.get(("current", "replayv"), {}), fig.get(("ref", "replayv"), {})
if cur and old:
    ratios = [cur[r] / old[r] for r in sorted(cur) if r in old and old[r] > 0]
    print(f"{'(replay verifying ids)':24} {med(list(cur.values())):.2f} M/s against "
          f"{med(list(old.values())):.2f} M/s, ratios {' '.join(f'{x:.2f}' for x in ratios)}, "
          f"median {med(ratios):.2f}x")
dec, rep = fig.get(("current", "decode"), {}), fig.get(("current", "replay"), {})
floor = [rep[r] / dec[r] for r in sorted(rep) if r in dec and dec[r] > 0]
print(f"decoding alone (this build) {med(list(dec.values())):.2f} M events/s; "
      f"replay at {' '.join(f'{100 * x:.0f}%' for x in floor)} of it (median {100 * med(floor):.0f}%)")
EOF
