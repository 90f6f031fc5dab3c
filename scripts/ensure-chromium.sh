#!/usr/bin/env bash
# Makes sure a headless Chromium is installed: Debian's `chromium` package.
# Idempotent; safe to run from several tests at once (one apt at a time).
# tests/html.rs runs it. Prints nothing on success.
set -euo pipefail
have() { command -v chromium >/dev/null 2>&1; }
have && exit 0
[[ "$(id -u)" -eq 0 ]] || { echo "ensure-chromium: run as root to install Debian's chromium package" >&2; exit 1; }
exec 9>/tmp/lockstep-apt.lock
flock -w 1800 9
have && exit 0
echo "installing chromium (Debian package chromium, with fonts for the screenshots)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
hash -r
have || { echo "ensure-chromium: chromium still missing after the install" >&2; exit 1; }
