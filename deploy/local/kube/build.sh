#!/usr/bin/env bash
# Builds the local Kubernetes from source (Go module proxy only) into
#   ${LOCKSTEP_CACHE_DIR:-$HOME/.cache/lockstep}/kube/<k8s version>/bin
# and skips every tool whose binary is there with a stamp that matches what
# would be built.  See README.md beside this file.
#
#   build.sh                  the control plane: kube-apiserver, kubectl, etcd (up.sh)
#   build.sh node             also the node: kubelet, kube-controller-manager,
#                             kube-scheduler, containerd (+ shim, ctr), runc, crictl (node-up.sh)
#   build.sh helm             helm
#   build.sh all              all of the above
#   build.sh --force [GROUP]  rebuild, even if cached
#   build.sh --print-bin-dir  print the bin dir and exit (builds nothing)
#
# The Kubernetes binaries come from the pin in build/go.{mod,sum} (one module
# graph, `go build`); containerd, runc, crictl and helm from their own
# modules at the versions below (`go install pkg@version`, their own go.sum).
# Builds are throttled for a shared 2-core machine: `go build -p 1` under
# `nice -n 15` by default.
#
# Go's build cache is build.sh's own (<cache>/kube/go-build, not `go env
# GOCACHE`): the control plane and the node share most packages, so it is kept
# between `build.sh` and `build.sh node helm`, and removed (3-5 GB) once every
# tool is built. The binaries do not need it.
#
# Env: LOCKSTEP_CACHE_DIR, LOCKSTEP_KUBE_BUILD_P (go build -p, default 1),
#      LOCKSTEP_KUBE_NICE (nice level, default 15).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
moddir="$here/build"

# Versions of what is not in the Kubernetes pin.  containerd v2 (not
# Debian's 1.6): kubelet 1.38 drops the fallback that lets it run on a
# containerd without the RuntimeConfig RPC.
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.3
CRICTL_VERSION=v1.37.0
HELM_VERSION=v3.22.0
HELM_K8S_MINOR=37          # helm v3.22.0 builds with k8s.io/client-go v0.37.x

force=0
print_only=0
groups=()
for arg in "$@"; do
  case $arg in
    --force) force=1 ;;
    --print-bin-dir) print_only=1 ;;
    control-plane|node|helm|all) groups+=("$arg") ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
(( ${#groups[@]} )) || groups=(control-plane)

# Versions come from the checked-in go.mod (no Go needed to read them).
modver() { awk -v m="$1" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$moddir/go.mod"; }
K8S_VERSION=$(modver k8s.io/kubernetes)
ETCD_VERSION=$(modver go.etcd.io/etcd/server/v3)
[[ -n $K8S_VERSION && -n $ETCD_VERSION ]] || { echo "build.sh: cannot read versions from $moddir/go.mod" >&2; exit 1; }

CACHE_ROOT=${LOCKSTEP_CACHE_DIR:-$HOME/.cache/lockstep}
BIN_DIR="$CACHE_ROOT/kube/$K8S_VERSION/bin"
if (( print_only )); then echo "$BIN_DIR"; exit 0; fi

log() { printf '[kube-build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

pin_hash=$(cat "$moddir/go.mod" "$moddir/go.sum" | sha256sum | cut -c1-16)

# tool -> how it is built: "pin <package>" (go build in the pin's module) or
# "install <package@version> [build tags]" (go install of its own module)
declare -A HOW=(
  [kube-apiserver]="pin k8s.io/kubernetes/cmd/kube-apiserver"
  [kubectl]="pin k8s.io/kubernetes/cmd/kubectl"
  [etcd]="pin go.etcd.io/etcd/server/v3"
  [kube-controller-manager]="pin k8s.io/kubernetes/cmd/kube-controller-manager"
  [kube-scheduler]="pin k8s.io/kubernetes/cmd/kube-scheduler"
  [kubelet]="pin k8s.io/kubernetes/cmd/kubelet"
  [containerd]="install github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION"
  [containerd-shim-runc-v2]="install github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
  [ctr]="install github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
  [runc]="install github.com/opencontainers/runc@$RUNC_VERSION seccomp"
  [crictl]="install sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
  [helm]="install helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
)
declare -A VER=(
  [kube-apiserver]=$K8S_VERSION [kubectl]=$K8S_VERSION [etcd]=$ETCD_VERSION
  [kube-controller-manager]=$K8S_VERSION [kube-scheduler]=$K8S_VERSION [kubelet]=$K8S_VERSION
  [containerd]=$CONTAINERD_VERSION [containerd-shim-runc-v2]=$CONTAINERD_VERSION [ctr]=$CONTAINERD_VERSION
  [runc]=$RUNC_VERSION [crictl]=$CRICTL_VERSION [helm]=$HELM_VERSION
)
ALL_TOOLS=(kube-apiserver kubectl etcd kube-controller-manager kube-scheduler kubelet
           containerd containerd-shim-runc-v2 ctr runc crictl helm)
tools=()
for g in "${groups[@]}"; do
  case $g in
    control-plane) tools+=(kube-apiserver kubectl etcd) ;;
    node) tools+=(kube-apiserver kubectl etcd kube-controller-manager kube-scheduler kubelet
                  containerd containerd-shim-runc-v2 ctr runc crictl) ;;
    helm) tools+=(helm) ;;
    all) tools+=("${ALL_TOOLS[@]}") ;;
  esac
done
mapfile -t tools < <(printf '%s\n' "${tools[@]}" | awk '!seen[$0]++')

# The version strings the other projects' own builds set (a module zip has no VCS data).
declare -A INSTALL_LDFLAGS=(
  [containerd]="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
  [containerd-shim-runc-v2]="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
  [ctr]="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
  [runc]="-X main.version=${RUNC_VERSION#v}"
  [crictl]="-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"
  # helm's Makefile also sets the Kubernetes version that `helm template` and
  # `helm lint` assume without a cluster: its client-go's minor, major 1
  # (v0.37.x -> 1.37). Unset, both assume 1.20.
  [helm]="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION
          -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$HELM_K8S_MINOR
          -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$HELM_K8S_MINOR"
)

# A pin tool's stamp carries the pin's hash (any change of the module graph
# rebuilds it); an installed tool's stamp its version and its ldflags.
stamp_of() {
  case ${HOW[$1]} in
    pin\ *) echo "tool=$1 version=${VER[$1]} pin=$pin_hash" ;;
    *) echo "tool=$1 version=${VER[$1]} from=${HOW[$1]#install } flags=$(echo ${INSTALL_LDFLAGS[$1]:-} | sha256sum | cut -c1-8)" ;;
  esac
}
# Built, with the stamp of what would be built now.
up_to_date() {
  local stamp="$BIN_DIR/.$1.stamp"
  [[ -x $BIN_DIR/$1 && -f $stamp ]] && [[ $(head -n1 "$stamp") == "$(stamp_of "$1")" ]]
}
cached() { (( !force )) && up_to_date "$1"; }

mkdir -p "$BIN_DIR"
# One build at a time per cache (a concurrent up.sh waits here instead of building twice).
exec 9>"$BIN_DIR/.build.lock"
if ! flock -n 9; then
  log "another build holds $BIN_DIR/.build.lock; waiting"
  flock 9
fi

todo=()
for tool in "${tools[@]}"; do
  if cached "$tool"; then
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
export GOCACHE="$CACHE_ROOT/kube/go-build"
log "building ${todo[*]} into $BIN_DIR"

P=${LOCKSTEP_KUBE_BUILD_P:-1}
NICE=${LOCKSTEP_KUBE_NICE:-15}
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
k8s_mm=${K8S_VERSION#v}; k8s_major=${k8s_mm%%.*}; k8s_minor=${k8s_mm#*.}; k8s_minor=${k8s_minor%%.*}
# Same version variables hack/lib/version.sh sets, so /version and
# `kubectl version` report the release instead of v0.0.0-master+$Format:%H$.
k8s_ldflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$k8s_major -X $p.gitMinor=$k8s_minor"
  k8s_ldflags+=" -X $p.gitCommit=module-$K8S_VERSION -X $p.gitTreeState=clean -X $p.buildDate=$build_date"
done

# runc's seccomp support links libseccomp (cgo).
if [[ " ${todo[*]} " == *" runc "* ]] && ! pkg-config --exists libseccomp 2>/dev/null; then
  log "installing libseccomp-dev and pkg-config (runc is built with seccomp)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends libseccomp-dev pkg-config >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends libseccomp-dev pkg-config >/dev/null; }
fi

t_all=$(date +%s)
pin_downloaded=0
for tool in "${todo[@]}"; do
  t0=$(date +%s)
  tmp="$BIN_DIR/.$tool.tmp.$$"
  rm -rf "$tmp"
  read -r kind what tags <<< "${HOW[$tool]}"
  case $kind in
    pin)
      if (( !pin_downloaded )); then
        log "go mod download (module proxy)"
        (cd "$moddir" && nice -n "$NICE" go mod download)
        pin_downloaded=1
      fi
      ldflags="-s -w"
      [[ $tool != etcd ]] && ldflags+="$k8s_ldflags"
      log "go build $what (-p $P, nice $NICE)"
      if ! (cd "$moddir" && nice -n "$NICE" go build -p "$P" -trimpath -ldflags "$ldflags" -o "$tmp" "$what"); then
        rm -f "$tmp"
        echo "build.sh: go build $what failed" >&2
        exit 1
      fi
      ;;
    install)
      log "go install $what (-p $P, nice $NICE)"
      mkdir -p "$tmp.d"
      # Outside any module: `go install pkg@version` uses that module's own go.mod and go.sum.
      if ! (cd "$BIN_DIR" && GOBIN="$tmp.d" GOFLAGS= nice -n "$NICE" go install -p "$P" -trimpath \
              ${tags:+-tags "$tags"} -ldflags "-s -w ${INSTALL_LDFLAGS[$tool]}" "$what"); then
        rm -rf "$tmp.d"
        echo "build.sh: go install $what failed" >&2
        exit 1
      fi
      mv -f "$tmp.d/$(basename "${what%@*}")" "$tmp"
      rm -rf "$tmp.d"
      ;;
  esac
  mv -f "$tmp" "$BIN_DIR/$tool"
  { stamp_of "$tool"; echo "go=$(go env GOVERSION) built=$build_date seconds=$(( $(date +%s) - t0 ))"; } > "$BIN_DIR/.$tool.stamp"
  log "$tool ${VER[$tool]}: built in $(( $(date +%s) - t0 ))s, $(du -h "$BIN_DIR/$tool" | cut -f1)"
done
log "done in $(( $(date +%s) - t_all ))s"

# Every tool built: Go's build cache has nothing more to share.
for tool in "${ALL_TOOLS[@]}"; do up_to_date "$tool" || exit 0; done
if [[ -d $GOCACHE ]]; then
  log "every tool is built: removing Go's build cache ($(du -sh "$GOCACHE" | cut -f1), $GOCACHE)"
  rm -rf "$GOCACHE"
fi
