#!/usr/bin/env bash
# Stop what deploy/local/slurm/up.sh started (by its pid files). Idempotent.
# --purge also deletes the state dir (config, keys, spool, logs, token).
set -euo pipefail

STATE="${LOCKSTEP_SLURM_STATE_DIR:-${LOCKSTEP_STATE_DIR:-/tmp/lockstep-local}/slurm}"

# Never at the same time as up.sh on the same state dir (see up.sh).
if [[ -d "$STATE" && "${LOCKSTEP_SLURM_LOCKED:-}" != "$STATE" ]]; then
  exec env LOCKSTEP_SLURM_LOCKED="$STATE" \
    flock -o -w "${LOCKSTEP_SLURM_LOCK_WAIT:-900}" "$STATE/.lock" "$0" "$@"
fi
RUN="$STATE/run"
CONF="$STATE/slurm.conf"
PURGE=0
for a in "$@"; do
  case "$a" in
  --purge) PURGE=1 ;;
  -h | --help)
    echo "usage: $0 [--purge]"
    exit 0
    ;;
  *)
    echo "slurm-down: unknown argument $a" >&2
    exit 2
    ;;
  esac
done

log() { printf 'slurm-down: %s\n' "$*" >&2; }

# stop PROG PIDFILE...: SIGTERM each process that is alive and really PROG,
# wait up to 20 s for all of them, then SIGKILL. Removes the pid files.
stop() {
  local prog="$1" f pid t
  shift
  local pids=()
  for f in "$@"; do
    [[ -f "$f" ]] || continue
    pid="$(tr -dc '0-9' <"$f")"
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null &&
      [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$prog" ]]; then
      log "stopping $(basename "$f" .pid) (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
    rm -f "$f"
  done
  for pid in "${pids[@]}"; do
    for ((t = 0; t < 100; t++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$prog $pid still alive after 20s, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

alive() { # pidfile prog
  local pid
  [[ -s "$1" ]] || return 1
  pid="$(tr -dc '0-9' <"$1")"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null &&
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$2" ]]
}

# Cancel this cluster's jobs first, so no slurmstepd or job process outlives
# its slurmd.
if [[ -d "$RUN" ]] && alive "$RUN/slurmctld.pid" slurmctld && [[ -f "$CONF" ]]; then
  mapfile -t jobs < <(SLURM_CONF="$CONF" squeue -h -o %A 2>/dev/null || true)
  if ((${#jobs[@]} > 0)); then
    log "cancelling ${#jobs[@]} job(s)"
    SLURM_CONF="$CONF" scancel "${jobs[@]}" 2>/dev/null || true
    for ((t = 0; t < 15; t++)); do
      [[ -z "$(SLURM_CONF="$CONF" squeue -h -t running,completing -o %A 2>/dev/null)" ]] && break
      sleep 1
    done
  fi
fi

if [[ -d "$RUN" ]]; then
  stop slurmrestd "$RUN/slurmrestd.pid"
  stop slurmd "$RUN"/slurmd-*.pid
  stop slurmctld "$RUN/slurmctld.pid"
  stop munged "$RUN/munged.pid"
fi

# Leftovers of jobs of this cluster: slurmstepd (it inherits SLURM_CONF from
# the slurmd that up.sh started) and job processes (SLURM_JOB_ID + SLURM_CONF).
for p in /proc/[0-9]*; do
  pid="${p#/proc/}"
  [[ "$pid" == "$$" ]] && continue
  { env_of="$(tr '\0' '\n' <"$p/environ")" && comm="$(cat "$p/comm")"; } 2>/dev/null || continue
  grep -qxF "SLURM_CONF=$CONF" <<<"$env_of" || continue
  if [[ "$comm" == slurmstepd ]] || grep -q '^SLURM_JOB_ID=' <<<"$env_of"; then
    log "killing leftover $comm (pid $pid)"
    kill -KILL "$pid" 2>/dev/null || true
  fi
done

if ((PURGE)) && [[ -d "$STATE" ]]; then
  log "removing $STATE"
  rm -rf -- "$STATE"
fi
log "stopped"
