#!/usr/bin/env bash
# Starts a local Kubernetes control plane (etcd + kube-apiserver, no kubelet,
# no controller-manager, no scheduler) on loopback, building the binaries first
# if they are not cached.  Idempotent: if it is already up it says so.
#
#   deploy/local/kube/up.sh
#   source "${LOCKSTEP_STATE_DIR:-/tmp/lockstep-local}/kube/env.sh"   # KUBECONFIG + PATH
#   kubectl get --raw /readyz
#
# See README.md beside this file for the env vars and quirks.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

STATE=${LOCKSTEP_STATE_DIR:-/tmp/lockstep-local}/kube
API_PORT=${LOCKSTEP_KUBE_API_PORT:-16443}
ETCD_CLIENT_PORT=${LOCKSTEP_ETCD_CLIENT_PORT:-2479}
ETCD_PEER_PORT=${LOCKSTEP_ETCD_PEER_PORT:-2480}
READY_TIMEOUT=${LOCKSTEP_KUBE_READY_TIMEOUT:-120}
SERVICE_CIDR=${LOCKSTEP_KUBE_SERVICE_CIDR:-10.96.0.0/24}
# Node lifecycle conditions (MaintenancePlanned, MaintenanceInProgress,
# DrainInProgress, Drained; alpha in v1.37) are on, as lockstep's
# maintenance policy reads and writes them; so is the EvictionRequest API
# (alpha, lifecycle.k8s.io/v1alpha1), which lockstep answers as an eviction
# responder.
FEATURE_GATES=${LOCKSTEP_KUBE_FEATURE_GATES:-NodeLifecycleConditions=true,EvictionRequestAPI=true}
RUNTIME_CONFIG=${LOCKSTEP_KUBE_RUNTIME_CONFIG-lifecycle.k8s.io/v1alpha1=true}
# What a running kube-apiserver must have been started with; one started
# with other gates or API groups (by an older up.sh) is restarted.
SERVES="feature-gates=$FEATURE_GATES runtime-config=$RUNTIME_CONFIG"
# No controller-manager runs, so nothing creates the "default" ServiceAccount
# of a namespace, and the ServiceAccount admission plugin rejects every Pod
# (see README "Quirks").  Set to "" to keep the plugin on.
DISABLE_ADMISSION=${LOCKSTEP_KUBE_DISABLE_ADMISSION-ServiceAccount}
# Extra kube-apiserver flags, split on whitespace (tests use --watch-cache=false
# so that a watch from a compacted resourceVersion gets a real 410 Gone).  Only
# read when kube-apiserver is started; a running one keeps its flags.
read -r -a APISERVER_EXTRA_ARGS <<< "${LOCKSTEP_KUBE_APISERVER_EXTRA_ARGS:-}"

log() { printf '[kube-up %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[kube-up] ERROR: %s\n' "$*" >&2; exit 1; }

"$here/build.sh"
BIN=$("$here/build.sh" --print-bin-dir)

PKI="$STATE/pki"
RUN="$STATE/run"
LOGS="$STATE/logs"
ETCD_DATA="$STATE/etcd-data"
mkdir -p "$PKI" "$RUN" "$LOGS"
chmod 700 "$STATE" "$PKI"

# Serialise concurrent up/down runs on the same state dir.
exec 9>"$STATE/.lock"
flock -w 300 9 || die "timed out waiting for $STATE/.lock"

# ---- credentials (generated once) -------------------------------------------
if [[ ! -s $PKI/sa.key || ! -s $PKI/sa.pub ]]; then
  log "generating service-account signing key pair"
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
  openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
fi
# The serving certificate is its own trust anchor (the kubeconfig's CA).  It
# must say CA:FALSE: rustls (kube-rs with rustls-tls) rejects a server
# certificate that is a CA ("invalid peer certificate: ... CaUsedAsEndEntity"),
# and `openssl req -x509` makes CA:TRUE certificates by default.  Go accepts
# both.  A CA:TRUE one left by an older up.sh is replaced.
# It also names the `kubernetes` Service IP (the first address of the service
# range), as a real cluster's does: pods on a real node (node-up.sh) reach the
# API server through it.
SERVICE_IP=$(awk -F'[./]' '{printf "%d.%d.%d.%d", $1, $2, $3, $4 + 1}' <<< "$SERVICE_CIDR")
# (`cmd | grep -q` under pipefail fails when grep's early exit gives cmd a SIGPIPE)
serving_is_ca() { grep -q 'CA:TRUE' <<< "$(openssl x509 -in "$PKI/serving.crt" -noout -ext basicConstraints 2>/dev/null)"; }
serving_lacks_service_ip() { ! grep -q "IP Address:$SERVICE_IP\b" <<< "$(openssl x509 -in "$PKI/serving.crt" -noout -ext subjectAltName 2>/dev/null)"; }
new_cert=0
if [[ ! -s $PKI/serving.crt || ! -s $PKI/serving.key ]] || serving_is_ca || serving_lacks_service_ip; then
  log "generating self-signed serving certificate for 127.0.0.1/localhost/$SERVICE_IP"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 \
    -keyout "$PKI/serving.key" -out "$PKI/serving.crt" \
    -subj "/CN=lockstep-local-kube-apiserver" \
    -addext "subjectAltName=IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" \
    -addext "basicConstraints=critical,CA:FALSE" \
    -addext "keyUsage=critical,digitalSignature,keyEncipherment" \
    -addext "extendedKeyUsage=serverAuth" 2>/dev/null
  new_cert=1
fi
if [[ ! -s $PKI/tokens.csv ]]; then
  log "generating static admin token (group system:masters)"
  # token,user,uid,"group1,group2"
  printf '%s,lockstep-admin,lockstep-admin,"system:masters"\n' "$(openssl rand -hex 32)" > "$PKI/tokens.csv"
fi
chmod 600 "$PKI"/*.key "$PKI/tokens.csv"
TOKEN=$(head -n1 "$PKI/tokens.csv" | cut -d, -f1)
SERVER="https://127.0.0.1:$API_PORT"

write_client_files() {
  local ca
  ca=$(base64 -w0 < "$PKI/serving.crt")
  umask 077
  cat > "$STATE/kubeconfig.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: lockstep-local
  cluster:
    server: $SERVER
    certificate-authority-data: $ca
users:
- name: lockstep-admin
  user:
    token: $TOKEN
contexts:
- name: lockstep-local
  context:
    cluster: lockstep-local
    user: lockstep-admin
    namespace: default
current-context: lockstep-local
EOF
  mv -f "$STATE/kubeconfig.tmp" "$STATE/kubeconfig"
  cat > "$STATE/env.sh.tmp" <<EOF
# Generated by deploy/local/kube/up.sh; source it.
export KUBECONFIG='$STATE/kubeconfig'
export LOCKSTEP_KUBE_SERVER='$SERVER'
export LOCKSTEP_KUBE_TOKEN='$TOKEN'
export LOCKSTEP_KUBE_CA_FILE='$PKI/serving.crt'
case ":\$PATH:" in *':$BIN:'*) ;; *) export PATH='$BIN':"\$PATH" ;; esac
EOF
  mv -f "$STATE/env.sh.tmp" "$STATE/env.sh"
}

# ---- process helpers --------------------------------------------------------
# alive NAME, start NAME COMMAND...
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
etcd_healthy() { grep -q '"health":"true"' <<< "$(curl -fsS -m 3 "http://127.0.0.1:$ETCD_CLIENT_PORT/health" 2>/dev/null)"; }
api_ready() { [[ $(curl -ksS -m 5 -H "Authorization: Bearer $TOKEN" "$SERVER/readyz" 2>/dev/null) == ok ]]; }
# wait_for NAME CHECK: up to READY_TIMEOUT seconds; on failure print the log tail
wait_for() {
  local name=$1 check=$2 t0=$SECONDS
  while ! $check; do
    if ! alive "$name"; then
      echo "---- last 40 lines of $LOGS/$name.log" >&2; tail -n 40 "$LOGS/$name.log" >&2
      die "$name exited during startup"
    fi
    if (( SECONDS - t0 >= READY_TIMEOUT )); then
      echo "---- last 40 lines of $LOGS/$name.log" >&2; tail -n 40 "$LOGS/$name.log" >&2
      die "$name not ready after ${READY_TIMEOUT}s (LOCKSTEP_KUBE_READY_TIMEOUT)"
    fi
    sleep 0.5
  done
  log "$name ready after $(( SECONDS - t0 ))s"
}

# A running kube-apiserver still serves the old certificate, or other
# feature gates and API groups: restart it.
serves_other() { [[ $(cat "$RUN/kube-apiserver.serves" 2>/dev/null) != "$SERVES" ]]; }
if { (( new_cert )) || serves_other; } && alive kube-apiserver; then
  pid=$(<"$RUN/kube-apiserver.pid")
  log "restarting kube-apiserver (pid $pid): a new certificate, or to serve $SERVES"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid" 2>/dev/null || true; sleep 0.5; }
  rm -f "$RUN/kube-apiserver.pid"
fi

# ---- etcd -------------------------------------------------------------------
was_up=0
alive etcd && alive kube-apiserver && was_up=1
if alive etcd; then
  log "etcd already running (pid $(<"$RUN/etcd.pid"))"
else
  port_busy "$ETCD_CLIENT_PORT" && die "port $ETCD_CLIENT_PORT is taken by another process (set LOCKSTEP_ETCD_CLIENT_PORT)"
  port_busy "$ETCD_PEER_PORT" && die "port $ETCD_PEER_PORT is taken by another process (set LOCKSTEP_ETCD_PEER_PORT)"
  log "starting etcd on 127.0.0.1:$ETCD_CLIENT_PORT (data $ETCD_DATA)"
  start etcd "$BIN/etcd" \
    --name lockstep-local \
    --data-dir "$ETCD_DATA" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "lockstep-local=http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster-state new \
    --log-level warn
fi
wait_for etcd etcd_healthy

# ---- kube-apiserver ---------------------------------------------------------
if alive kube-apiserver; then
  log "kube-apiserver already running (pid $(<"$RUN/kube-apiserver.pid"))"
else
  port_busy "$API_PORT" && die "port $API_PORT is taken by another process (set LOCKSTEP_KUBE_API_PORT)"
  log "starting kube-apiserver on $SERVER"
  extra=()
  [[ -n $DISABLE_ADMISSION ]] && extra+=(--disable-admission-plugins="$DISABLE_ADMISSION")
  [[ -n $RUNTIME_CONFIG ]] && extra+=(--runtime-config="$RUNTIME_CONFIG")
  extra+=("${APISERVER_EXTRA_ARGS[@]}")
  (( ${#APISERVER_EXTRA_ARGS[@]} )) && log "extra kube-apiserver flags: ${APISERVER_EXTRA_ARGS[*]}"
  start kube-apiserver "$BIN/kube-apiserver" \
    --advertise-address=127.0.0.1 \
    --endpoint-reconciler-type=none \
    --bind-address=127.0.0.1 \
    --secure-port="$API_PORT" \
    --etcd-servers="http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --tls-cert-file="$PKI/serving.crt" \
    --tls-private-key-file="$PKI/serving.key" \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --token-auth-file="$PKI/tokens.csv" \
    --authorization-mode=RBAC \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --allow-privileged=true \
    --profiling=false \
    --feature-gates="$FEATURE_GATES" \
    "${extra[@]}"
  echo "$SERVES" > "$RUN/kube-apiserver.serves"
fi
wait_for kube-apiserver api_ready

write_client_files
(( was_up )) && log "already up; nothing started"
log "up: $SERVER (etcd pid $(<"$RUN/etcd.pid"), kube-apiserver pid $(<"$RUN/kube-apiserver.pid"))"
log "use: source $STATE/env.sh   # KUBECONFIG=$STATE/kubeconfig, kubectl $("$BIN/kubectl" version --client 2>/dev/null | head -n1 | awk '{print $3}')"
