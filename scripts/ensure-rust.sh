#!/usr/bin/env bash
# Makes sure a Rust toolchain with rustfmt and clippy is on PATH. Idempotent:
# does nothing when they are already there.
set -euo pipefail
if [ -f "$HOME/.cargo/env" ]; then
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
  if command -v rustup >/dev/null 2>&1; then
    rustup default stable
  else
    echo "installing Rust from Debian's packages (no rustup on this machine)" >&2
    apt-get update -qq && apt-get install -y -qq cargo rustc rustfmt rust-clippy >/dev/null
  fi
fi
if ! cargo fmt --version >/dev/null 2>&1 && command -v rustup >/dev/null 2>&1; then
  rustup component add rustfmt
fi
if ! cargo clippy --version >/dev/null 2>&1 && command -v rustup >/dev/null 2>&1; then
  rustup component add clippy
fi
