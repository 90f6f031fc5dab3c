#!/usr/bin/env bash
# Makes sure mdbook (the book under docs/) is installed, and prints the path
# of its binary. Built once from crates.io with the machine's Rust into
# ~/.cache/lockstep/mdbook-VERSION (about 3 min of CPU on 2 cores; the
# lean build: no serve, watch or search); nothing to do when cached.
# Idempotent; safe to run from several scripts at once.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-rust.sh
version=0.5.4
root=${LOCKSTEP_MDBOOK_ROOT:-$HOME/.cache/lockstep/mdbook-$version}
bin=$root/bin/mdbook
have() { [[ -x $bin ]] && "$bin" --version 2>/dev/null | grep -qx "mdbook v$version"; }
if ! have; then
  mkdir -p "$root"
  exec 9>"$root.lock"
  flock -w 1800 9
  if ! have; then
    echo "installing mdbook $version into $root (cargo install --locked, no default features)" >&2
    cargo install --quiet --locked --no-default-features --version "$version" --root "$root" mdbook >&2
  fi
fi
have || { echo "ensure-mdbook: $bin is still missing after the install" >&2; exit 1; }
echo "$bin"
