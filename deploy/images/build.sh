#!/usr/bin/env bash
# Builds lockstep's container images as OCI archives, with no container
# engine and no registry, and (--import) loads them into the local node's
# containerd (deploy/local/kube/node-up.sh).  See README.md beside this file.
#
#   deploy/images/build.sh [--import] [--slurm 22.05|24.11|26.05]
#
# Images (registry prefix $LOCKSTEP_IMAGE_REGISTRY, default lockstep.local):
#   lockstep:<version>                 the lockstep binary (release build, stripped),
#                                      the libraries it links, CA certificates; user 65532
#   lockstep:<version>-slurm<slurm>    the same on a Debian root with Slurm's client
#                                      (scontrol) and munge: for Slurm older than 23.02,
#                                      whose slurmrestd cannot update nodes
#   slurmd:<slurm>                     slurmd + munge on the same Debian root: one Slurm
#                                      node per pod (entrypoint lockstep-slurmd)
# The Debian root is bookworm (the host's Slurm, 22.05) built here with
# debootstrap, or for 24.11 / 26.05 the root deploy/local/slurm/root.sh builds.
# Both Slurm images share that root as their first layer.
#
# Output: $LOCKSTEP_IMAGE_DIR (default ~/.cache/lockstep/images): one
# <name>-<tag>.oci.tar per image, and images.env (refs and digests).  An
# archive whose inputs did not change is not written again.
#
# Env: LOCKSTEP_CACHE_DIR, LOCKSTEP_IMAGE_REGISTRY, LOCKSTEP_IMAGE_DIR,
#      LOCKSTEP_IMAGE_BINARY (use this lockstep binary instead of building
#      `cargo build --profile dist`), LOCKSTEP_DEBIAN_MIRROR,
#      LOCKSTEP_NODE_CRI (containerd socket for --import; default the one
#      node-up.sh starts).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

import=0
SLURM_VERSION=22.05
while (( $# )); do
  case $1 in
    --import) import=1 ;;
    --slurm) SLURM_VERSION=${2:?--slurm needs a version}; shift ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "images: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

CACHE_ROOT=${LOCKSTEP_CACHE_DIR:-$HOME/.cache/lockstep}
OUT=${LOCKSTEP_IMAGE_DIR:-$CACHE_ROOT/images}
REGISTRY=${LOCKSTEP_IMAGE_REGISTRY:-lockstep.local}
MIRROR=${LOCKSTEP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CRI=${LOCKSTEP_NODE_CRI:-${LOCKSTEP_STATE_DIR:-/tmp/lockstep-node}/node/containerd/containerd.sock}
log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[images] ERROR: %s\n' "$*" >&2; exit 1; }
# The workspace's version ([workspace.package], which the lockstep package inherits).
VERSION=$(sed -n '/^\[workspace\.package\]/,/^\[/ s/^version *= *"\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n1)
[[ -n $VERSION ]] || die "cannot read the version from Cargo.toml"


mkdir -p "$OUT"
exec 8>"$OUT/.lock"
flock -w 1800 8 || die "timed out waiting for $OUT/.lock"

# ---- the lockstep binary -----------------------------------------------------
if [[ -n ${LOCKSTEP_IMAGE_BINARY:-} ]]; then
  BINARY=$LOCKSTEP_IMAGE_BINARY
else
  log "cargo build --profile dist --bin lockstep"
  (cd "$repo" && cargo build --quiet --profile dist --bin lockstep)
  BINARY="${CARGO_TARGET_DIR:-$repo/target}/dist/lockstep"
fi
[[ -x $BINARY ]] || die "no lockstep binary at $BINARY"

# ---- the Debian root with Slurm ----------------------------------------------
case $SLURM_VERSION in
  22.05)
    # The host's Slurm: Debian 12. Same layout and marker as deploy/local/slurm/root.sh.
    ROOT="$CACHE_ROOT/images/roots/slurm-22.05/root"
    if [[ ! -f $ROOT/.lockstep-root ]]; then
      [[ $(id -u) -eq 0 ]] || die "building the Debian root needs root (debootstrap, chroot)"
      command -v debootstrap >/dev/null || {
        log "installing debootstrap"
        apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
          { apt-get update -qq >/dev/null && apt-get install -y -qq debootstrap >/dev/null; }
      }
      partial="$ROOT.partial"
      grep -qF " $partial/" /proc/self/mounts && die "$partial has mounts below it"
      rm -rf -- "$partial"
      mkdir -p "$(dirname "$ROOT")"
      t0=$SECONDS
      blog="$(dirname "$ROOT")/build.log"
      log "debootstrap bookworm + slurmd, slurm-client, munge into $ROOT (log: $blog)"
      debootstrap --variant=minbase bookworm "$partial" "$MIRROR" > "$blog" 2>&1 ||
        { tail -n 30 "$blog" >&2; die "debootstrap bookworm failed"; }
      printf '#!/bin/sh\nexit 101\n' > "$partial/usr/sbin/policy-rc.d"
      chmod 0755 "$partial/usr/sbin/policy-rc.d"
      chroot "$partial" apt-get -o Acquire::Retries=3 update >> "$blog" 2>&1 ||
        { tail -n 30 "$blog" >&2; die "apt-get update in the root failed"; }
      chroot "$partial" env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Retries=3 install -y \
        --no-install-recommends slurmd slurm-client slurm-wlm-jwt-plugin munge >> "$blog" 2>&1 ||
        { tail -n 30 "$blog" >&2; die "installing Slurm in the root failed"; }
      chroot "$partial" apt-get clean >> "$blog" 2>&1 || true
      got=$(chroot "$partial" dpkg-query -W -f '${Version}' slurmd)
      [[ $got == 22.05.* ]] || die "bookworm has slurmd $got, not 22.05"
      printf 'suite=bookworm\nslurm=%s\nbuilt=%s\nseconds=%s\n' "$got" "$(date -u +%FT%TZ)" \
        "$(( SECONDS - t0 ))" > "$partial/.lockstep-root"
      mv -T "$partial" "$ROOT"
      log "root ready: Slurm $got ($(( SECONDS - t0 )) s)"
    fi
    ;;
  24.11|26.05)
    # Reuse the root deploy/local/slurm/root.sh builds (and caches) for that version.
    ROOT=$("$repo/deploy/local/slurm/root.sh" "$SLURM_VERSION")
    ;;
  *) die "no Slurm root for $SLURM_VERSION (22.05, 24.11 or 26.05)" ;;
esac
SLURM_FULL=$(sed -n 's/^slurm=//p' "$ROOT/.lockstep-root")

# What of a root is not part of an image: the kernel's and the runtime's
# mounts, caches, docs, logs, and any Slurm state a test left there.
EXCLUDES=('proc/*' 'sys/*' 'dev/*' 'run/*' 'tmp/*' 'var/tmp/*' 'var/cache/apt/*' 'var/lib/apt/lists/*'
          'var/log/*' 'usr/share/doc/*' 'usr/share/man/*' 'usr/share/info/*' 'usr/share/locale/*'
          'etc/slurm/*' 'var/spool/slurm*' 'var/lib/slurm*' .lockstep-root)

# ---- layers ------------------------------------------------------------------
work=$(mktemp -d "$OUT/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin/usr/local/bin" "$work/tools/usr/local/bin"
install -m 0755 "$BINARY" "$work/bin/usr/local/bin/lockstep"
install -m 0755 "$here/slurm/lockstep-slurmd" "$here/slurm/lockstep-munged" "$work/tools/usr/local/bin/"

# The slim image: the binary, what it links (ldd), a passwd with an
# unprivileged user, CA certificates; nothing else, no shell.
slim="$work/slim"
mkdir -p "$slim/usr/local/bin" "$slim/etc/ssl/certs" "$slim/tmp"
chmod 1777 "$slim/tmp"
cp "$work/bin/usr/local/bin/lockstep" "$slim/usr/local/bin/"
while read -r lib; do
  [[ -n $lib ]] || continue
  mkdir -p "$slim$(dirname "$lib")"
  cp -L "$lib" "$slim$lib"
done < <(ldd "$BINARY" | awk '/=> \// {print $3} /^[[:space:]]*\/[^ ]*ld-linux/ {print $1}')
printf 'root:x:0:0:root:/root:/sbin/nologin\nlockstep:x:65532:65532:lockstep:/nonexistent:/sbin/nologin\n' > "$slim/etc/passwd"
printf 'root:x:0:\nlockstep:x:65532:\n' > "$slim/etc/group"
cp -L /etc/ssl/certs/ca-certificates.crt "$slim/etc/ssl/certs/" 2>/dev/null || true

# ---- archives ----------------------------------------------------------------
# build NAME TAG KEY MKOCI-ARGS...: writes $OUT/NAME-TAG.oci.tar unless its key
# (a hash of every input) is unchanged.
key_of() { cat "$@" | sha256sum | cut -c1-32; }
root_key=$(printf '%s\n' "$ROOT" "$(cat "$ROOT/.lockstep-root")" "${EXCLUDES[*]}" | sha256sum | cut -c1-32)
build() {
  local name=$1 tag=$2 key=$3; shift 3
  local ref="$REGISTRY/$name:$tag" file="$OUT/$name-$tag.oci.tar"
  if [[ -s $file && $(cat "$file.key" 2>/dev/null) == "$key" ]]; then
    log "$ref: unchanged ($file)"
  else
    log "$ref: writing $file"
    python3 "$here/mkoci.py" "$file" "$ref" "$@" >&2
    echo "$key" > "$file.key"
  fi
  printf '%s %s\n' "$ref" "$file" >> "$work/built"
}
: > "$work/built"
common_key=$(key_of "$here/mkoci.py" "$0")
tools_key=$(key_of "$here/slurm/lockstep-slurmd" "$here/slurm/lockstep-munged")
bin_key=$(key_of "$BINARY")

build lockstep "$VERSION" "$common_key-$bin_key-$(key_of /etc/ssl/certs/ca-certificates.crt 2>/dev/null || echo none)" \
  --layer "$slim" --entrypoint '["/usr/local/bin/lockstep"]' --cmd '["run", "--config", "/etc/lockstep/lockstep.toml"]' \
  --user 65532:65532 --label "org.opencontainers.image.version=$VERSION" \
  --label "org.opencontainers.image.source=lockstep"
build lockstep "$VERSION-slurm$SLURM_VERSION" "$common_key-$bin_key-$root_key-$tools_key" \
  --layer "$ROOT" --layer "$work/tools" --layer "$work/bin" "${EXCLUDES[@]/#/--exclude=}" \
  --entrypoint '["/usr/local/bin/lockstep"]' --cmd '["run", "--config", "/etc/lockstep/lockstep.toml"]' \
  --label "org.opencontainers.image.version=$VERSION" --label "io.lockstep.slurm=$SLURM_FULL"
build slurmd "$SLURM_VERSION" "$common_key-$root_key-$tools_key" \
  --layer "$ROOT" --layer "$work/tools" "${EXCLUDES[@]/#/--exclude=}" \
  --entrypoint '["/usr/local/bin/lockstep-slurmd"]' --label "io.lockstep.slurm=$SLURM_FULL"

# The binary that is in the images, beside them: tests replay the log a pod
# wrote with the very lockstep that wrote it.
mkdir -p "$OUT/bin"
if ! cmp -s "$BINARY" "$OUT/bin/lockstep"; then
  cp "$BINARY" "$OUT/bin/lockstep.tmp" && mv -f "$OUT/bin/lockstep.tmp" "$OUT/bin/lockstep"
fi

# images.env: what was built, for scripts and tests.
{
  echo "# Generated by deploy/images/build.sh; source it."
  echo "LOCKSTEP_IMAGE=$REGISTRY/lockstep:$VERSION"
  echo "LOCKSTEP_SLURM_IMAGE=$REGISTRY/lockstep:$VERSION-slurm$SLURM_VERSION"
  echo "SLURMD_IMAGE=$REGISTRY/slurmd:$SLURM_VERSION"
  echo "LOCKSTEP_IMAGE_VERSION=$VERSION"
  echo "SLURM_IMAGE_VERSION=$SLURM_FULL"
  echo "LOCKSTEP_BINARY=$OUT/bin/lockstep"
} > "$OUT/images.env"

# ---- import into the node's containerd ---------------------------------------
if (( import )); then
  BIN=$("$repo/deploy/local/kube/build.sh" --print-bin-dir)
  [[ -S $CRI ]] || die "no containerd socket at $CRI (deploy/local/kube/node-up.sh first, or set LOCKSTEP_NODE_CRI)"
  ctr=("$BIN/ctr" --address "$CRI" -n k8s.io)
  while read -r ref file; do
    want=$(python3 -c 'import json,sys,tarfile; t=tarfile.open(sys.argv[1]); print(json.load(t.extractfile("index.json"))["manifests"][0]["digest"])' "$file")
    have=$("${ctr[@]}" images ls "name==$ref" 2>/dev/null | awk 'NR > 1 {print $3}')
    if [[ $have == "$want" ]]; then
      log "$ref: already in the node's containerd"
    else
      t0=$SECONDS
      # (ctr warns about cgroup v1 on every run: shown only when the import fails)
      "${ctr[@]}" images import "$file" >/dev/null 2>"$work/ctr.err" || { cat "$work/ctr.err" >&2; die "importing $file failed"; }
      log "$ref: imported in $(( SECONDS - t0 ))s ($want)"
    fi
  done < "$work/built"
fi
cat "$OUT/images.env"
