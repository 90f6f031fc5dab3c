#!/usr/bin/env bash
# Start a real, self-contained local Slurm on loopback: munged, slurmctld, N
# slurmd (one host, `slurmd -N`), slurmrestd with JWT auth. Which Slurm:
# LOCKSTEP_SLURM_VERSION=22.05 (default: the machine's own Debian 12
# packages), 24.11 (Debian 13) or 26.05 (Debian unstable); the newer two run
# from a cached Debian root (root.sh) with chroot. Everything lives under one
# state dir per version; nothing in /etc is used or changed.
# Safe to run twice: running daemons are left alone, only the token is refreshed.
# See README.md beside this file.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# One up.sh or down.sh per state dir at a time (tests start it from several
# processes at once): re-run this script under flock. `-o` keeps the lock's
# descriptor away from the daemons started below, so it is released when
# this script exits, not when they do.
if [[ "${LOCKSTEP_SLURM_LOCKED:-}" != "$STATE" ]]; then
  mkdir -p "$STATE"
  exec env LOCKSTEP_SLURM_LOCKED="$STATE" \
    flock -o -w "${LOCKSTEP_SLURM_LOCK_WAIT:-900}" "$STATE/.lock" "$0" "$@"
fi

NODES_SPEC="${LOCKSTEP_SLURM_NODES:-4}"
# Start slurmd for the first N nodes only (default: all). The others stay in
# slurm.conf without a daemon (UNKNOWN, then DOWN): enough for scale tests.
SLURMD_MAX="${LOCKSTEP_SLURMD_MAX:-}"
CLUSTER="${LOCKSTEP_SLURM_CLUSTER:-lockstep}"
CTLD_PORT="${LOCKSTEP_SLURMCTLD_PORT:-$V_CTLD}"
SLURMD_PORT_BASE="${LOCKSTEP_SLURMD_PORT_BASE:-$V_SLURMD}" # node i listens on base+i
REST_HOST="${LOCKSTEP_SLURMRESTD_HOST:-127.0.0.1}"
REST_PORT="${LOCKSTEP_SLURMRESTD_PORT:-$V_REST}"
REST_USER="${LOCKSTEP_SLURMRESTD_USER:-lockstep-rest}"
TOKEN_USER="${LOCKSTEP_SLURM_TOKEN_USER:-root}"
TOKEN_LIFESPAN="${LOCKSTEP_SLURM_TOKEN_LIFESPAN:-86400}"
NODE_MEM="${LOCKSTEP_SLURM_NODE_MEM:-1024}" # RealMemory (MB) per node, capped below
SLURMD_TIMEOUT="${LOCKSTEP_SLURMD_TIMEOUT:-30}"
WAIT="${LOCKSTEP_SLURM_WAIT:-60}" # seconds for each readiness wait
# 26.05 only: the cluster-default topology in topology.yaml (block, tree or
# flat); the other kinds are defined beside it.
TOPOLOGY="${LOCKSTEP_SLURM_TOPOLOGY:-block}"

# A SLURM_JWT in the environment makes every Slurm program (slurmd too) use
# auth/jwt instead of munge; a slurmd started that way cannot read slurmctld's
# pings ("authentication plugin auth/munge(101) not found") and goes DOWN.
unset SLURM_JWT

log() { printf 'slurm-up: %s\n' "$*" >&2; }
die() { printf 'slurm-up: ERROR: %s\n' "$*" >&2; exit 1; }

# Print the tail of a log file (to stderr) and fail.
die_log() {
  local msg="$1" file="$2"
  printf 'slurm-up: ERROR: %s\n' "$msg" >&2
  if [[ -f "$file" ]]; then
    printf -- '--- last lines of %s ---\n' "$file" >&2
    tail -n 30 "$file" >&2 || true
  fi
  exit 1
}

[[ "$(id -u)" -eq 0 ]] || die "must run as root (daemons run as root, slurmrestd as $REST_USER)"

# ---------------------------------------------------------------- packages
ensure_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing ${missing[*]}"
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
  # The Debian packages enable system units; policy-rc.d or systemd may have
  # started them against /etc/slurm. We never use those, and do not stop them.
}
export DEBIAN_FRONTEND=noninteractive

# IN runs a Slurm or munge program of this version: directly for 22.05,
# inside the version's Debian root otherwise.
ROOT=""
IN=()
if [[ "$SLURM_VERSION" == 22.05 ]]; then
  ensure_packages slurm-wlm slurmrestd slurm-wlm-jwt-plugin munge curl
else
  ensure_packages curl util-linux
  ROOT="$("$SLURM_HERE/root.sh" "$SLURM_VERSION")" || die "no Debian root for Slurm $SLURM_VERSION"
  # A clean PATH inside: the caller's may start with this state dir's
  # wrappers (bin/ below), which the bind mount makes visible in the root.
  IN=(chroot "$ROOT" /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin)
fi
printf '%s\n' "$SLURM_VERSION" >"$STATE/version"
printf '%s\n' "$ROOT" >"$STATE/root"
in_root() { "${IN[@]}" "$@"; }

# ---------------------------------------------------------------- nodes
NODES=()
if [[ "$NODES_SPEC" =~ ^[0-9]+$ ]]; then
  ((NODES_SPEC >= 1)) || die "LOCKSTEP_SLURM_NODES must be >= 1"
  for ((i = 1; i <= NODES_SPEC; i++)); do NODES+=("ls-n$i"); done
else
  read -r -a NODES <<<"${NODES_SPEC//,/ }"
fi
((${#NODES[@]} >= 1)) || die "no nodes in LOCKSTEP_SLURM_NODES=$NODES_SPEC"

# Runs of consecutive names (ls-n1 ls-n2 ls-n3 -> ls-n[1-3]): one line each,
# "<hostlist> <count>", in the order given.
runs() {
  local prefix="" first="" last="" n
  for n in "$@" ""; do
    if [[ -n "$prefix" && "$n" =~ ^(.*[^0-9])([1-9][0-9]*)$ && "${BASH_REMATCH[1]}" == "$prefix" ]] &&
      ((BASH_REMATCH[2] == last + 1)); then
      last=${BASH_REMATCH[2]}
      continue
    fi
    if [[ -n "$first" ]]; then
      if [[ "$first" == "$last" || -z "$prefix" ]]; then
        echo "$prefix$first 1"
      else
        echo "$prefix[$first-$last] $((last - first + 1))"
      fi
    fi
    if [[ "$n" =~ ^(.*[^0-9])([1-9][0-9]*)$ ]]; then
      prefix=${BASH_REMATCH[1]} first=${BASH_REMATCH[2]} last=${BASH_REMATCH[2]}
    else
      prefix="" first=$n last=""
    fi
  done
}

# The names as one Slurm hostlist expression (ls-n[1-3],other).
hostlist() { runs "$@" | cut -d' ' -f1 | paste -sd,; }
if [[ -n "$SLURMD_MAX" ]]; then
  [[ "$SLURMD_MAX" =~ ^[0-9]+$ ]] || die "LOCKSTEP_SLURMD_MAX must be a count"
  SLURMD_NODES=("${NODES[@]:0:SLURMD_MAX}")
else
  SLURMD_NODES=("${NODES[@]}")
fi

# ---------------------------------------------------------------- layout
CONF="$STATE/slurm.conf"
RUN="$STATE/run"
LOGD="$STATE/log"
MUNGE_DIR="$STATE/munge"
MUNGE_SOCKET="$MUNGE_DIR/munge.socket"
MUNGE_KEY="$MUNGE_DIR/munge.key"
JWT_KEY="$STATE/jwt/jwt_hs256.key"
TOKEN_FILE="$STATE/token"
ENV_FILE="$STATE/env.sh"
REST_URL="http://$REST_HOST:$REST_PORT"
export SLURM_CONF="$CONF"

mkdir -p "$STATE" "$RUN" "$LOGD" "$STATE/ctld" "$STATE/spool" "$STATE/jobs" "$STATE/jwt"
# slurmrestd runs as $REST_USER and must be able to read slurm.conf.
chmod 0755 "$STATE"
mkdir -p "$MUNGE_DIR"
chmod 0700 "$MUNGE_DIR" "$STATE/jwt" "$STATE/ctld"

# ---------------------------------------------------------------- root
# The newer versions run in their Debian root: proc, dev and sys mounted in
# it, this state dir bind-mounted at the same path, the host's /etc/hosts
# (without it every Slurm program fails: "getaddrinfo() failed"), and
# $REST_USER as a user of the root. down.sh undoes the mounts.
if [[ -n "$ROOT" ]]; then
  mount_root "$ROOT" "$STATE" || die "cannot mount proc, dev, sys and $STATE in $ROOT"
  cmp -s /etc/hosts "$ROOT/etc/hosts" || cp /etc/hosts "$ROOT/etc/hosts"
fi

# Wrappers that run this cluster's client programs (the right version, the
# right SLURM_CONF, never SLURM_JWT) from the caller's directory: for tests,
# record-fixtures.sh and people. env.sh names the directory.
# They name programs by absolute path: PATH may hold this very directory.
mkdir -p "$STATE/bin"
for prog in scontrol sinfo squeue sbatch scancel srun sdiag; do
  if [[ -n "$ROOT" ]]; then
    run_line="exec chroot $ROOT /bin/sh -c 'cd \"\$0\" 2>/dev/null || cd /; exec /usr/bin/$prog \"\$@\"' \"\$PWD\" \"\$@\""
  else
    path="$(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin command -v "$prog")" ||
      die "$prog is not installed"
    run_line="exec $path \"\$@\""
  fi
  printf '#!/bin/sh\n# Generated by deploy/local/slurm/up.sh: Slurm %s %s of %s.\nunset SLURM_JWT\nexport SLURM_CONF=%s\n%s\n' \
    "$SLURM_VERSION" "$prog" "$STATE" "$CONF" "$run_line" >"$STATE/bin/$prog.tmp"
  chmod 0755 "$STATE/bin/$prog.tmp"
  mv -f "$STATE/bin/$prog.tmp" "$STATE/bin/$prog"
done

# Is the process in pid file $1 alive and running program $2?
pid_alive() {
  local pidfile="$1" prog="$2" pid
  [[ -s "$pidfile" ]] || return 1
  pid="$(tr -dc '0-9' <"$pidfile")"
  [[ -n "$pid" ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  is_daemon "$pid" "$prog"
}

# Poll command "$@" once a second until it succeeds or $WAIT seconds pass.
wait_for() {
  local t=0
  until "$@" >/dev/null 2>&1; do
    ((t++ >= WAIT)) && return 1
    sleep 1
  done
}

# ---------------------------------------------------------------- munge
if [[ ! -s "$MUNGE_KEY" ]]; then
  log "generating munge key"
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile="$MUNGE_KEY" --force >/dev/null
  else
    dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
  fi
fi
chmod 0600 "$MUNGE_KEY"

if pid_alive "$RUN/munged.pid" munged; then
  log "munged already running"
else
  log "starting munged"
  in_root munged --force --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" \
    --pid-file="$RUN/munged.pid" --log-file="$LOGD/munged.log" \
    --seed-file="$MUNGE_DIR/munged.seed" >>"$LOGD/munged.log" 2>&1 ||
    die_log "munged failed to start" "$LOGD/munged.log"
fi
munge_ok() { in_root munge -n -S "$MUNGE_SOCKET" | in_root unmunge -S "$MUNGE_SOCKET"; }
wait_for munge_ok || die_log "munged not answering on $MUNGE_SOCKET" "$LOGD/munged.log"

# ---------------------------------------------------------------- jwt key
if [[ ! -s "$JWT_KEY" ]]; then
  log "generating jwt key"
  dd if=/dev/urandom of="$JWT_KEY" bs=32 count=1 status=none
fi
chmod 0600 "$JWT_KEY"

# ---------------------------------------------------------------- slurm.conf
# Node hardware: from `slurmd -C`, CPUs as found, memory small.
hw="$(in_root slurmd -C 2>/dev/null | sed -n 1p)"
hwval() { sed -n "s/.*[[:space:]]$1=\([0-9]*\).*/\1/p" <<<"$hw"; }
CPUS="$(hwval CPUs)"
BOARDS="$(hwval Boards)"
SOCKETS="$(hwval SocketsPerBoard)"
CORES="$(hwval CoresPerSocket)"
THREADS="$(hwval ThreadsPerCore)"
MEM="$(hwval RealMemory)"
[[ -n "$CPUS" && -n "$MEM" ]] || die "cannot parse 'slurmd -C' output: $hw"
max_mem=$((MEM / ${#NODES[@]}))
((NODE_MEM > max_mem)) && NODE_MEM="$max_mem"
HOST="$(hostname -s)"

new_conf="$(mktemp)"
trap 'rm -f "$new_conf"' EXIT
{
  cat <<EOF
# Generated by deploy/local/slurm/up.sh -- edits are overwritten.
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT_BASE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGD/slurmctld.log
SlurmdLogFile=$LOGD/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
SlurmdTimeout=$SLURMD_TIMEOUT
SlurmctldTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=300
MailProg=/bin/true
EOF
  # One line per run of consecutive names, as sites write it: every Slurm
  # program parses slurm.conf when it starts, and 10,000 lines of one node
  # each cost every scontrol call about 0.4 s here.
  start=0
  while IFS=' ' read -r names count; do
    if ((count == 1)); then
      ports=$((SLURMD_PORT_BASE + start + 1))
    else
      ports="[$((SLURMD_PORT_BASE + start + 1))-$((SLURMD_PORT_BASE + start + count))]"
    fi
    start=$((start + count))
    printf 'NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%s CPUs=%s Boards=%s SocketsPerBoard=%s CoresPerSocket=%s ThreadsPerCore=%s RealMemory=%d State=UNKNOWN\n' \
      "$names" "$names" "$ports" "$CPUS" "${BOARDS:-1}" "${SOCKETS:-1}" \
      "${CORES:-$CPUS}" "${THREADS:-1}" "$NODE_MEM"
  done < <(runs "${NODES[@]}")
  echo "PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  if [[ "$SLURM_VERSION" == 26.05 ]]; then
    # topology.yaml (below) defines the topologies; this names the plugin
    # of the cluster default for tools that read slurm.conf alone.
    echo "TopologyPlugin=topology/$TOPOLOGY"
  fi
} >"$new_conf"

# Files beside slurm.conf: (name, content).
extra_files=()
if [[ "$SLURM_VERSION" != 22.05 ]]; then
  # No cgroup hierarchy of its own in the root: without this slurmd dies with
  # "No filesystem mounted on /sys/fs/cgroup".
  extra_files+=(cgroup.conf "CgroupPlugin=disabled")
fi
if [[ "$SLURM_VERSION" == 26.05 ]]; then
  # Three topologies (26.05 reads several from topology.yaml): `default`, a
  # block topology (first half of the nodes in block b1, the rest in b2,
  # and an empty block named as the NVIDIA GPU operator names an NVLink
  # domain, `<cluster uuid>.<clique id>`, for the gpu.clique preset), `tree`
  # (leaf switches s1, s2 under sw_root) and `flat`. Nodes move between
  # units at run time with `scontrol update nodename=N topology=default:b2`
  # or REST `topology_str`; a block must be declared here first (Slurm
  # answers "Requested topology configuration is not available"), a switch
  # is created on demand.
  half=$(((${#NODES[@]} + 1) / 2))
  first="$(hostlist "${NODES[@]:0:half}")"
  rest="$(hostlist "${NODES[@]:half}")"
  case "$TOPOLOGY" in
  block) d_block=true d_tree=false d_flat=false ;;
  tree) d_block=false d_tree=true d_flat=false ;;
  flat) d_block=false d_tree=false d_flat=true ;;
  *) die "LOCKSTEP_SLURM_TOPOLOGY=$TOPOLOGY: use block, tree or flat" ;;
  esac
  yaml="# Generated by deploy/local/slurm/up.sh -- edits are overwritten.
- topology: default
  cluster_default: $d_block
  block:
    blocks:
      - block: b1
        nodes: $first"
  [[ -n "$rest" ]] && yaml+="
      - block: b2
        nodes: $rest"
  yaml+="
      - block: 7f3c9a2e-5b1d-4c8e-9f60-1a2b3c4d5e6f.1
- topology: tree
  cluster_default: $d_tree
  tree:
    switches:
      - switch: sw_root
        children: s[1-2]
      - switch: s1
        nodes: $first"
  [[ -n "$rest" ]] && yaml+="
      - switch: s2
        nodes: $rest"
  yaml+="
- topology: flat
  cluster_default: $d_flat
  flat: true"
  extra_files+=(topology.yaml "$yaml")
fi

conf_changed=0
[[ -f "$CONF" ]] && cmp -s "$new_conf" "$CONF" || conf_changed=1
for ((i = 0; i < ${#extra_files[@]}; i += 2)); do
  [[ -f "$STATE/${extra_files[i]}" ]] &&
    [[ "$(cat "$STATE/${extra_files[i]}")" == "${extra_files[i + 1]}" ]] || conf_changed=1
done
if ((conf_changed)); then
  if pid_alive "$RUN/slurmctld.pid" slurmctld; then
    die "slurm.conf would change (nodes/ports/env differ) while slurmctld runs; run down.sh first"
  fi
  log "writing $CONF"
  install -m 0644 "$new_conf" "$CONF"
  for ((i = 0; i < ${#extra_files[@]}; i += 2)); do
    printf '%s\n' "${extra_files[i + 1]}" >"$STATE/${extra_files[i]}"
    chmod 0644 "$STATE/${extra_files[i]}"
  done
fi

# ---------------------------------------------------------------- slurmctld
ctld_up() { in_root scontrol ping | grep -q 'is UP'; }
if pid_alive "$RUN/slurmctld.pid" slurmctld; then
  log "slurmctld already running"
else
  log "starting slurmctld (port $CTLD_PORT)"
  in_root slurmctld -f "$CONF" >>"$LOGD/slurmctld.stderr" 2>&1 ||
    die_log "slurmctld failed to start" "$LOGD/slurmctld.log"
fi
wait_for ctld_up || die_log "slurmctld not answering 'scontrol ping' after ${WAIT}s" "$LOGD/slurmctld.log"

# ---------------------------------------------------------------- slurmd
for n in "${SLURMD_NODES[@]}"; do
  mkdir -p "$STATE/spool/$n"
  if pid_alive "$RUN/slurmd-$n.pid" slurmd; then
    log "slurmd $n already running"
    continue
  fi
  log "starting slurmd $n"
  in_root slurmd -f "$CONF" -N "$n" >>"$LOGD/slurmd-$n.stderr" 2>&1 ||
    die_log "slurmd $n failed to start" "$LOGD/slurmd-$n.log"
done

# All our nodes registered: none left in state UNKNOWN or NOT_RESPONDING.
# (Only the nodes that have a slurmd, see LOCKSTEP_SLURMD_MAX.)
if ((${#SLURMD_NODES[@]} == ${#NODES[@]})); then
  SINFO_SEL=(-p batch)
else
  SINFO_SEL=(-n "$(IFS=,; echo "${SLURMD_NODES[*]}")")
fi
nodes_registered() {
  local out
  out="$(in_root sinfo -h -N "${SINFO_SEL[@]}" -o '%N %T')" || return 1
  [[ -n "$out" ]] || return 1
  ! grep -qiE 'unk|not_responding|\*$' <<<"$out"
}
if ((${#SLURMD_NODES[@]} > 0)) && ! wait_for nodes_registered; then
  in_root sinfo -N "${SINFO_SEL[@]}" -o '%N %T %E' >&2 || true
  die_log "slurmd nodes did not register after ${WAIT}s" "$LOGD/slurmd-${SLURMD_NODES[0]}.log"
fi

# ---------------------------------------------------------------- token
write_token() {
  local out tok
  out="$(in_root scontrol token username="$TOKEN_USER" lifespan="$TOKEN_LIFESPAN")" ||
    die_log "scontrol token failed" "$LOGD/slurmctld.log"
  tok="${out#SLURM_JWT=}"
  [[ -n "$tok" && "$tok" != "$out" ]] || die "unexpected 'scontrol token' output: $out"
  umask 077
  printf '%s\n' "$tok" >"$TOKEN_FILE.tmp"
  mv -f "$TOKEN_FILE.tmp" "$TOKEN_FILE"
  umask 022
  JWT="$tok"
}
write_token

# ---------------------------------------------------------------- slurmrestd
if ! in_root id "$REST_USER" >/dev/null 2>&1; then
  log "creating user $REST_USER${ROOT:+ in $ROOT}"
  in_root useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$REST_USER"
fi

in_root setpriv --reuid="$REST_USER" --regid="$REST_USER" --init-groups test -r "$CONF" ||
  die "$REST_USER cannot read $CONF: make every parent of $STATE world-searchable (o+x)"

# The openapi versions the installed slurmrestd offers. 22.05: one plugin
# per version, openapi/v0.0.36..v0.0.38; the openapi/dbvX ones need slurmdbd
# and make slurmrestd exit with "fatal: slurm_openapi_p_init: slurm not
# configured with slurmdbd", so -s names the others. 23.02+: the versions are
# data_parser plugins (24.11: v0.0.40..v0.0.42, 26.05: v0.0.42..v0.0.45)
# behind one openapi/slurmctld plugin; 24.11 without `-s openapi/slurmctld`
# exits at once ("Failure loading plugin path bindings": there is no slurmdbd).
LIBS=("$ROOT"/usr/lib/*/slurm-wlm "$ROOT"/usr/lib/slurm "$ROOT"/usr/lib64/slurm)
if [[ "$SLURM_VERSION" == 22.05 ]]; then
  pattern='openapi_v0_0_*.so'
else
  pattern='data_parser_v0_0_*.so'
fi
OPENAPI_VERSIONS="$(
  { find "${LIBS[@]}" -maxdepth 1 -name "$pattern" 2>/dev/null || true; } |
    sed 's/.*_\(v0_0_[0-9]*\)\.so/\1/; s/_/./g' | sort -t. -k3,3n | tr '\n' ' '
)"
read -r -a OPENAPI_LIST <<<"$OPENAPI_VERSIONS"
((${#OPENAPI_LIST[@]} > 0)) || die "no $pattern plugin found (is slurmrestd installed?)"
OPENAPI_VERSION="${OPENAPI_LIST[-1]}" # highest
if [[ "$SLURM_VERSION" == 22.05 ]]; then
  REST_PLUGINS="${LOCKSTEP_SLURMRESTD_PLUGINS:-$(printf 'openapi/%s,' "${OPENAPI_LIST[@]}")}"
else
  REST_PLUGINS="${LOCKSTEP_SLURMRESTD_PLUGINS:-openapi/slurmctld}"
fi
REST_PLUGINS="${REST_PLUGINS%,}"

rest_ok() {
  curl -sf -o /dev/null --max-time 5 \
    -H "X-SLURM-USER-NAME: $TOKEN_USER" -H "X-SLURM-USER-TOKEN: $JWT" \
    "$REST_URL/slurm/$OPENAPI_VERSION/ping"
}
if pid_alive "$RUN/slurmrestd.pid" slurmrestd; then
  log "slurmrestd already running"
else
  if curl -s -o /dev/null --max-time 2 "$REST_URL/"; then
    holder="$(ss -Hltnp "sport = :$REST_PORT" 2>/dev/null | grep -o 'users:.*' | head -1 || true)"
    die "something else already listens on $REST_HOST:$REST_PORT${holder:+ ($holder)} (set LOCKSTEP_SLURMRESTD_PORT)"
  fi
  log "starting slurmrestd on $REST_HOST:$REST_PORT as $REST_USER"
  # slurmrestd does not daemonize; SLURM_JWT=daemon makes auth/jwt start
  # without a token of its own (every request brings one).
  (
    cd /
    export SLURM_JWT=daemon
    exec setsid "${IN[@]}" setpriv --reuid="$REST_USER" --regid="$REST_USER" --init-groups \
      slurmrestd -f "$CONF" -a rest_auth/jwt -s "$REST_PLUGINS" "$REST_HOST:$REST_PORT" \
      </dev/null >>"$LOGD/slurmrestd.log" 2>&1
  ) &
  echo $! >"$RUN/slurmrestd.pid"
fi
wait_for rest_ok || die_log "slurmrestd not answering $REST_URL/slurm/$OPENAPI_VERSION/ping after ${WAIT}s" "$LOGD/slurmrestd.log"

# ---------------------------------------------------------------- env
cat >"$ENV_FILE" <<EOF
# Generated by deploy/local/slurm/up.sh; source it: . $ENV_FILE
# The JWT is in \$SLURM_JWT_FILE, deliberately not exported as SLURM_JWT: Slurm
# CLI commands switch to auth/jwt when SLURM_JWT is set (and then fail with
# "Zero Bytes were transmitted or received" once it is stale or from another
# state dir). For curl: -H "X-SLURM-USER-TOKEN: \$(cat \$SLURM_JWT_FILE)".
export SLURM_CONF=$CONF
export SLURMRESTD_URL=$REST_URL
export SLURMRESTD_OPENAPI_VERSION=$OPENAPI_VERSION
export SLURM_JWT_USER=$TOKEN_USER
export SLURM_JWT_FILE=$TOKEN_FILE
export LOCKSTEP_SLURM_VERSION=$SLURM_VERSION
export LOCKSTEP_SLURM_BIN=$STATE/bin
export LOCKSTEP_SLURM_ROOT=$ROOT
EOF
chmod 0600 "$ENV_FILE"

log "ready: Slurm $SLURM_VERSION, ${#NODES[@]} nodes (${#SLURMD_NODES[@]} with slurmd: ${SLURMD_NODES[*]:0:8}), partition batch, slurmrestd $REST_URL ($OPENAPI_VERSION)"
cat <<EOF
export SLURM_CONF=$CONF
export SLURMRESTD_URL=$REST_URL
export SLURMRESTD_OPENAPI_VERSION=$OPENAPI_VERSION
export SLURM_JWT_USER=$TOKEN_USER
export SLURM_JWT_FILE=$TOKEN_FILE
export LOCKSTEP_SLURM_VERSION=$SLURM_VERSION
export LOCKSTEP_SLURM_BIN=$STATE/bin
export LOCKSTEP_SLURM_ROOT=$ROOT
EOF
