#!/usr/bin/env bash
# Builds kube-apiserver, kubectl and etcd from source (Go module proxy only) into
#   ${LOCKSTEP_CACHE_DIR:-$HOME/.cache/lockstep}/kube/<k8s version>/bin
# and skips every tool whose binary is there with a stamp matching the pin in
# deploy/local/kube/build/go.{mod,sum}.  See README.md beside this file.
#
#   build.sh            build what is missing or stale
#   build.sh --force    rebuild all three
#   build.sh --print-bin-dir   print the bin dir and exit (builds nothing)
#
# Env: LOCKSTEP_CACHE_DIR, LOCKSTEP_KUBE_BUILD_P (go build -p, default 2),
#      LOCKSTEP_KUBE_NICE (nice level, default 10).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
moddir="$here/build"
force=0
print_only=0
for arg in "$@"; do
  case $arg in
    --force) force=1 ;;
    --print-bin-dir) print_only=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

# Versions come from the checked-in go.mod (no Go needed to read them).
modver() { awk -v m="$1" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$moddir/go.mod"; }
K8S_VERSION=$(modver k8s.io/kubernetes)
ETCD_VERSION=$(modver go.etcd.io/etcd/server/v3)
[[ -n $K8S_VERSION && -n $ETCD_VERSION ]] || { echo "build.sh: cannot read versions from $moddir/go.mod" >&2; exit 1; }

CACHE_ROOT=${LOCKSTEP_CACHE_DIR:-$HOME/.cache/lockstep}
BIN_DIR="$CACHE_ROOT/kube/$K8S_VERSION/bin"
if (( print_only )); then echo "$BIN_DIR"; exit 0; fi

log() { printf '[kube-build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

mkdir -p "$BIN_DIR"
# One build at a time per cache (a concurrent up.sh waits here instead of building twice).
exec 9>"$BIN_DIR/.build.lock"
if ! flock -n 9; then
  log "another build holds $BIN_DIR/.build.lock; waiting"
  flock 9
fi

pin_hash=$(cat "$moddir/go.mod" "$moddir/go.sum" | sha256sum | cut -c1-16)

# tool -> package, module version
declare -A PKG=(
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
  [etcd]=go.etcd.io/etcd/server/v3
)
declare -A VER=(
  [kube-apiserver]=$K8S_VERSION
  [kubectl]=$K8S_VERSION
  [etcd]=$ETCD_VERSION
)
stamp_of() { echo "tool=$1 version=${VER[$1]} pin=$pin_hash"; }

todo=()
for tool in kube-apiserver kubectl etcd; do
  stamp="$BIN_DIR/.$tool.stamp"
  if (( !force )) && [[ -x $BIN_DIR/$tool && -f $stamp ]] && [[ $(head -n1 "$stamp") == "$(stamp_of "$tool")" ]]; then
    log "$tool ${VER[$tool]}: cached ($BIN_DIR/$tool)"
  else
    todo+=("$tool")
  fi
done
if (( ${#todo[@]} == 0 )); then
  exit 0
fi

command -v go >/dev/null || { echo "build.sh: go not found on PATH (needed to build ${todo[*]})" >&2; exit 1; }
log "Go: $(go version)"
log "building ${todo[*]} (k8s.io/kubernetes $K8S_VERSION, etcd $ETCD_VERSION) into $BIN_DIR"

P=${LOCKSTEP_KUBE_BUILD_P:-2}
NICE=${LOCKSTEP_KUBE_NICE:-10}
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
k8s_mm=${K8S_VERSION#v}; k8s_major=${k8s_mm%%.*}; k8s_minor=${k8s_mm#*.}; k8s_minor=${k8s_minor%%.*}
# Same version variables hack/lib/version.sh sets, so /version and
# `kubectl version` report the release instead of v0.0.0-master+$Format:%H$.
k8s_ldflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$k8s_major -X $p.gitMinor=$k8s_minor"
  k8s_ldflags+=" -X $p.gitCommit=module-$K8S_VERSION -X $p.gitTreeState=clean -X $p.buildDate=$build_date"
done

cd "$moddir"
t_all=$(date +%s)
log "go mod download (module proxy)"
nice -n "$NICE" go mod download
for tool in "${todo[@]}"; do
  t0=$(date +%s)
  ldflags="-s -w"
  [[ $tool != etcd ]] && ldflags+="$k8s_ldflags"
  log "go build ${PKG[$tool]} (-p $P, nice $NICE)"
  tmp="$BIN_DIR/.$tool.tmp.$$"
  rm -f "$tmp"
  if ! nice -n "$NICE" go build -p "$P" -trimpath -ldflags "$ldflags" -o "$tmp" "${PKG[$tool]}"; then
    rm -f "$tmp"
    echo "build.sh: go build ${PKG[$tool]} failed" >&2
    exit 1
  fi
  mv -f "$tmp" "$BIN_DIR/$tool"
  { stamp_of "$tool"; echo "go=$(go env GOVERSION) built=$build_date"; } > "$BIN_DIR/.$tool.stamp"
  log "$tool ${VER[$tool]}: built in $(( $(date +%s) - t0 ))s, $(du -h "$BIN_DIR/$tool" | cut -f1)"
done
log "done in $(( $(date +%s) - t_all ))s"
