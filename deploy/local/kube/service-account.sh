#!/usr/bin/env bash
# Applies deploy/kubernetes/rbac.yaml to the local control plane and writes a
# kubeconfig that authenticates as the ServiceAccount lockstep-system/lockstep
# (a bound token from the TokenRequest API), so that lockstep runs with the
# rights the manifest grants and no more. Idempotent; prints the file's path.
#
#   deploy/local/kube/up.sh && deploy/local/kube/service-account.sh
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
STATE=${LOCKSTEP_STATE_DIR:-/tmp/lockstep-local}/kube
DURATION=${LOCKSTEP_SA_TOKEN_DURATION:-24h}

[[ -s $STATE/env.sh ]] || { echo "service-account: run deploy/local/kube/up.sh first" >&2; exit 1; }
# shellcheck disable=SC1091
. "$STATE/env.sh"

kubectl apply -f "$repo/deploy/kubernetes/rbac.yaml" >/dev/null
token=$(kubectl create token lockstep -n lockstep-system --duration "$DURATION")
ca=$(base64 -w0 < "$LOCKSTEP_KUBE_CA_FILE")
umask 077
cat > "$STATE/lockstep-sa.kubeconfig.tmp" <<EOC
apiVersion: v1
kind: Config
clusters:
- name: lockstep-local
  cluster:
    server: $LOCKSTEP_KUBE_SERVER
    certificate-authority-data: $ca
users:
- name: lockstep
  user:
    token: $token
contexts:
- name: lockstep
  context:
    cluster: lockstep-local
    user: lockstep
    namespace: lockstep-system
current-context: lockstep
EOC
mv -f "$STATE/lockstep-sa.kubeconfig.tmp" "$STATE/lockstep-sa.kubeconfig"
echo "$STATE/lockstep-sa.kubeconfig"
