#!/usr/bin/env bash
# lockstep's main job without a cluster: replay a shipped incident log,
# verify that the recomputed actions match the recorded ones, and show the
# causal chain of the node it drained.
#
#   scripts/replay-demo.sh [incident-name]     (default: not-ready-grace)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-rust.sh
incident="${1:-not-ready-grace}"
log="replay-tests/incidents/${incident}.jsonl"
if [ ! -f "$log" ]; then
  echo "no incident '$incident'; the shipped ones are:" >&2
  ls replay-tests/incidents/*.jsonl | xargs -n1 basename | sed 's/\.jsonl$//' >&2
  exit 2
fi
echo "building lockstep (release) ..." >&2
cargo build --release --quiet --bin lockstep
echo "== lockstep replay --verify $log" >&2
./target/release/lockstep replay --verify "$log"
node=$(./target/release/lockstep replay --json "$log" 2>/dev/null \
  | sed -n 's/.*"node":"\([^"]*\)","from":"in_service","to":"draining".*/\1/p' | head -n1)
if [ -n "$node" ]; then
  echo "== lockstep audit $node --log $log" >&2
  ./target/release/lockstep audit "$node" --log "$log"
fi
