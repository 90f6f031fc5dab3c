#!/usr/bin/env bash
# Stops the node node-up.sh started (kubelet, kube-scheduler,
# kube-controller-manager, containerd, every pod and container) and restores
# the host exactly as node-up.sh found it: sysctls, iptables/nftables, mounts,
# cgroups, network devices, the directories outside the state dir that the
# kubelet and containerd create.  Then stops the control plane (up.sh's).
# Works after a crash or a failed test too (every step runs even if an
# earlier one failed) and does nothing twice.  Exits 1 if anything is left.
#
#   deploy/local/kube/node-down.sh                       all of it; etcd data kept
#   deploy/local/kube/node-down.sh --keep-control-plane  leave etcd + kube-apiserver running
#   deploy/local/kube/node-down.sh --wipe                also etcd data, node state and logs
#                                                        (the image store is kept)
#   deploy/local/kube/node-down.sh --purge               also the image store
#
# Env: LOCKSTEP_STATE_DIR (/tmp/lockstep-node), LOCKSTEP_NODE_BRIDGE (lsnode0).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE_ROOT=${LOCKSTEP_STATE_DIR:-/tmp/lockstep-node}
export LOCKSTEP_STATE_DIR=$STATE_ROOT
NODE="$STATE_ROOT/node"
RUN="$NODE/run"
BRIDGE=${LOCKSTEP_NODE_BRIDGE:-lsnode0}
BEFORE="$NODE/host-before"
STOP_TIMEOUT=${LOCKSTEP_NODE_STOP_TIMEOUT:-20}

keep_cp=0 wipe=0 purge=0
for arg in "$@"; do
  case $arg in
    --keep-control-plane) keep_cp=1 ;;
    --wipe) wipe=1 ;;
    --purge) wipe=1 purge=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "node-down.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

log() { printf '[node-down %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
[[ $(id -u) -eq 0 ]] || { echo "node-down.sh: must run as root" >&2; exit 1; }

# The same lock as node-up.sh, for the whole run.
mkdir -p "$STATE_ROOT"
exec 9>"$STATE_ROOT/.node.lock"
flock -w 600 9 || { echo "node-down.sh: timed out waiting for $STATE_ROOT/.node.lock" >&2; exit 1; }
[[ -d $NODE ]] || log "no node state at $NODE"
BIN=$("$here/build.sh" --print-bin-dir)
SOCK="$NODE/containerd/containerd.sock"

# stop NAME: SIGTERM the pid in $RUN/NAME.pid if it is that program, SIGKILL after STOP_TIMEOUT s
stop() {
  local name=$1 pid t0
  pid=$(cat "$RUN/$name.pid" 2>/dev/null) || return 0
  if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "${name:0:15}" ]]; then
    log "$name: stopping pid $pid"
    kill -TERM "$pid" 2>/dev/null
    t0=$SECONDS
    while kill -0 "$pid" 2>/dev/null; do
      if (( SECONDS - t0 >= STOP_TIMEOUT )); then
        log "$name: still running after ${STOP_TIMEOUT}s, SIGKILL"
        kill -KILL "$pid" 2>/dev/null
        sleep 0.5
        break
      fi
      sleep 0.2
    done
  fi
  rm -f "$RUN/$name.pid"
}

# Pods outlive the kubelet and containerd: the kubelet goes first (it would
# start them again), then every sandbox is stopped and removed through the
# CRI while containerd still runs (CNI DEL, unmounts), then containerd.
stop kubelet
if [[ -S $SOCK ]] && "$BIN/ctr" --address "$SOCK" version >/dev/null 2>&1; then
  crictl=("$BIN/crictl" --runtime-endpoint "unix://$SOCK" --timeout 30s)
  n=$("${crictl[@]}" pods -q 2>/dev/null | wc -l)
  if (( n > 0 )); then
    log "removing $n pod sandboxes through the CRI"
    "${crictl[@]}" rmp -fa >/dev/null 2>&1 || log "crictl rmp -fa failed; containers are killed below"
  fi
fi
stop kube-scheduler
stop kube-controller-manager
stop containerd

# procs_of PROGRAM...: pids whose executable is one of our PROGRAMs in $BIN
procs_of() {
  local p exe name
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    for name in "$@"; do [[ $exe == "$BIN/$name" ]] && echo "${p#/proc/}"; done
  done
}

# Whatever still runs: shims of our containerd and the processes in the
# kubelet's cgroups (after a crash of containerd, or a SIGKILLed kubelet).
kill_leftovers() {
  local pids=()
  mapfile -t pids < <(procs_of containerd-shim-runc-v2 runc)
  for procs in /sys/fs/cgroup/*/kubepods/cgroup.procs /sys/fs/cgroup/*/kubepods/*/cgroup.procs \
               /sys/fs/cgroup/*/kubepods/*/*/cgroup.procs /sys/fs/cgroup/*/kubepods/*/*/*/cgroup.procs; do
    [[ -f $procs ]] && mapfile -t -O "${#pids[@]}" pids < "$procs"
  done
  (( ${#pids[@]} )) || return 1
  log "killing ${#pids[@]} leftover container or shim processes"
  kill -KILL "${pids[@]}" 2>/dev/null
  return 0
}
for _ in 1 2 3 4 5 6 7 8 9 10; do kill_leftovers || break; sleep 0.5; done

# Mounts: the kubelet's root (a bind onto itself) and volumes, containerd's
# overlays and shm, the network namespaces CNI pinned under /run/netns.
unmount_ours() {
  local m
  awk -v node="$NODE/" '{gsub(/\\040/, " ", $5); if (index($5, node) == 1 || $5 ~ /^\/run\/netns\/cni-/) print $5}' /proc/self/mountinfo |
    awk '{print length($0) " " $0}' | sort -rn | cut -d' ' -f2- | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
    done
}
unmount_ours; unmount_ours
rm -f /run/netns/cni-* 2>/dev/null

# Network: veths left on our bridge, the bridge (its route_localnet goes with it).
if ip link show "$BRIDGE" >/dev/null 2>&1; then
  for v in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
    ip link del "$v" 2>/dev/null
  done
  ip link del "$BRIDGE" && log "deleted bridge $BRIDGE"
fi

# iptables: our LSNODE-* chains, and the kubelet's KUBE-* chains that were
# not there before; then the nftables tables that iptables-nft created.
before_chains=$(cat "$BEFORE/iptables-chains" 2>/dev/null)
for ipt in iptables ip6tables; do
  command -v "$ipt" >/dev/null || continue
  for table in filter nat mangle; do
    chains=$("$ipt-save" -t "$table" 2>/dev/null | awk '/^:(KUBE|LSNODE)-/ {print substr($1, 2)}')
    for c in $chains; do
      grep -qx ":$c" <<< "$before_chains" && continue
      # Remove every jump to it first.
      "$ipt-save" -t "$table" 2>/dev/null | awk -v c="$c" '$1 == "-A" && / -j / { for (i = 1; i <= NF; i++) if ($i == "-j" && $(i+1) == c) print }' |
        while read -r rule; do
          # iptables-save quotes comments with double quotes: let the shell split it.
          eval "words=(${rule/#-A/-D})"
          "$ipt" -t "$table" "${words[@]}" 2>/dev/null
        done
      "$ipt" -t "$table" -F "$c" 2>/dev/null
    done
    for c in $chains; do
      grep -qx ":$c" <<< "$before_chains" && continue
      "$ipt" -t "$table" -X "$c" 2>/dev/null || log "cannot delete $ipt chain $table/$c"
    done
  done
done
if command -v nft >/dev/null && [[ -f $BEFORE/nft-tables ]]; then
  nft list tables 2>/dev/null | while read -r _ family name; do
    grep -qx "table $family $name" "$BEFORE/nft-tables" && continue
    # Only tables that hold nothing but empty base chains (what iptables-nft leaves).
    # (captured first: with pipefail, grep's early exit would fail nft with SIGPIPE)
    listing=$(nft list table "$family" "$name" 2>/dev/null) || continue
    if ! grep -vqE '^[[:space:]]*(table |chain |type |\}|$)' <<< "$listing"; then
      nft delete table "$family" "$name" 2>/dev/null
    fi
  done
fi

# cgroups the kubelet (kubepods) and containerd (k8s.io) made, deepest first.
for h in /sys/fs/cgroup/*/; do
  for top in kubepods kubepods.slice k8s.io; do
    d="$h$top"
    [[ -d $d ]] || continue
    grep -qx "$d" "$BEFORE/cgroups" 2>/dev/null && continue
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
done

# sysctls the kubelet changed (vm.overcommit_memory, kernel.panic, ...).
if [[ -f $BEFORE/sysctl ]]; then
  while IFS='=' read -r k v; do
    [[ -n $k ]] || continue
    [[ $(sysctl -n "$k" 2>/dev/null) == "$v" ]] || { sysctl -qw "$k=$v" && log "restored $k=$v"; }
  done < "$BEFORE/sysctl"
fi

# Directories outside the state dir that the kubelet, CNI and containerd
# create whatever their configuration says.
if [[ -f $BEFORE/paths ]]; then
  for d in /var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/containerd \
           /run/netns /run/nri /var/run/nri /opt/containerd /etc/cni /var/lib/containerd; do
    [[ -e $d ]] || continue
    grep -qx "$d" "$BEFORE/paths" && continue
    if grep -qF " $d/" /proc/self/mounts; then log "not removing $d: something is mounted below it"; continue; fi
    rm -rf -- "$d" && log "removed $d"
  done
fi

# ---- what is left? -------------------------------------------------------------
left=()
for p in $(procs_of kubelet kube-scheduler kube-controller-manager containerd containerd-shim-runc-v2); do
  left+=("process $p ($(cat "/proc/$p/comm" 2>/dev/null))")
done
grep -qE " ${NODE//./\\.}/| /run/netns/cni-" /proc/self/mountinfo && left+=("mounts under $NODE or /run/netns")
ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("bridge $BRIDGE")
for ipt in iptables ip6tables; do
  command -v "$ipt-save" >/dev/null || continue
  extra=$(comm -13 <(sort -u <<< "$before_chains") <("$ipt-save" 2>/dev/null | awk '/^:(KUBE|LSNODE)-/ {print $1}' | sort -u))
  [[ -n $extra ]] && left+=("$ipt chains $(echo $extra)")
done
for h in /sys/fs/cgroup/*/; do
  [[ -d ${h}kubepods ]] && ! grep -qx "${h}kubepods" "$BEFORE/cgroups" 2>/dev/null && left+=("cgroup ${h}kubepods")
done
if [[ -f $BEFORE/sysctl ]]; then
  while IFS='=' read -r k v; do
    [[ -n $k && $(sysctl -n "$k" 2>/dev/null) != "$v" ]] && left+=("sysctl $k")
  done < "$BEFORE/sysctl"
fi

if (( ${#left[@]} )); then
  log "NOT restored: ${left[*]}"
  status=1
else
  [[ -d $BEFORE ]] && rm -rf "$BEFORE"
  log "host restored"
  status=0
fi

# ---- control plane and state ---------------------------------------------------
if (( wipe )) && [[ -d $NODE ]]; then
  if grep -qF " $NODE/" /proc/self/mounts; then
    log "not wiping $NODE: mounts left below it"
  elif (( purge )); then
    rm -rf -- "$NODE" && log "wiped $NODE (with the image store)"
  else
    find "$NODE" -mindepth 1 -maxdepth 1 ! -name containerd -exec rm -rf {} +
    find "$NODE/containerd" -mindepth 1 -maxdepth 1 ! -name root -exec rm -rf {} + 2>/dev/null
    log "wiped $NODE (image store kept in $NODE/containerd/root)"
  fi
fi
if (( !keep_cp )); then
  if (( wipe )); then "$here/down.sh" --wipe; else "$here/down.sh"; fi || status=1
fi
exit $status
