#!/usr/bin/env bash
# Starts a real Kubernetes node on this machine: containerd (v2) + runc,
# kube-controller-manager, kube-scheduler and a kubelet, against the control
# plane of up.sh (started here, with the settings a node needs, if it is not
# running).  Builds what is missing first (build.sh node; ~20 min the first
# time on 2 cores, cached after).  Idempotent: what runs is left alone.
#
#   deploy/local/kube/node-up.sh
#   source /tmp/lockstep-node/node/env.sh   # KUBECONFIG, PATH, LOCKSTEP_NODE_*
#   kubectl get nodes
#   deploy/local/kube/node-down.sh          # stop it all, restore the host
#
# Nothing leaves the machine: pods get an address on a bridge of our own
# with no default route and no masquerade; the kubelet listens on the
# bridge's address; the `kubernetes` Service IP and the listed host ports
# are DNATed to loopback (there is no kube-proxy); image pulls go to a
# registry mirror on 127.0.0.1:1 that refuses them.  See README.md
# ("A real node") for every host change and how node-down.sh undoes it.
#
# Env (defaults): LOCKSTEP_STATE_DIR (/tmp/lockstep-node), LOCKSTEP_KUBE_API_PORT
# (27443), LOCKSTEP_ETCD_CLIENT_PORT / _PEER_PORT (27479 / 27480),
# LOCKSTEP_NODE_NAME (lockstep-node), LOCKSTEP_NODE_POD_CIDR (10.85.0.0/24),
# LOCKSTEP_NODE_BRIDGE (lsnode0), LOCKSTEP_NODE_HOST_PORTS (loopback ports
# pods may reach at the bridge address, space or comma separated; none),
# LOCKSTEP_NODE_READY_TIMEOUT (180 s), LOCKSTEP_NODE_MONITOR_GRACE (20s).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)

STATE_ROOT=${LOCKSTEP_STATE_DIR:-/tmp/lockstep-node}
# The control plane a node needs: its own state dir and ports (the API-only
# tests keep /tmp/lockstep-local), every default admission plugin (the
# ServiceAccount plugin gives pods their tokens), and kubelets reached by
# their InternalIP (no DNS lookup of node names).
export LOCKSTEP_STATE_DIR=$STATE_ROOT
export LOCKSTEP_KUBE_API_PORT=${LOCKSTEP_KUBE_API_PORT:-27443}
export LOCKSTEP_ETCD_CLIENT_PORT=${LOCKSTEP_ETCD_CLIENT_PORT:-27479}
export LOCKSTEP_ETCD_PEER_PORT=${LOCKSTEP_ETCD_PEER_PORT:-27480}
export LOCKSTEP_KUBE_DISABLE_ADMISSION=
export LOCKSTEP_KUBE_APISERVER_EXTRA_ARGS="--kubelet-preferred-address-types=InternalIP"

NODE="$STATE_ROOT/node"
KUBE="$STATE_ROOT/kube"
NODE_NAME=${LOCKSTEP_NODE_NAME:-lockstep-node}
POD_CIDR=${LOCKSTEP_NODE_POD_CIDR:-10.85.0.0/24}
BRIDGE=${LOCKSTEP_NODE_BRIDGE:-lsnode0}
HOST_PORTS_LIST=${LOCKSTEP_NODE_HOST_PORTS:-}
read -r -a HOST_PORTS <<< "${HOST_PORTS_LIST//,/ }"
READY_TIMEOUT=${LOCKSTEP_NODE_READY_TIMEOUT:-180}
MONITOR_GRACE=${LOCKSTEP_NODE_MONITOR_GRACE:-20s}
# The same feature gates as the API server (deploy/local/kube/up.sh).
FEATURE_GATES=${LOCKSTEP_KUBE_FEATURE_GATES:-NodeLifecycleConditions=true}
SERVICE_CIDR=${LOCKSTEP_KUBE_SERVICE_CIDR:-10.96.0.0/24}
KUBELET_PORT=${LOCKSTEP_NODE_KUBELET_PORT:-10250}
KUBELET_HEALTHZ_PORT=${LOCKSTEP_NODE_KUBELET_HEALTHZ_PORT:-27248}
KCM_PORT=${LOCKSTEP_NODE_KCM_PORT:-27257}
SCHEDULER_PORT=${LOCKSTEP_NODE_SCHEDULER_PORT:-27259}
PAUSE_IMAGE=lockstep.local/pause:3.10

log() { printf '[node-up %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[node-up] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (containerd, kubelet, bridge, iptables)"

# One node-up.sh or node-down.sh at a time, for the whole run (control plane
# included); the lock file is outside what node-down.sh --wipe deletes. The
# daemons do not inherit it (start: 9>&-; up.sh reuses fd 9 for its own lock).
mkdir -p "$STATE_ROOT"
exec 9>"$STATE_ROOT/.node.lock"
flock -w 600 9 || die "timed out waiting for $STATE_ROOT/.node.lock"

# Addresses: the bridge carries the pod subnet's first address; it is also
# the node's InternalIP (a node IP may not be loopback, and eth0 would put the
# kubelet on the outside network).
read -r GATEWAY POD_PREFIX SERVICE_IP < <(python3 - "$POD_CIDR" "$SERVICE_CIDR" <<'EOF'
import ipaddress, sys
pods = ipaddress.ip_network(sys.argv[1]); svc = ipaddress.ip_network(sys.argv[2])
print(pods.network_address + 1, pods.prefixlen, svc.network_address + 1)
EOF
)

# ---- packages (Debian) -------------------------------------------------------
missing=()
command -v iptables >/dev/null || missing+=(iptables)
command -v nft >/dev/null || missing+=(nftables)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
if (( ${#missing[@]} )); then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
fi

# ---- binaries and control plane ---------------------------------------------
"$here/build.sh" node
BIN=$("$here/build.sh" --print-bin-dir)

# A running kube-apiserver keeps its flags: restart one that lacks what a node needs.
apiserver_pid=$(cat "$KUBE/run/kube-apiserver.pid" 2>/dev/null || true)
if [[ $apiserver_pid =~ ^[0-9]+$ && $(cat "/proc/$apiserver_pid/comm" 2>/dev/null) == kube-apiserver ]]; then
  cmdline=$(tr '\0' ' ' < "/proc/$apiserver_pid/cmdline")
  if [[ $cmdline != *--kubelet-preferred-address-types=InternalIP* || $cmdline == *--disable-admission-plugins=* ]]; then
    log "kube-apiserver (pid $apiserver_pid) runs without the node's settings; restarting it"
    "$here/down.sh" --apiserver-only
  fi
fi
"$here/up.sh"
# shellcheck disable=SC1091
. "$KUBE/env.sh"
PKI="$KUBE/pki"
KC="$KUBE/kubeconfig"

RUN="$NODE/run"
LOGS="$NODE/logs"
mkdir -p "$RUN" "$LOGS" "$NODE/containerd" "$NODE/cni/net.d" "$NODE/kubelet" "$NODE/pod-logs"

# alive NAME, start NAME COMMAND...
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
wait_for() {
  local name=$1 check=$2 t0=$SECONDS
  while ! $check; do
    if [[ $name != node ]] && ! alive "$name"; then
      echo "---- last 40 lines of $LOGS/$name.log" >&2; tail -n 40 "$LOGS/$name.log" >&2
      die "$name exited during startup"
    fi
    if (( SECONDS - t0 >= READY_TIMEOUT )); then
      [[ -f $LOGS/$name.log ]] && { echo "---- last 40 lines of $LOGS/$name.log" >&2; tail -n 40 "$LOGS/$name.log" >&2; }
      die "$name not ready after ${READY_TIMEOUT}s (LOCKSTEP_NODE_READY_TIMEOUT)"
    fi
    sleep 0.5
  done
  log "$name ready after $(( SECONDS - t0 ))s"
}

# ---- what the host looked like before (once, while nothing of ours runs) ----
# node-down.sh restores exactly this and then deletes the snapshot.
BEFORE="$NODE/host-before"
if [[ ! -f $BEFORE/complete ]]; then
  log "recording the host's state before the node ($BEFORE)"
  rm -rf "$BEFORE"; mkdir -p "$BEFORE"
  for k in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops \
           kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward \
           net.ipv6.conf.all.forwarding net.ipv4.conf.all.route_localnet; do
    v=$(sysctl -n "$k" 2>/dev/null) && printf '%s=%s\n' "$k" "$v"
  done > "$BEFORE/sysctl"
  nft list tables > "$BEFORE/nft-tables" 2>/dev/null || true
  { iptables-save; ip6tables-save; } 2>/dev/null | awk '/^:/ {print $1}' | sort -u > "$BEFORE/iptables-chains"
  for d in /var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/containerd \
           /run/netns /run/nri /var/run/nri /opt/containerd /etc/cni /var/lib/containerd; do
    [[ -e $d ]] && echo "$d"
  done > "$BEFORE/paths"
  for h in /sys/fs/cgroup/*/; do
    for top in kubepods kubepods.slice k8s.io; do [[ -d $h$top ]] && echo "$h$top"; done
  done > "$BEFORE/cgroups"
  touch "$BEFORE/complete"
fi

# ---- network -----------------------------------------------------------------
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  log "creating bridge $BRIDGE ($GATEWAY/$POD_PREFIX)"
  ip link add "$BRIDGE" type bridge
fi
# (never `cmd | grep -q` under pipefail: grep's early exit makes cmd fail with SIGPIPE)
[[ $(ip -o -4 addr show dev "$BRIDGE") == *"inet $GATEWAY/$POD_PREFIX "* ]] || ip addr add "$GATEWAY/$POD_PREFIX" dev "$BRIDGE"
ip link set "$BRIDGE" up
# DNAT to 127.0.0.1 of packets that arrive on the bridge needs route_localnet
# there (only there). The kubelet's KUBE-FIREWALL chain still drops any other
# packet to 127.0.0.0/8 that does not come from loopback (it lets DNAT through).
sysctl -qw "net.ipv4.conf.$BRIDGE.route_localnet=1"

# Our own chains, rewritten on every run (jumps added once).
ensure_chain() { # TABLE CHAIN PARENT MATCH...
  local table=$1 chain=$2 parent=$3; shift 3
  iptables -t "$table" -N "$chain" 2>/dev/null || iptables -t "$table" -F "$chain"
  iptables -t "$table" -C "$parent" "$@" -j "$chain" 2>/dev/null || iptables -t "$table" -I "$parent" 1 "$@" -j "$chain"
}
# nat: what a kube-proxy would do for the one Service that matters (the API
# server), from pods and from the host (hostNetwork pods); and the host's
# loopback services the pods may use, at the bridge address.
ensure_chain nat LSNODE-PODS PREROUTING -i "$BRIDGE"
iptables -t nat -A LSNODE-PODS -d "$SERVICE_IP" -p tcp --dport 443 -j DNAT --to-destination "127.0.0.1:$LOCKSTEP_KUBE_API_PORT"
for p in "${HOST_PORTS[@]}"; do
  [[ $p =~ ^[0-9]+$ ]] || die "LOCKSTEP_NODE_HOST_PORTS: not a port: $p"
  iptables -t nat -A LSNODE-PODS -d "$GATEWAY" -p tcp --dport "$p" -j DNAT --to-destination "127.0.0.1:$p"
done
ensure_chain nat LSNODE-HOST OUTPUT
iptables -t nat -A LSNODE-HOST -d "$SERVICE_IP" -p tcp --dport 443 -j DNAT --to-destination "127.0.0.1:$LOCKSTEP_KUBE_API_PORT"
# filter: nothing for the service range leaves the machine (there is no
# kube-proxy: without this such a connection would go to the default
# gateway), and nothing from a pod is forwarded off the bridge.
ensure_chain filter LSNODE-HOST OUTPUT
iptables -A LSNODE-HOST -d "$SERVICE_CIDR" -j REJECT
ensure_chain filter LSNODE-FORWARD FORWARD -i "$BRIDGE"
iptables -A LSNODE-FORWARD ! -o "$BRIDGE" -j REJECT

# CNI: bridge + host-local, no gateway role (the bridge plugin would switch on
# ip_forward), no masquerade, and only two routes: the pod subnet (on the
# link) and the service range through the bridge address (DNATed above).
cat > "$NODE/cni/net.d/10-lockstep.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "lockstep-pods",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": false, "ipMasq": false,
      "ipam": {
        "type": "host-local", "dataDir": "$NODE/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GATEWAY"}]],
        "routes": [{"dst": "$SERVICE_CIDR", "gw": "$GATEWAY"}]
      }
    }
  ]
}
EOF

# ---- containerd --------------------------------------------------------------
CTRD="$NODE/containerd"
SOCK="$CTRD/containerd.sock"
mkdir -p "$CTRD/certs.d/_default"
# Every pull goes to a mirror that is not there: a missing image fails at
# once instead of sending a DNS query or a connection off the machine.
cat > "$CTRD/certs.d/_default/hosts.toml" <<'EOF'
server = "http://127.0.0.1:1"
EOF
cat > "$CTRD/config.toml" <<EOF
# Generated by deploy/local/kube/node-up.sh.
version = 3
root = "$CTRD/root"
state = "$CTRD/state"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$CTRD/opt"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "$CTRD/certs.d"
[plugins."io.containerd.cri.v1.runtime"]
  # root here lacks CAP_SYS_RESOURCE: runc cannot give a sandbox the
  # oom_score_adj -998 the kubelet asks for, and every sandbox would fail.
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$BIN/runc"
        Root = "$CTRD/runc"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$NODE/cni/net.d"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
EOF
ctr_ok() { "$BIN/ctr" --address "$SOCK" version >/dev/null 2>&1; }
if alive containerd; then
  log "containerd already running (pid $(<"$RUN/containerd.pid"))"
else
  log "starting containerd $("$BIN/containerd" --version | awk '{print $3}') ($SOCK)"
  # The v2 shim first on PATH: containerd starts the shim it finds there.
  PATH="$BIN:$PATH" start containerd "$BIN/containerd" --config "$CTRD/config.toml"
fi
wait_for containerd ctr_ok
CTR=("$BIN/ctr" --address "$SOCK" -n k8s.io)

# ---- the sandbox (pause) image: Kubernetes' own pause.c, built here ---------
if ! grep -qx "$PAUSE_IMAGE" <<< "$("${CTR[@]}" images ls -q 2>/dev/null)"; then
  IMG_CACHE="${LOCKSTEP_CACHE_DIR:-$HOME/.cache/lockstep}/images"
  mkdir -p "$IMG_CACHE"
  if [[ ! -s $IMG_CACHE/pause-3.10.oci.tar ]]; then
    moddir=$(cd "$here/build" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
    src="$moddir/build/pause/linux/pause.c"
    [[ -f $src ]] || die "no $src in the module cache"
    tmp=$(mktemp -d)
    mkdir -p "$tmp/root"
    gcc -Os -Wall -Werror -static -DVERSION=v3.10-lockstep -o "$tmp/root/pause" "$src"
    strip "$tmp/root/pause"
    python3 "$repo/deploy/images/mkoci.py" "$IMG_CACHE/pause-3.10.oci.tar.tmp" "$PAUSE_IMAGE" \
      --layer "$tmp/root" --entrypoint '["/pause"]' --user 65535:65535 >/dev/null
    mv -f "$IMG_CACHE/pause-3.10.oci.tar.tmp" "$IMG_CACHE/pause-3.10.oci.tar"
    rm -rf "$tmp"
  fi
  # (ctr warns about cgroup v1 on every run: shown only when the import fails)
  "${CTR[@]}" images import "$IMG_CACHE/pause-3.10.oci.tar" >/dev/null 2>"$NODE/ctr.err" ||
    { cat "$NODE/ctr.err" >&2; die "importing the pause image failed"; }
  log "imported $PAUSE_IMAGE"
fi

# ---- controller-manager and scheduler ----------------------------------------
if alive kube-controller-manager; then
  log "kube-controller-manager already running"
else
  log "starting kube-controller-manager"
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$KC" --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --leader-elect=false \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/serving.crt" \
    --use-service-account-credentials=false --controllers='*' \
    --node-monitor-grace-period="$MONITOR_GRACE" --feature-gates="$FEATURE_GATES" --v=1
fi
if alive kube-scheduler; then
  log "kube-scheduler already running"
else
  log "starting kube-scheduler"
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$KC" --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
    --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" --leader-elect=false \
    --feature-gates="$FEATURE_GATES" --v=1
fi

# ---- kubelet -----------------------------------------------------------------
# Pods resolve nothing through the host's resolver (it may forward off the
# machine): an empty resolv.conf.
: > "$NODE/resolv.conf"
cat > "$NODE/kubelet/config.yaml" <<EOF
# Generated by deploy/local/kube/node-up.sh.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
failCgroupV1: false            # this machine has cgroup v1 only
featureGates: {NodeLifecycleConditions: true}
failSwapOn: false
address: $GATEWAY
port: $KUBELET_PORT
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
readOnlyPort: 0
# Test only: the API server has no kubelet client certificate.
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
resolvConf: $NODE/resolv.conf
podLogsDir: $NODE/pod-logs
# Absolute, not a share of the disk: 1% of a 250 GB disk is 2.5 GB, which a
# machine that builds the suite cold may well have left, and the node then
# evicts and taints (DiskPressure) what the tests run.
evictionHard: {memory.available: "100Mi", nodefs.available: "256Mi", imagefs.available: "256Mi", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 60
serializeImagePulls: false
# Faster than the defaults, so that tests need not wait minutes: a ConfigMap
# change reaches a pod's volume within ~10 s, a stopped kubelet is noticed by
# the controller-manager after LOCKSTEP_NODE_MONITOR_GRACE.
syncFrequency: 10s
nodeStatusUpdateFrequency: 4s
EOF
healthz_ok() { [[ $(curl -sS -m 2 "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz" 2>/dev/null) == ok ]]; }
if alive kubelet; then
  log "kubelet already running (pid $(<"$RUN/kubelet.pid"))"
else
  log "starting kubelet (node $NODE_NAME, $GATEWAY:$KUBELET_PORT)"
  start kubelet "$BIN/kubelet" --config="$NODE/kubelet/config.yaml" --kubeconfig="$KC" \
    --root-dir="$NODE/kubelet/root" --cert-dir="$NODE/kubelet/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$GATEWAY" \
    --node-labels="lockstep.io/local-node=true" --v=1
fi
wait_for kubelet healthz_ok
node_ready() {
  [[ $("$BIN/kubectl" --kubeconfig "$KC" get node "$NODE_NAME" \
        -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
wait_for node node_ready
# Pods need the namespace's default ServiceAccount (made by the controller-manager).
sa_ok() { "$BIN/kubectl" --kubeconfig "$KC" get sa default -n default >/dev/null 2>&1; }
wait_for node sa_ok

cat > "$NODE/env.sh.tmp" <<EOF
# Generated by deploy/local/kube/node-up.sh; source it.
. '$KUBE/env.sh'
export LOCKSTEP_NODE_NAME='$NODE_NAME'
export LOCKSTEP_NODE_CRI='$SOCK'
export LOCKSTEP_NODE_GATEWAY='$GATEWAY'
export LOCKSTEP_NODE_SERVICE_IP='$SERVICE_IP'
export LOCKSTEP_NODE_STATE='$NODE'
EOF
mv -f "$NODE/env.sh.tmp" "$NODE/env.sh"
log "node $NODE_NAME Ready (kubelet $(<"$RUN/kubelet.pid"), containerd $(<"$RUN/containerd.pid")); pods reach the API server at $SERVICE_IP:443${HOST_PORTS[*]:+ and host ports ${HOST_PORTS[*]} at $GATEWAY}"
log "use: source $NODE/env.sh   # then: kubectl get nodes; ctr --address \$LOCKSTEP_NODE_CRI -n k8s.io images ls"
