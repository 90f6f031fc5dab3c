#!/usr/bin/env bash
# Installs, in one apt-get run, every Debian package the test suite uses
# and this machine lacks: Slurm 22.05 and munge (deploy/local/slurm),
# debootstrap (the Debian roots of Slurm 24.11 / 26.05 and of the images),
# libseccomp-dev and pkg-config (runc, deploy/local/kube/build.sh), the real
# node's iptables, nftables and CNI plugins (node-up.sh), Prometheus
# (tests/metrics.rs) and Chromium (tests/html.rs). Idempotent: nothing to do
# when all are there. The scripts that need them install them too, for use
# on their own; installing them here first means the suite's parts, which
# run at the same time, never race for dpkg's lock.
set -euo pipefail
[[ $(id -u) -eq 0 ]] || { echo "ensure-packages: run as root to install Debian packages" >&2; exit 1; }

wanted=(
  slurm-wlm slurmrestd slurm-wlm-jwt-plugin munge curl util-linux systemd
  debootstrap libseccomp-dev pkg-config
  iptables nftables containernetworking-plugins gcc libc6-dev
  prometheus chromium fonts-dejavu-core
)
missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
(( ${#missing[@]} )) || exit 0
echo "installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
  { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
