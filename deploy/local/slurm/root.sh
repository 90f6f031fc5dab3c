#!/usr/bin/env bash
# Build (once) and print the Debian root that runs a newer Slurm with chroot.
#
#   deploy/local/slurm/root.sh 24.11|26.05     # prints the root's path
#
# 22.05 is the machine's own Slurm (Debian 12) and needs no root. 24.11 comes
# from Debian 13 (trixie), 26.05 from Debian unstable (sid):
#   debootstrap --variant=minbase SUITE ROOT
#   chroot ROOT apt-get install slurm-wlm slurmrestd slurm-wlm-jwt-plugin munge
# The root is cached under ${LOCKSTEP_CACHE_DIR:-$HOME/.cache/lockstep}/slurm/
# and reused; it is built in ROOT.partial and renamed only when complete, so
# an interrupted build starts over instead of leaving half a root behind.
# Nothing is mounted here: up.sh mounts proc, dev and sys, down.sh unmounts.
# Env: LOCKSTEP_CACHE_DIR, LOCKSTEP_DEBIAN_MIRROR (default deb.debian.org).
set -euo pipefail

VERSION="${1:-}"
case "$VERSION" in
24.11) SUITE=trixie ;;
26.05) SUITE=sid ;;
*)
  echo "usage: $0 24.11|26.05" >&2
  exit 2
  ;;
esac

CACHE_ROOT="${LOCKSTEP_CACHE_DIR:-$HOME/.cache/lockstep}"
DIR="$CACHE_ROOT/slurm/$VERSION"
ROOT="$DIR/root"
READY="$ROOT/.lockstep-root"
MIRROR="${LOCKSTEP_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=(slurm-wlm slurmrestd slurm-wlm-jwt-plugin munge curl)
# sid's Release file carries a Valid-Until that a pinned mirror or a machine
# clock can be past; the packages are still signed, so only that check is off.
APT_OPTS=(-o Acquire::Check-Valid-Until=false -o Acquire::Retries=3)

log() { printf 'slurm-root: %s\n' "$*" >&2; }
die() { printf 'slurm-root: ERROR: %s\n' "$*" >&2; exit 1; }

if [[ -f "$READY" ]]; then
  echo "$ROOT"
  exit 0
fi
[[ "$(id -u)" -eq 0 ]] || die "must run as root (debootstrap, chroot)"

# One build per version at a time: tests start up.sh from several processes.
mkdir -p "$DIR"
if [[ "${LOCKSTEP_SLURM_ROOT_LOCKED:-}" != "$DIR" ]]; then
  exec env LOCKSTEP_SLURM_ROOT_LOCKED="$DIR" \
    flock -o -w "${LOCKSTEP_SLURM_ROOT_LOCK_WAIT:-1800}" "$DIR/.lock" "$0" "$@"
fi
if [[ -f "$READY" ]]; then # built while we waited for the lock
  echo "$ROOT"
  exit 0
fi

if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null && apt-get install -y -qq debootstrap >/dev/null; }
fi

PARTIAL="$ROOT.partial"
# A build that died may have left mounts (apt's postinst scripts never need
# them, but be safe): never rm -rf through a mounted /proc or /dev.
if [[ -d "$PARTIAL" ]]; then
  if grep -qF " $PARTIAL/" /proc/self/mounts; then
    die "$PARTIAL has mounts below it; unmount them first"
  fi
  log "removing an unfinished root $PARTIAL"
  rm -rf -- "$PARTIAL"
fi
if [[ -d "$ROOT" ]]; then # a root without its marker: unfinished, start over
  grep -qF " $ROOT/" /proc/self/mounts && die "$ROOT has mounts below it; run down.sh first"
  rm -rf -- "$ROOT"
fi

t0="$(date +%s)"
BUILD_LOG="$DIR/build.log"
: >"$BUILD_LOG"
log "building a Debian $SUITE root for Slurm $VERSION in $ROOT (log: $BUILD_LOG)"
debootstrap --variant=minbase "$SUITE" "$PARTIAL" "$MIRROR" >>"$BUILD_LOG" 2>&1 ||
  { tail -n 30 "$BUILD_LOG" >&2; die "debootstrap $SUITE failed"; }
# No service may start inside the root while packages are installed.
printf '#!/bin/sh\nexit 101\n' >"$PARTIAL/usr/sbin/policy-rc.d"
chmod 0755 "$PARTIAL/usr/sbin/policy-rc.d"
chroot "$PARTIAL" apt-get "${APT_OPTS[@]}" update >>"$BUILD_LOG" 2>&1 ||
  { tail -n 30 "$BUILD_LOG" >&2; die "apt-get update in the $SUITE root failed"; }
chroot "$PARTIAL" env DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" install -y \
  --no-install-recommends "${PACKAGES[@]}" >>"$BUILD_LOG" 2>&1 ||
  { tail -n 30 "$BUILD_LOG" >&2; die "installing ${PACKAGES[*]} in the $SUITE root failed"; }
chroot "$PARTIAL" apt-get clean >>"$BUILD_LOG" 2>&1 || true

# shellcheck disable=SC2016 # ${Version} is dpkg-query's, not the shell's
got="$(chroot "$PARTIAL" dpkg-query -W -f '${Version}' slurm-wlm)"
case "$got" in
"$VERSION".*) ;;
*) die "Debian $SUITE has slurm-wlm $got, not $VERSION (set LOCKSTEP_DEBIAN_MIRROR to a snapshot that has it)" ;;
esac

printf 'suite=%s\nslurm=%s\nbuilt=%s\nseconds=%s\n' \
  "$SUITE" "$got" "$(date -u +%FT%TZ)" "$(($(date +%s) - t0))" >"$PARTIAL/.lockstep-root"
mv -T "$PARTIAL" "$ROOT"
log "root ready: Slurm $got in $ROOT ($(($(date +%s) - t0)) s)"
echo "$ROOT"
