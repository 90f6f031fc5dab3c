#!/usr/bin/env bash
# lockstep on a local cluster, the way a site runs it: a real Kubernetes
# node (node-up.sh), Slurm 22.05's slurmctld and slurmrestd on the host,
# slurmd in the pods of a StatefulSet (one Slurm node per pod, several on
# the node), a nats-server, and lockstep installed by its Helm chart from
# its own image (two replicas, leader election).
#
#   deploy/local/kube/demo.sh up      # first run ~25 min (builds), then ~1 min
#   source /tmp/lockstep-node/demo.env  # KUBECONFIG, PATH, SLURM_CONF, LOCKSTEP_LOG
#   kubectl cordon lockstep-node; sinfo -N   # slurmd-* DRAIN, reason "lockstep: ..."
#   lockstep audit slurmd-0 --log "$LOCKSTEP_LOG"
#   deploy/local/kube/demo.sh down    # everything stopped, the host restored
#
# Slurm nodes slurmd-0 .. slurmd-5 are declared in slurm.conf (NodeAddr
# 127.0.0.1, a port each); the StatefulSet's pods run in the host's network
# and pod slurmd-i runs `slurmd -N slurmd-i`. Env: LOCKSTEP_DEMO_SLURMD
# (replicas, default 3), LOCKSTEP_STATE_DIR (/tmp/lockstep-node).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
ROOT=${LOCKSTEP_STATE_DIR:-/tmp/lockstep-node}
REPLICAS=${LOCKSTEP_DEMO_SLURMD:-3}
NATS_PORT=27422
export LOCKSTEP_STATE_DIR=$ROOT
export LOCKSTEP_NODE_HOST_PORTS="27817 27820 $NATS_PORT"
export LOCKSTEP_SLURM_STATE_DIR=$ROOT/slurm LOCKSTEP_SLURM_VERSION=22.05
export LOCKSTEP_SLURM_NODES=slurmd-0,slurmd-1,slurmd-2,slurmd-3,slurmd-4,slurmd-5 LOCKSTEP_SLURMD_MAX=0
export LOCKSTEP_SLURMCTLD_PORT=27817 LOCKSTEP_SLURMD_PORT_BASE=27830 LOCKSTEP_SLURMRESTD_PORT=27820
unset SLURM_JWT

log() { printf '[demo %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

down() {
  log "uninstalling lockstep, stopping the node, Slurm and NATS"
  "$here/node-down.sh" --wipe || true
  "$repo/deploy/local/slurm/down.sh" --purge || true
  p=$(cat "$ROOT/nats.pid" 2>/dev/null) && [[ $(cat "/proc/$p/comm" 2>/dev/null) == nats-server ]] && kill "$p"
  rm -rf "$ROOT/nats.pid" "$ROOT/nats" "$ROOT/demo.env"
}

up() {
  "$here/node-up.sh"
  "$here/build.sh" helm
  BIN=$("$here/build.sh" --print-bin-dir)
  # shellcheck disable=SC1091
  . "$ROOT/node/env.sh"
  "$repo/deploy/images/build.sh" --import > "$ROOT/images.env"
  # shellcheck disable=SC1090
  . "$ROOT/images.env"
  mkdir -p "$LOCKSTEP_SLURM_STATE_DIR"
  "$repo/deploy/local/slurm/up.sh" > /dev/null
  SLURM_STATE=$LOCKSTEP_SLURM_STATE_DIR
  # shellcheck disable=SC1091
  . "$SLURM_STATE/env.sh"

  if ! { p=$(cat "$ROOT/nats.pid" 2>/dev/null) && [[ $(cat "/proc/$p/comm" 2>/dev/null) == nats-server ]]; }; then
    "$repo/scripts/ensure-nats.sh" >/dev/null
    # A fresh log: a log kept from an earlier cluster would describe objects
    # this one does not have.
    rm -rf "$ROOT/nats"
    mkdir -p "$ROOT/nats"
    # JetStream reserves each stream's max_bytes up front, from at most 75%
    # of the disk free at start unless told otherwise.
    # Every write synced before it is acknowledged, as in production.
    printf 'jetstream {\n  max_file_store: 1TB\n  sync_interval: always\n}\n' > "$ROOT/nats/nats.conf"
    setsid nats-server -c "$ROOT/nats/nats.conf" -js -a 127.0.0.1 -p "$NATS_PORT" -sd "$ROOT/nats/js" > "$ROOT/nats/nats.log" 2>&1 < /dev/null &
    echo $! > "$ROOT/nats.pid"
    log "nats-server on 127.0.0.1:$NATS_PORT"
  fi

  kc() { "$BIN/kubectl" "$@"; }
  for ns in slurm lockstep-system; do
    kc create namespace "$ns" --dry-run=client -o yaml | kc apply -f - >/dev/null
  done
  # slurmd pods run in the host's network: the controller's slurm.conf as is.
  # lockstep's pods have their own network: slurmctld at the bridge address.
  pod_conf=$(mktemp)
  sed "s/^SlurmctldHost=\([^(]*\)(.*)/SlurmctldHost=\1($LOCKSTEP_NODE_GATEWAY)/" "$SLURM_CONF" > "$pod_conf"
  for ns in slurm lockstep-system; do
    conf=$SLURM_CONF; [[ $ns == lockstep-system ]] && conf=$pod_conf
    kc -n "$ns" create configmap slurm-conf --from-file=slurm.conf="$conf" --dry-run=client -o yaml | kc apply -f - >/dev/null
    kc -n "$ns" create secret generic munge-key --from-file=munge.key="$SLURM_STATE/munge/munge.key" \
      --dry-run=client -o yaml | kc apply -f - >/dev/null
  done
  rm -f "$pod_conf"
  kc -n lockstep-system create secret generic slurm-jwt --from-file=token="$SLURM_JWT_FILE" \
    --dry-run=client -o yaml | kc apply -f - >/dev/null

  kc apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: slurmd, namespace: slurm}
spec:
  replicas: $REPLICAS
  serviceName: slurmd
  podManagementPolicy: Parallel
  updateStrategy: {type: OnDelete}   # lockstep paces rollouts around running jobs
  selector: {matchLabels: {app.kubernetes.io/component: slurmd}}
  template:
    metadata: {labels: {app.kubernetes.io/component: slurmd}}
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      enableServiceLinks: false
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 10
      containers:
      - name: slurmd
        image: $SLURMD_IMAGE
        imagePullPolicy: IfNotPresent
        env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
        volumeMounts:
        - {name: slurm-conf, mountPath: /etc/slurm, readOnly: true}
        - {name: munge-key, mountPath: /etc/munge-key, readOnly: true}
      volumes:
      - {name: slurm-conf, configMap: {name: slurm-conf}}
      - {name: munge-key, secret: {secretName: munge-key}}
EOF
  log "slurmd StatefulSet: $REPLICAS pods"

  values=$(mktemp --suffix=.yaml)
  cat > "$values" <<EOF
nats: {url: "nats://$LOCKSTEP_NODE_GATEWAY:$NATS_PORT"}
slurm:
  restUrl: "http://$LOCKSTEP_NODE_GATEWAY:27820"
  jwt: {existingSecret: slurm-jwt}
  scontrol:
    enabled: true
    slurmVersion: "22.05"
    slurmConf: {existingConfigMap: slurm-conf}
    munge: {keySecret: munge-key, socketDir: "$SLURM_STATE/munge"}
telemetry: {logFormat: text}
policy:
  mapping: {mode: pod, pod_selector: app.kubernetes.io/component=slurmd}
  health: {unhealthy_taint: null}
EOF
  "$BIN/helm" upgrade --install lockstep "$repo/deploy/helm/lockstep" -n lockstep-system \
    -f "$values" --wait --timeout 300s >/dev/null
  rm -f "$values"
  log "lockstep installed by the chart: $(kc -n lockstep-system get pods -l app.kubernetes.io/instance=lockstep -o name | tr '\n' ' ')"
  for i in $(seq 0 $((REPLICAS - 1))); do
    for _ in $(seq 120); do
      [[ $(SLURM_CONF=$SLURM_CONF sinfo -h -n "slurmd-$i" -o %T 2>/dev/null) == idle ]] && break
      sleep 1
    done
  done

  lockstep_bin="$repo/target/dist/lockstep"
  cat > "$ROOT/demo.env" <<EOF
# Generated by deploy/local/kube/demo.sh; source it.
. '$ROOT/node/env.sh'
export PATH='$(dirname "$lockstep_bin")':"\$PATH"
export SLURM_CONF='$SLURM_CONF'
export LOCKSTEP_LOG='nats://127.0.0.1:$NATS_PORT'
EOF
  SLURM_CONF=$SLURM_CONF sinfo -N >&2
  log "ready: source $ROOT/demo.env; then: kubectl cordon $LOCKSTEP_NODE_NAME; sinfo -N; lockstep audit slurmd-0 --log \$LOCKSTEP_LOG"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
