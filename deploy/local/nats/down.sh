#!/usr/bin/env bash
# Stops the servers of the local NATS cluster started by up.sh, by the pid
# files under $STATE/run.  Idempotent.
#
#   deploy/local/nats/down.sh            stop all three (SIGTERM; SIGKILL after 20 s)
#   deploy/local/nats/down.sh 2          stop server 2 only
#   deploy/local/nats/down.sh --kill 2   SIGKILL server 2 (a crash: no goodbye to the cluster)
#   deploy/local/nats/down.sh --wipe ... also delete the stopped servers' store
#                                        directories and logs (a restart then
#                                        rejoins empty and catches up from the others)
#
# Same environment as up.sh (LOCKSTEP_STATE_DIR, LOCKSTEP_NATS_STATE_DIR).
set -euo pipefail

STATE=${LOCKSTEP_NATS_STATE_DIR:-${LOCKSTEP_STATE_DIR:-/tmp/lockstep-local}/nats}
STOP_TIMEOUT_S=${LOCKSTEP_NATS_STOP_TIMEOUT_S:-20}

log() { printf '[nats-down %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

wipe=0
signal=TERM
only=()
for arg in "$@"; do
  case $arg in
    --wipe) wipe=1 ;;
    --kill) signal=KILL ;;
    1|2|3) only+=("$arg") ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "down.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
((${#only[@]})) || only=(1 2 3)

if [[ ! -d $STATE ]]; then
  log "nothing to do ($STATE does not exist)"
  exit 0
fi
exec 9>"$STATE/.lock"
flock -w 60 9 || { echo "down.sh: timed out waiting for $STATE/.lock" >&2; exit 1; }

for i in "${only[@]}"; do
  pidf=$STATE/run/n$i.pid
  pid=$(cat "$pidf" 2>/dev/null || true)
  if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
      && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == nats-server ]]; then
    log "n$i: SIG$signal pid $pid"
    # A stopped (SIGSTOP) server cannot act on SIGTERM until it runs again.
    kill -CONT "$pid" 2>/dev/null || true
    kill "-$signal" "$pid" 2>/dev/null || true
    t0=$SECONDS
    while kill -0 "$pid" 2>/dev/null; do
      if (( SECONDS - t0 >= STOP_TIMEOUT_S )); then
        log "n$i: still running after ${STOP_TIMEOUT_S} s, SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
      fi
      sleep 0.1
    done
  else
    log "n$i: not running"
  fi
  rm -f "$pidf"
  if (( wipe )); then
    log "n$i: wiping its store directory and log"
    rm -rf "${STATE:?}/n$i" "$STATE/logs/n$i.log"
  fi
done
