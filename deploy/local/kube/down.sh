#!/usr/bin/env bash
# Stops the local control plane started by up.sh (kube-apiserver, then etcd),
# using the pid files under $STATE/run.  Idempotent.
#
#   deploy/local/kube/down.sh          stop; etcd data is kept for the next up.sh
#   deploy/local/kube/down.sh --wipe   stop and delete etcd data and logs
#                                      (keys, token and kubeconfig are kept)
#   deploy/local/kube/down.sh --apiserver-only
#                                      stop kube-apiserver, keep etcd running
#                                      (tests: an API server restart; up.sh
#                                      starts it again)
set -euo pipefail

STATE=${LOCKSTEP_STATE_DIR:-/tmp/lockstep-local}/kube
STOP_TIMEOUT=${LOCKSTEP_KUBE_STOP_TIMEOUT:-20}
wipe=0
apiserver_only=0
for arg in "$@"; do
  case $arg in
    --wipe) wipe=1 ;;
    --apiserver-only) apiserver_only=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "down.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

log() { printf '[kube-down %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

if [[ ! -d $STATE ]]; then
  log "nothing to do ($STATE does not exist)"
  exit 0
fi
RUN="$STATE/run"
exec 9>"$STATE/.lock"
flock -w 300 9 || { echo "down.sh: timed out waiting for $STATE/.lock" >&2; exit 1; }

# stop NAME: SIGTERM the pid in $RUN/NAME.pid if it is a NAME process, SIGKILL after STOP_TIMEOUT s
stop() {
  local name=$1 pidf="$RUN/$1.pid" pid
  if [[ ! -s $pidf ]]; then
    log "$name: not running (no pid file)"
    return 0
  fi
  pid=$(<"$pidf")
  if ! [[ $pid =~ ^[0-9]+$ ]] || ! kill -0 "$pid" 2>/dev/null || [[ $(cat "/proc/$pid/comm" 2>/dev/null) != "$name" ]]; then
    log "$name: not running (stale pid file)"
    rm -f "$pidf"
    return 0
  fi
  log "$name: stopping pid $pid"
  kill -TERM "$pid" 2>/dev/null || true
  local t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    if (( SECONDS - t0 >= STOP_TIMEOUT )); then
      log "$name: still running after ${STOP_TIMEOUT}s, SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
      break
    fi
    sleep 0.2
  done
  rm -f "$pidf"
  log "$name: stopped"
}

stop kube-apiserver
if (( apiserver_only )); then
  (( wipe )) && { echo "down.sh: --wipe needs etcd stopped; not wiping with --apiserver-only" >&2; exit 2; }
  exit 0
fi
stop etcd

if (( wipe )); then
  log "wiping etcd data and logs under $STATE"
  rm -rf "$STATE/etcd-data" "$STATE/logs"
fi
