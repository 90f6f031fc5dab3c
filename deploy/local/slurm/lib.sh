# shellcheck shell=bash disable=SC2034 # (the variables are for the scripts that source it)
# Shared by up.sh, down.sh and record-fixtures.sh (sourced, not run).
#
# Which Slurm: LOCKSTEP_SLURM_VERSION=22.05|24.11|26.05 (default 22.05, the
# machine's own Debian 12 packages). 24.11 and 26.05 run from a Debian root
# (root.sh) entered with chroot; the state dir is bind-mounted into that root
# at the same path, so every path in slurm.conf means the same file inside
# and outside, and the daemons' pids are the host's.
#
# Defaults derived from the version, so that several versions run at once:
#
#   version  state dir                 slurmctld  slurmd (node i)  slurmrestd
#   22.05    $LOCKSTEP_STATE_DIR/slurm        16817      16830+i          6820
#   24.11    $LOCKSTEP_STATE_DIR/slurm-24.11  18817      18830+i          6821
#   26.05    $LOCKSTEP_STATE_DIR/slurm-26.05  19817      19830+i          6822

SLURM_VERSION="${LOCKSTEP_SLURM_VERSION:-22.05}"
case "$SLURM_VERSION" in
22.05) V_DIR=slurm V_CTLD=16817 V_SLURMD=16830 V_REST=6820 ;;
24.11) V_DIR=slurm-24.11 V_CTLD=18817 V_SLURMD=18830 V_REST=6821 ;;
26.05) V_DIR=slurm-26.05 V_CTLD=19817 V_SLURMD=19830 V_REST=6822 ;;
*)
  printf 'slurm: ERROR: LOCKSTEP_SLURM_VERSION=%s: use 22.05, 24.11 or 26.05\n' "$SLURM_VERSION" >&2
  exit 2
  ;;
esac
STATE="${LOCKSTEP_SLURM_STATE_DIR:-${LOCKSTEP_STATE_DIR:-/tmp/lockstep-local}/$V_DIR}"
SLURM_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# The Debian root of this version (empty for 22.05). Not built here.
slurm_root_path() {
  [[ "$SLURM_VERSION" == 22.05 ]] && return 0
  printf '%s/slurm/%s/root\n' "${LOCKSTEP_CACHE_DIR:-$HOME/.cache/lockstep}" "$SLURM_VERSION"
}

# Is process $1 program $2? Debian's newer packages install the daemons as
# slurmctld-wlm and slurmd-wlm (the plain names are links), so both count.
is_daemon() { # pid prog
  local comm
  comm="$(cat "/proc/$1/comm" 2>/dev/null)" || return 1
  [[ "$comm" == "$2" || "$comm" == "$2-wlm" ]]
}

is_mounted() { # path
  awk -v p="$1" '$2 == p { found = 1 } END { exit !found }' /proc/self/mounts
}

# Mounts below root $1 other than its proc, dev and sys: the state dirs of
# clusters that still use it.
root_users() { # root
  awk -v r="$1/" '
    index($2, r) == 1 && $2 != r "proc" && $2 != r "dev" && $2 != r "sys" { print $2 }
  ' /proc/self/mounts
}

# One mount or unmount of a root at a time (several clusters share a root).
with_mount_lock() { # root command...
  local root="$1"
  shift
  mkdir -p "$(dirname "$root")"
  (
    flock -w 60 9 || { echo "slurm: cannot lock $root for mounting" >&2; exit 1; }
    "$@"
  ) 9>"$(dirname "$root")/.mount.lock"
}

# proc, dev and sys in the root, and the state dir at its own path inside.
_mount_root() { # root state
  local root="$1" state="$2" d
  for d in proc dev sys; do
    is_mounted "$root/$d" && continue
    case "$d" in
    proc) mount -t proc proc "$root/proc" ;;
    *) mount --bind "/$d" "$root/$d" ;;
    esac
  done
  if ! is_mounted "$root$state"; then
    mkdir -p "$root$state"
    mount --bind "$state" "$root$state"
  fi
}
mount_root() { with_mount_lock "$1" _mount_root "$1" "$2"; }

# umount, retried while busy (a process may still be exiting), lazily as a
# last resort so nothing stays mounted.
_umount() { # path
  local t
  for ((t = 0; t < 20; t++)); do
    is_mounted "$1" || return 0
    umount "$1" 2>/dev/null && return 0
    sleep 0.25
  done
  is_mounted "$1" || return 0
  printf 'slurm: %s still busy, detaching it (umount -l)\n' "$1" >&2
  umount -l "$1"
}

# The state dir's bind mount; proc, dev and sys too once no cluster uses the
# root any more.
_unmount_root() { # root state
  local root="$1" state="$2" d
  _umount "$root$state"
  [[ -n "$(root_users "$root")" ]] && return 0
  for d in sys dev proc; do _umount "$root/$d"; done
}
unmount_root() { with_mount_lock "$1" _unmount_root "$1" "$2"; }
