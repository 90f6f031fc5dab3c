#!/usr/bin/env bash
# Makes sure Prometheus and promtool are installed: Debian's `prometheus`
# package brings both. Idempotent; safe to run from several tests at once
# (one apt at a time). tests/metrics.rs runs it.
set -euo pipefail
have() { command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; }
have && exit 0
[[ "$(id -u)" -eq 0 ]] || { echo "ensure-prometheus: run as root to install Debian's prometheus package" >&2; exit 1; }
exec 9>/tmp/lockstep-apt.lock
flock -w 1800 9
have && exit 0
echo "installing prometheus and promtool (Debian package prometheus)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
# The package enables a system service; lockstep's tests start their own
# Prometheus on a free loopback port and never use it.
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
hash -r
have || { echo "ensure-prometheus: prometheus or promtool still missing after the install" >&2; exit 1; }
