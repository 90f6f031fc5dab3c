#!/usr/bin/env bash
# Stop what deploy/local/slurm/up.sh started (by its pid files) and unmount
# what it mounted in a Debian root (24.11, 26.05), also after a failed up.sh.
# Idempotent. Takes the same LOCKSTEP_SLURM_VERSION (and state dir) as up.sh.
# --purge also deletes the state dir (config, keys, spool, logs, token).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

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
      is_daemon "$pid" "$prog"; then
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
    is_daemon "$pid" "$2"
}

# The root up.sh used (it wrote it down before mounting anything).
ROOT=""
if [[ -s "$STATE/root" ]]; then
  ROOT="$(cat "$STATE/root")"
elif [[ "$SLURM_VERSION" != 22.05 ]]; then
  ROOT="$(slurm_root_path)"
fi
# This cluster's client programs (up.sh's wrappers run the right version).
cli() { # program args...
  local p="$1"
  shift
  if [[ -x "$STATE/bin/$p" ]]; then
    "$STATE/bin/$p" "$@"
  else
    SLURM_CONF="$CONF" "$p" "$@"
  fi
}

# Cancel this cluster's jobs first, so no slurmstepd or job process outlives
# its slurmd.
if [[ -d "$RUN" ]] && alive "$RUN/slurmctld.pid" slurmctld && [[ -f "$CONF" ]]; then
  mapfile -t jobs < <(cli squeue -h -o %A 2>/dev/null || true)
  if ((${#jobs[@]} > 0)); then
    log "cancelling ${#jobs[@]} job(s)"
    cli scancel "${jobs[@]}" 2>/dev/null || true
    for ((t = 0; t < 15; t++)); do
      [[ -z "$(cli squeue -h -t running,completing -o %A 2>/dev/null)" ]] && break
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

# Leftovers of this cluster: slurmstepd (it inherits SLURM_CONF from the
# slurmd that up.sh started), job processes (SLURM_JOB_ID + SLURM_CONF), and
# daemons whose pid file is gone (a daemon that lost its pid file, an up.sh
# that died between starting a daemon and writing its pid file). Never the
# caller's shell, which may have sourced env.sh: only these programs or jobs.
for p in /proc/[0-9]*; do
  pid="${p#/proc/}"
  [[ "$pid" == "$$" ]] && continue
  { env_of="$(tr '\0' '\n' <"$p/environ")" && comm="$(cat "$p/comm")"; } 2>/dev/null || continue
  grep -qxF "SLURM_CONF=$CONF" <<<"$env_of" || continue
  case "$comm" in
  slurmstepd | slurmscriptd | slurmctld | slurmctld-wlm | slurmd | slurmd-wlm | slurmrestd | munged) ;;
  *) grep -q '^SLURM_JOB_ID=' <<<"$env_of" || continue ;;
  esac
  log "killing leftover $comm (pid $pid)"
  kill -KILL "$pid" 2>/dev/null || true
done

# The mounts in the root: this state dir's, and proc, dev and sys once no
# other cluster of this version uses the root.
if [[ -n "$ROOT" && -d "$ROOT" ]]; then
  unmount_root "$ROOT" "$STATE"
  if is_mounted "$ROOT$STATE"; then
    log "ERROR: $ROOT$STATE is still mounted"
    exit 1
  fi
fi

if ((PURGE)) && [[ -d "$STATE" ]]; then
  log "removing $STATE"
  rm -rf -- "$STATE"
fi
log "stopped"
