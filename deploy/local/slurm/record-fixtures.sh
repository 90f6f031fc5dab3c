#!/usr/bin/env bash
# Record real Slurm responses as test fixtures, from the local Slurm of up.sh.
#
#   LOCKSTEP_SLURM_VERSION=22.05|24.11|26.05 deploy/local/slurm/record-fixtures.sh [OUT_DIR]
#
# OUT_DIR defaults to connectors/slurm/fixtures/slurm-<major.minor> in this
# repo. Starts that version's Slurm with up.sh (needs >= 4 nodes), puts it in
# known states and records, in each state, the slurmrestd JSON of every
# openapi version the server answers (22.05: v0.0.38 only, in OUT_DIR
# itself, as always; 24.11: v0.0.40..v0.0.42 and 26.05: v0.0.42..v0.0.45,
# each in OUT_DIR/v0.0.N/) and `scontrol show ... -o` text. Then it cancels
# its jobs, resumes its nodes and restarts the slurmd it stopped. It does not
# run down.sh. Takes about 2 minutes (it waits for a stopped slurmd to time
# out). See connectors/slurm/fixtures/README.md for what each file is.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
WAIT="${LOCKSTEP_SLURM_WAIT:-120}"

log() { printf 'record: %s\n' "$*" >&2; }
die() { printf 'record: ERROR: %s\n' "$*" >&2; exit 1; }

"$HERE/up.sh" >/dev/null
# shellcheck disable=SC1091
. "$STATE/env.sh"
# This version's client programs (up.sh's wrappers: the right Slurm, the
# right SLURM_CONF).
PATH="$LOCKSTEP_SLURM_BIN:$PATH"
command -v jq >/dev/null || die "jq is needed (apt-get install jq)"
unset SLURM_JWT # see up.sh: the CLI must keep using munge
TOKEN="$(cat "$SLURM_JWT_FILE")"

RELEASE="$(scontrol --version | awk '{print $2}')" # e.g. 22.05.8
OUT="${1:-$REPO/connectors/slurm/fixtures/slurm-$(cut -d. -f1,2 <<<"$RELEASE")}"
mkdir -p "$OUT"
JOBDIR="$STATE/jobs"
STATUS="$OUT/update-time-status.txt"

# The openapi versions this slurmrestd answers, and where each one's files go.
APIS=()
for ((n = 36; n <= 50; n++)); do
  c="$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 \
    -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" -H "X-SLURM-USER-TOKEN: $TOKEN" \
    "$SLURMRESTD_URL/slurm/v0.0.$n/ping")"
  [[ "$c" == 200 ]] && APIS+=("v0.0.$n")
done
((${#APIS[@]} > 0)) || die "slurmrestd at $SLURMRESTD_URL answers no openapi version"
dir_of() { # api -> directory of its files
  if [[ "$SLURM_VERSION" == 22.05 ]]; then
    # 22.05's files predate the per-version layout: only its own v0.0.38.
    echo "$OUT"
  else
    echo "$OUT/$1"
  fi
}
if [[ "$SLURM_VERSION" == 22.05 ]]; then APIS=("$SLURMRESTD_OPENAPI_VERSION"); fi
for a in "${APIS[@]}"; do mkdir -p "$(dir_of "$a")"; done

# GET api path -> stdout (JSON as slurmrestd sends it), fails on non-200.
get() {
  curl -sS --fail-with-body --max-time 10 \
    -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" -H "X-SLURM-USER-TOKEN: $TOKEN" \
    "$SLURMRESTD_URL/slurm/$1/$2"
}
# The same for every api version: get_all PATH FILE.
get_all() {
  local a
  for a in "${APIS[@]}"; do get "$a" "$1" >"$(dir_of "$a")/$2"; done
}
# GET api path with any status: body to FILE, status to stdout.
get_any() { # api path file [token]
  curl -s -o "$3" -w '%{http_code}' --max-time 10 \
    -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" -H "X-SLURM-USER-TOKEN: ${4:-$TOKEN}" \
    "$SLURMRESTD_URL/slurm/$1/$2"
}
# HTTP status of GET api path (body dropped).
code() {
  curl -s -o /dev/null -w '%{http_code}' --max-time 10 \
    -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" -H "X-SLURM-USER-TOKEN: $TOKEN" \
    "$SLURMRESTD_URL/slurm/$1/$2"
}
# `case, status` for every api version: status_line CASE PATH.
status_line() {
  local a
  for a in "${APIS[@]}"; do echo "$a $1: $(code "$a" "$2")" >>"$STATUS"; done
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

mapfile -t N < <(sinfo -h -N -p batch -o '%N' | sort -u)
((${#N[@]} >= 4)) || die "need at least 4 nodes, have ${#N[@]}"
N1="${N[0]}" N2="${N[1]}" N3="${N[2]}" N4="${N[3]}"

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

log "Slurm $RELEASE, slurmrestd $SLURMRESTD_URL (${APIS[*]}), nodes ${N[*]}, out $OUT"
reset

# ---------------------------------------------------------------- all idle
get_all nodes nodes-idle.json

# ---------------------------------------------------------------- update_time
{
  echo "# GET $SLURMRESTD_URL/slurm/<api>/<list>?update_time=<unix seconds>, Slurm $RELEASE, $(date -u +%FT%TZ)"
  echo "# columns: api case: HTTP status"
} >"$STATUS"
sleep 2
t0="$(date +%s)"
sleep 2
status_line "nodes, no change since update_time" "nodes?update_time=$t0"
status_line "jobs, no change since update_time" "jobs?update_time=$t0"
status_line "partitions, no change since update_time" "partitions?update_time=$t0"
for a in "${APIS[@]}"; do
  d="$(dir_of "$a")"
  curl -s -i --max-time 10 -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" \
    -H "X-SLURM-USER-TOKEN: $TOKEN" "$SLURMRESTD_URL/slurm/$a/nodes?update_time=$t0" |
    tr -d '\r' >"$d/nodes-update-time-unchanged.http"
  if [[ "$SLURM_VERSION" != 22.05 ]]; then
    # 24.11+: an unchanged job list is HTTP 200, no jobs, a warning.
    get_any "$a" "jobs?update_time=$t0" "$d/jobs-update-time-unchanged.json" >/dev/null
  fi
done

log "draining $N2"
scontrol update nodename="$N2" state=drain reason="lockstep fixture: disk check"
sleep 1
status_line "nodes, drained a node after update_time" "nodes?update_time=$t0"
for a in "${APIS[@]}"; do
  curl -s -i --max-time 10 -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" \
    -H "X-SLURM-USER-TOKEN: $TOKEN" "$SLURMRESTD_URL/slurm/$a/nodes?update_time=$t0" |
    tr -d '\r' >"$(dir_of "$a")/nodes-update-time-changed.http"
done
status_line "nodes, update_time=0" "nodes?update_time=0"
status_line "partitions, drained a node after update_time" "partitions?update_time=$t0"

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
status_line "jobs, submitted jobs after update_time" "jobs?update_time=$t1"
status_line "nodes, allocated nodes after update_time" "nodes?update_time=$t1"

log "recording busy state (jobs $JA $JB running, $JC $JD pending)"
get_all nodes nodes.json
get_all jobs jobs.json
get_all "job/$JA" job-running.json
get_all "job/$JC" job-pending.json
get_all "node/$N2" node-drained.json
get_all partitions partitions.json
get_all "partition/batch" partition-batch.json
get_all diag diag.json
get_all ping ping.json
if [[ "$SLURM_VERSION" == 22.05 ]]; then
  # 23.02+ serve a spec of several megabytes; the published ones are in
  # ../shared/slurm-api (the cross-check test reads them from there).
  curl -sS --fail --max-time 10 -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" \
    -H "X-SLURM-USER-TOKEN: $TOKEN" "$SLURMRESTD_URL/openapi/v3" >"$OUT/openapi.json"
else
  for a in "${APIS[@]}"; do
    d="$(dir_of "$a")"
    # The traps: an unknown node (HTTP 200, no `nodes`) and a token
    # slurmrestd does not accept (HTTP 511 with `"jobs": []`).
    echo "$a node/ls-unknown: $(get_any "$a" node/ls-unknown "$d/node-unknown.json")" >>"$STATUS"
    echo "$a jobs, a token slurmctld rejects: $(get_any "$a" jobs "$d/jobs-bad-token.json" not-a-token)" >>"$STATUS"
  done
fi
scontrol show node -o >"$OUT/scontrol-show-node.txt"
scontrol show job -o >"$OUT/scontrol-show-job.txt"
scontrol show partition -o >"$OUT/scontrol-show-partition.txt"
sinfo --json >"$OUT/sinfo.json"
squeue --json >"$OUT/squeue.json"
{
  echo "\$ scontrol --version"
  scontrol --version
  echo "\$ scontrol show node $N1 --json"
  scontrol show node "$N1" --json 2>&1 | head -c 200 || true
  echo
  echo "\$ sinfo --help | grep -E 'json|yaml'"
  sinfo --help 2>&1 | grep -E 'json|yaml' || true
  echo "\$ squeue --help | grep -E 'json|yaml'"
  squeue --help 2>&1 | grep -E 'json|yaml' || true
} >"$OUT/scontrol-version.txt"

# ---------------------------------------------------------------- REST writes
if [[ "$SLURM_VERSION" != 22.05 ]]; then
  # A drain through REST, as lockstep's actuator sends it, and the node
  # afterwards; then a resume. The answer of a POST is the same for every
  # version: recorded once, with the newest.
  API="${APIS[-1]}"
  d="$(dir_of "$API")"
  curl -sS --max-time 10 -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" -H "X-SLURM-USER-TOKEN: $TOKEN" \
    -H 'Content-Type: application/json' -X POST \
    -d "{\"state\": [\"DRAIN\"], \"reason\": \"lockstep: fixture drain\", \"reason_uid\": \"$SLURM_JWT_USER\"}" \
    "$SLURMRESTD_URL/slurm/$API/node/$N4" >"$d/node-update-drain.json"
  get_all "node/$N4" node-drained-by-rest.json
  curl -sS --max-time 10 -H "X-SLURM-USER-NAME: $SLURM_JWT_USER" -H "X-SLURM-USER-TOKEN: $TOKEN" \
    -H 'Content-Type: application/json' -X POST -d '{"state": ["RESUME"]}' \
    "$SLURMRESTD_URL/slurm/$API/node/$N4" >/dev/null
  wait_until "$N4 idle again" node_is "$N4" idle
fi

# ---------------------------------------------------------------- not responding
PIDF="$STATE/run/slurmd-$N4.pid"
log "stopping slurmd $N4 (pid $(cat "$PIDF")), waiting for NOT_RESPONDING then DOWN"
t_stop="$(date +%s)"
kill -TERM "$(cat "$PIDF")"
nr() { node_state "$N4" | grep -qE '\*|not_responding'; }
wait_until "$N4 not responding" nr
t_nr="$(date +%s)"
get_all nodes nodes-not-responding.json
scontrol show node -o >"$OUT/scontrol-show-node-not-responding.txt"
down() { node_state "$N4" | grep -q '^down'; }
wait_until "$N4 down" down
t_down="$(date +%s)"
get_all nodes nodes-down.json
scontrol show node -o >"$OUT/scontrol-show-node-down.txt"
echo "# stopped slurmd $N4; NOT_RESPONDING after $((t_nr - t_stop))s, DOWN after $((t_down - t_stop))s (SlurmdTimeout=$(scontrol show config | awk '/^SlurmdTimeout/{print $3}'))" >>"$STATUS"

# ---------------------------------------------------------------- clean up
log "restarting slurmd $N4, cancelling jobs, resuming nodes"
"$HERE/up.sh" >/dev/null 2>&1 || true # restarts the stopped slurmd (ReturnToService=2)
reset
log "$(find "$OUT" -type f | wc -l) files in $OUT"
