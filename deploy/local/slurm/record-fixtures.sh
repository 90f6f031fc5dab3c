#!/usr/bin/env bash
# Record real Slurm responses as test fixtures, from the local Slurm of up.sh.
#
#   deploy/local/slurm/record-fixtures.sh [OUT_DIR]
#
# OUT_DIR defaults to connectors/slurm/fixtures/slurm-<major.minor> in this repo.
# Starts the local Slurm with up.sh (needs >= 4 nodes), puts it in known states,
# records slurmrestd JSON and `scontrol show ... -o` text, then cancels its jobs,
# resumes its nodes and restarts the slurmd it stopped. It does not run down.sh.
# Takes about 2 minutes (it waits for a stopped slurmd to time out).
# See connectors/slurm/fixtures/README.md for what each file is.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
STATE="${LOCKSTEP_SLURM_STATE_DIR:-${LOCKSTEP_STATE_DIR:-/tmp/lockstep-local}/slurm}"
WAIT="${LOCKSTEP_SLURM_WAIT:-120}"

log() { printf 'record: %s\n' "$*" >&2; }
die() { printf 'record: ERROR: %s\n' "$*" >&2; exit 1; }

"$HERE/up.sh" >/dev/null
# shellcheck disable=SC1091
. "$STATE/env.sh"
command -v jq >/dev/null || die "jq is needed (apt-get install jq)"
unset SLURM_JWT # see up.sh: the CLI must keep using munge
TOKEN="$(cat "$SLURM_JWT_FILE")"

VERSION="$(scontrol --version | awk '{print $2}')" # e.g. 22.05.8
OUT="${1:-$REPO/connectors/slurm/fixtures/slurm-$(cut -d. -f1,2 <<<"$VERSION")}"
mkdir -p "$OUT"
API="$SLURMRESTD_URL/slurm/$SLURMRESTD_OPENAPI_VERSION"
JOBDIR="$STATE/jobs"
STATUS="$OUT/update-time-status.txt"

mapfile -t N < <(sinfo -h -N -p batch -o '%N' | sort -u)
((${#N[@]} >= 4)) || die "need at least 4 nodes, have ${#N[@]}"
N1="${N[0]}" N2="${N[1]}" N3="${N[2]}" N4="${N[3]}"

# GET path -> stdout (pretty JSON as slurmrestd sends it), fails on non-200.
get() {
  curl -sS --fail-with-body --max-time 10 \
    -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" -H "X-SLURM-USER-TOKEN: $TOKEN" "$API/$1"
}
# HTTP status of GET path (body dropped).
code() {
  curl -s -o /dev/null -w '%{http_code}' --max-time 10 \
    -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" -H "X-SLURM-USER-TOKEN: $TOKEN" "$API/$1"
}
wait_until() { # description, command...
  local what="$1" t=0
  shift
  until "$@" >/dev/null 2>&1; do
    ((t++ >= WAIT)) && die "timed out after ${WAIT}s waiting for: $what"
    sleep 1
  done
}
# From scontrol, lower case: idle, mixed, allocated, idle+drain, idle*, down* ...
# (Not sinfo: once `sinfo -h -N -n ls-n3 -o %T` kept saying "allocated" for
# 40 s for a node that was MIXED per scontrol; a later run said "mixed".)
node_state() {
  scontrol show node -o "$1" | grep -o 'State=[^ ]*' | head -n1 | cut -d= -f2 | tr '[:upper:]' '[:lower:]'
}
node_is() { [[ "$(node_state "$1")" == "$2" ]]; }
job_state() { squeue -h -j "$1" -o '%T' 2>/dev/null; }
job_is() { [[ "$(job_state "$1")" == "$2" ]]; }
no_jobs() { [[ -z "$(squeue -h -o %A)" ]]; }
all_nodes_ok() { ! sinfo -h -N -p batch -o '%T' | grep -qvx idle; }

reset() {
  local j n
  for j in $(squeue -h -o %A); do scancel "$j"; done
  for n in "${N[@]}"; do
    if [[ "$(scontrol show node "$n" -o)" =~ State=[^\ ]*(DRAIN|DOWN) ]]; then
      scontrol update nodename="$n" state=resume
    fi
  done
  wait_until "no jobs left" no_jobs
  # `state=resume` leaves the node NOT_RESPONDING ("idle*") until its next ping.
  wait_until "all nodes idle" all_nodes_ok
}

sbatch_id() { (cd "$JOBDIR" && sbatch --parsable -o /dev/null "$@" | cut -d';' -f1); }

log "Slurm $VERSION, api $API, nodes ${N[*]}, out $OUT"
reset

# ---------------------------------------------------------------- all idle
get nodes >"$OUT/nodes-idle.json"

# ---------------------------------------------------------------- update_time
{
  echo "# GET $API/nodes?update_time=<unix seconds>, Slurm $VERSION, $(date -u +%FT%TZ)"
  echo "# columns: case, HTTP status"
} >"$STATUS"
sleep 2
t0="$(date +%s)"
sleep 2
c="$(code "nodes?update_time=$t0")"
echo "nodes, no change since update_time: $c" >>"$STATUS"
curl -s -i --max-time 10 -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" \
  -H "X-SLURM-USER-TOKEN: $TOKEN" "$API/nodes?update_time=$t0" |
  tr -d '\r' >"$OUT/nodes-update-time-unchanged.http"
echo "jobs, no change since update_time: $(code "jobs?update_time=$t0")" >>"$STATUS"
echo "partitions, no change since update_time: $(code "partitions?update_time=$t0")" >>"$STATUS"

log "draining $N2"
scontrol update nodename="$N2" state=drain reason="lockstep fixture: disk check"
sleep 1
echo "nodes, drained a node after update_time: $(code "nodes?update_time=$t0")" >>"$STATUS"
curl -s -i --max-time 10 -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" \
  -H "X-SLURM-USER-TOKEN: $TOKEN" "$API/nodes?update_time=$t0" |
  tr -d '\r' >"$OUT/nodes-update-time-changed.http"
echo "nodes, update_time=0: $(code "nodes?update_time=0")" >>"$STATUS"
echo "partitions, drained a node after update_time: $(code "partitions?update_time=$t0")" >>"$STATUS"

# ---------------------------------------------------------------- busy state
log "submitting jobs"
t1="$(date +%s)"
sleep 1
JA="$(sbatch_id -J fixture-exclusive -w "$N1" --exclusive --wrap 'sleep 600')"
JB="$(sbatch_id -J fixture-one-cpu -w "$N3" -c 1 --wrap 'sleep 600')"
wait_until "job $JA running" job_is "$JA" RUNNING
wait_until "job $JB running" job_is "$JB" RUNNING
JC="$(sbatch_id -J fixture-too-big -N 3 --exclusive --wrap 'sleep 60')"
JD="$(sbatch_id -J fixture-held --hold --time=10 --wrap 'sleep 60')"
wait_until "node $N1 allocated" node_is "$N1" allocated
wait_until "node $N3 mixed" node_is "$N3" mixed
wait_until "job $JC pending" job_is "$JC" PENDING
sleep 3 # let the scheduler give JC its pending reason
echo "jobs, submitted jobs after update_time: $(code "jobs?update_time=$t1")" >>"$STATUS"
echo "nodes, allocated nodes after update_time: $(code "nodes?update_time=$t1")" >>"$STATUS"

log "recording busy state (jobs $JA $JB running, $JC $JD pending)"
get nodes >"$OUT/nodes.json"
get jobs >"$OUT/jobs.json"
get "job/$JA" >"$OUT/job-running.json"
get "job/$JC" >"$OUT/job-pending.json"
get "node/$N2" >"$OUT/node-drained.json"
get partitions >"$OUT/partitions.json"
get "partition/batch" >"$OUT/partition-batch.json"
get diag >"$OUT/diag.json"
get ping >"$OUT/ping.json"
curl -sS --fail --max-time 10 -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" \
  -H "X-SLURM-USER-TOKEN: $TOKEN" "$SLURMRESTD_URL/openapi/v3" >"$OUT/openapi.json"
scontrol show node -o >"$OUT/scontrol-show-node.txt"
scontrol show job -o >"$OUT/scontrol-show-job.txt"
scontrol show partition -o >"$OUT/scontrol-show-partition.txt"
sinfo --json >"$OUT/sinfo.json"
squeue --json >"$OUT/squeue.json"
{
  echo "\$ scontrol --version"
  scontrol --version
  echo "\$ scontrol show node $N1 --json"
  scontrol show node "$N1" --json 2>&1 || true
  echo "\$ scontrol --json show node $N1"
  scontrol --json show node "$N1" 2>&1 || true
  echo "\$ sinfo --help | grep -E 'json|yaml'"
  sinfo --help 2>&1 | grep -E 'json|yaml' || true
  echo "\$ squeue --help | grep -E 'json|yaml'"
  squeue --help 2>&1 | grep -E 'json|yaml' || true
} >"$OUT/scontrol-version.txt"

# ---------------------------------------------------------------- not responding
PIDF="$STATE/run/slurmd-$N4.pid"
log "stopping slurmd $N4 (pid $(cat "$PIDF")), waiting for NOT_RESPONDING then DOWN"
t_stop="$(date +%s)"
kill -TERM "$(cat "$PIDF")"
nr() { node_state "$N4" | grep -qE '\*|not_responding'; }
wait_until "$N4 not responding" nr
t_nr="$(date +%s)"
get nodes >"$OUT/nodes-not-responding.json"
scontrol show node -o >"$OUT/scontrol-show-node-not-responding.txt"
down() { node_state "$N4" | grep -q '^down'; }
wait_until "$N4 down" down
t_down="$(date +%s)"
get nodes >"$OUT/nodes-down.json"
scontrol show node -o >"$OUT/scontrol-show-node-down.txt"
echo "# stopped slurmd $N4; NOT_RESPONDING after $((t_nr - t_stop))s, DOWN after $((t_down - t_stop))s (SlurmdTimeout=$(scontrol show config | awk '/^SlurmdTimeout/{print $3}'))" >>"$STATUS"

# ---------------------------------------------------------------- clean up
log "restarting slurmd $N4, cancelling jobs, resuming nodes"
"$HERE/up.sh" >/dev/null 2>&1 || true # restarts the stopped slurmd (ReturnToService=2)
reset
log "wrote $(find "$OUT" -maxdepth 1 -type f | wc -l) files to $OUT"
