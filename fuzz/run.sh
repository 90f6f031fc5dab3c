#!/usr/bin/env bash
# Runs a coverage-guided fuzzing campaign with AFL++ (cargo-afl) on the
# stable toolchain:
#
#   fuzz/run.sh TARGET SECONDS     one target (slurm_rest, scontrol, log_file,
#                                  policy, config, kube_objects)
#   fuzz/run.sh all SECONDS        each target in turn, SECONDS each
#   fuzz/run.sh list               the targets
#
# The seed corpus of each target is made from the recorded fixtures
# (connectors/slurm/fixtures, replay-tests/incidents, replay-tests/compat)
# and fuzz/seeds. Findings stay in fuzz/out/TARGET/default (crashes/,
# hangs/); the corpus AFL grew is kept there and resumed by the next run.
# A hang is an input that runs over 1 s (-t 1000); an allocation beyond
# 1 GiB aborts (src/lib.rs), which AFL counts as a crash.
#
# Exit status: 1 when a campaign found a crash or a hang. Prints, per
# target, the executions done and what was found.
#
# Environment: LOCKSTEP_FUZZ_NICE (10), LOCKSTEP_FUZZ_BUILD=0 to skip the
# (incremental) build, LOCKSTEP_FUZZ_TARGET_DIR (~/.cache/lockstep/fuzz-target:
# outside the checkout, so that a fresh clone on the same machine reuses the
# instrumented build), LOCKSTEP_FUZZ_OUT (fuzz/out).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
TARGETS=(slurm_rest scontrol log_file policy config kube_objects)

usage() { sed -n '2,21p' "$0"; exit 2; }
[[ $# -ge 1 ]] || usage
if [[ $1 == list ]]; then printf '%s\n' "${TARGETS[@]}"; exit 0; fi
[[ $# -eq 2 && $2 =~ ^[0-9]+$ ]] || usage
what=$1 seconds=$2
if [[ $what == all ]]; then
  targets=("${TARGETS[@]}")
else
  [[ " ${TARGETS[*]} " == *" $what "* ]] || { echo "unknown target $what (fuzz/run.sh list)" >&2; exit 2; }
  targets=("$what")
fi

. "$repo/scripts/ensure-rust.sh"
if ! cargo afl --version >/dev/null 2>&1; then
  echo "installing cargo-afl (crates.io) ..." >&2
  cargo install --locked cargo-afl@0.18.2 >&2
fi
# AFL++ itself is built once per toolchain by `cargo afl config --build`
# (cargo install does it too); `cargo afl build` fails without it.
cargo afl config --build >/dev/null 2>&1 || true

cd "$here"
export CARGO_TARGET_DIR=${LOCKSTEP_FUZZ_TARGET_DIR:-$HOME/.cache/lockstep/fuzz-target}
outdir=${LOCKSTEP_FUZZ_OUT:-$here/out}
mkdir -p "$outdir"
if [[ ${LOCKSTEP_FUZZ_BUILD:-1} != 0 ]]; then
  echo "building the fuzz targets (AFL instrumentation, release) ..." >&2
  t0=$SECONDS
  nice -n "${LOCKSTEP_FUZZ_NICE:-10}" cargo afl build --release --quiet
  echo "built in $((SECONDS - t0)) s" >&2
fi

seed() { # target dir: fill the initial corpus
  local t=$1 d=$2
  mkdir -p "$d"
  case $t in
    slurm_rest)
      find "$repo/connectors/slurm/fixtures" -name '*.json' -size -512k -exec cp -t "$d" {} + 2>/dev/null || true
      # Same base names in several versions: keep each.
      local i=0 f
      while IFS= read -r f; do cp "$f" "$d/$((i++))-$(basename "$f")"; done \
        < <(find "$repo/connectors/slurm/fixtures" -name '*.json' -size -512k) ;;
    scontrol)
      local i=0 f
      while IFS= read -r f; do cp "$f" "$d/$((i++))-$(basename "$f")"; done \
        < <(find "$repo/connectors/slurm/fixtures" -name 'scontrol-show-*.txt')
      cp "$here"/seeds/scontrol/* "$d/" ;;
    log_file)
      # Small logs cut from the shipped ones (seeds/log_file.py): whole logs
      # make the campaign ten times slower.
      cp "$here"/seeds/log_file/* "$d/" ;;
    policy)
      cp "$here"/seeds/policy/* "$d/" 2>/dev/null || true
      find "$repo/deploy/policies" -name '*.json' -exec cp -t "$d" {} + 2>/dev/null || true ;;
    config)
      cp "$here"/seeds/config/* "$d/" ;;
    kube_objects)
      cp "$here"/seeds/kube/* "$d/" ;;
  esac
  # AFL wants small seeds: drop big ones when there are small ones.
  find "$d" -type f -size +256k -delete
  [[ -n $(ls -A "$d") ]] || { echo "no seeds for $t" >&2; exit 1; }
}

status=0
for t in "${targets[@]}"; do
  out=$outdir/$t
  input=$outdir/corpus/$t
  if [[ -d $out/default/queue ]]; then
    input=-   # resume the corpus of the last campaign
  else
    rm -rf "$input"
    seed "$t" "$input"
  fi
  echo "== $t: ${seconds} s" >&2
  # -t 1000: over 1 s is a hang. -V: stop after SECONDS. AFL_NO_AFFINITY:
  # the machine is shared, do not pin a core. No UI on a pipe.
  AFL_NO_AFFINITY=1 AFL_SKIP_CPUFREQ=1 AFL_NO_UI=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
    AFL_AUTORESUME=1 AFL_QUIET=1 \
    nice -n "${LOCKSTEP_FUZZ_NICE:-10}" cargo afl fuzz -i "$input" -o "$out" -t 1000 -V "$seconds" \
      "$CARGO_TARGET_DIR/release/$t" > "$outdir/$t.log" 2>&1 || {
        echo "afl-fuzz failed for $t; see $outdir/$t.log:" >&2; tail -n 20 "$outdir/$t.log" >&2; status=1; continue; }
  stats=$out/default/fuzzer_stats
  execs=$(awk -F: '$1 ~ /^execs_done/ {gsub(/ /, "", $2); print $2}' "$stats")
  speed=$(awk -F: '$1 ~ /^execs_per_sec/ {gsub(/ /, "", $2); print $2}' "$stats")
  crashes=$(find "$out/default/crashes" -type f -name 'id:*' 2>/dev/null | wc -l)
  hangs=$(find "$out/default/hangs" -type f -name 'id:*' 2>/dev/null | wc -l)
  corpus=$(awk -F: '$1 ~ /^corpus_count/ {gsub(/ /, "", $2); print $2}' "$stats")
  printf '%s: %s executions in all campaigns on this corpus (%s/s now), corpus %s, crashes %s, hangs %s\n' \
    "$t" "$execs" "$speed" "$corpus" "$crashes" "$hangs"
  (( crashes == 0 && hangs == 0 )) || status=1
done
exit $status
