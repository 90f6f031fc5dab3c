#!/usr/bin/env bash
# Checks the lockstep chart without a cluster: `helm lint --strict` and
# `helm template` for every value set in deploy/helm/lockstep/ci/, what each
# must (and must not) render, and that bad values are refused (the values
# schema, `required` values).  The rendered lockstep.toml and policy.json are
# checked with lockstep's own parser by tests/chart.rs.
#
#   deploy/helm/check.sh            # renders into $LOCKSTEP_HELM_OUT (default a temp dir)
#
# helm is built from the Go module proxy and cached (deploy/local/kube/build.sh helm).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
chart="$here/lockstep"
"$repo/deploy/local/kube/build.sh" helm >/dev/null
helm="$("$repo/deploy/local/kube/build.sh" --print-bin-dir)/helm"
out=${LOCKSTEP_HELM_OUT:-$(mktemp -d)}
mkdir -p "$out"
fail=0
bad() { echo "helm check: $*" >&2; fail=1; }
# has TEXT FILE: a line of FILE contains TEXT (a trailing $: ends with it)
has() {
  awk -v p="$1" 'BEGIN { anchored = sub(/[$]$/, "", p) }
    { i = index($0, p); if (i && (!anchored || i + length(p) - 1 == length($0))) { found = 1; exit } }
    END { exit !found }' "$2"
}

# file -> patterns its output must contain (|-separated) ; patterns it must not
declare -A MUST=(
  [nats-rest-values.yaml]='kind: Deployment|replicas: 2|kind: PodDisruptionBudget|kind: ServiceMonitor|[leader_election]|rest_url = "http://slurm-restapi.slurm.svc:6820"|jwt_file = "/run/secrets/slurm-jwt/token"|image: lockstep.local/lockstep:0.1.0$|runAsUser: 65532'
  [nats-scontrol-values.yaml]='kind: Deployment|replicas: 3|name: munged|restartPolicy: Always|image: lockstep.local/lockstep:0.1.0-slurm22.05|slurm_conf = "/etc/slurm/slurm.conf"|hostNetwork: true|dnsPolicy: ClusterFirstWithHostNet|name: KUBERNETES_SERVICE_HOST|runAsUser: 0|mountPath: /run/munge'
  [embedded-values.yaml]='kind: StatefulSet|volumeClaimTemplates|storageClassName: fast-local|storage: 20Gi|replicas: 1'
  [embedded-emptydir-values.yaml]='kind: StatefulSet|replicas: 1|emptyDir'
)
declare -A MUST_NOT=(
  [nats-rest-values.yaml]='name: munged|hostNetwork|kind: StatefulSet|slurm_conf'
  [nats-scontrol-values.yaml]='kind: ServiceMonitor|kind: StatefulSet'
  [embedded-values.yaml]='kind: Deployment|kind: PodDisruptionBudget|[leader_election]|nats_url|kind: Role$'
  [embedded-emptydir-values.yaml]='volumeClaimTemplates|kind: Service$|[slurm]|kind: PodDisruptionBudget'
)

for values in "$chart"/ci/*.yaml; do
  name=$(basename "$values")
  if ! "$helm" lint --strict "$chart" -f "$values" > "$out/$name.lint" 2>&1; then
    bad "helm lint --strict -f ci/$name failed:"; cat "$out/$name.lint" >&2; continue
  fi
  if ! "$helm" template lockstep "$chart" -n lockstep-system -f "$values" > "$out/$name.rendered.yaml" 2> "$out/$name.err"; then
    bad "helm template -f ci/$name failed:"; cat "$out/$name.err" >&2; continue
  fi
  IFS='|' read -r -a must <<< "${MUST[$name]:-}"
  for p in "${must[@]}"; do
    has "$p" "$out/$name.rendered.yaml" || bad "ci/$name: rendered manifests lack '$p'"
  done
  IFS='|' read -r -a must_not <<< "${MUST_NOT[$name]:-}"
  for p in "${must_not[@]}"; do
    has "$p" "$out/$name.rendered.yaml" && bad "ci/$name: rendered manifests contain '$p'"
  done
  echo "ok  ci/$name: lint, template ($(grep -c '^kind:' "$out/$name.rendered.yaml") objects)"
done

# Values the chart must refuse, and what it must say.
refuse() { # EXPECTED-MESSAGE HELM-TEMPLATE-ARGS...
  local want=$1; shift
  local err
  if err=$("$helm" template lockstep "$chart" "$@" 2>&1 >/dev/null); then
    bad "helm template $* was accepted"
  elif ! grep -qF -- "$want" <<< "$err"; then
    bad "helm template $*: expected '$want' in: $err"
  else
    echo "ok  refused: $* ($want)"
  fi
}
refuse "/nats/url"   # the schema: mode nats needs a URL
refuse "replicas" --set nats.url=nats://n:4222 --set replicas=2
refuse "mode" --set nats.url=nats://n:4222 --set mode=sqlite
refuse "replicaCount" --set nats.url=nats://n:4222 --set replicaCount=0
refuse "slurm.scontrol.slurmConf.existingConfigMap is required" --set nats.url=nats://n:4222 --set slurm.scontrol.enabled=true
refuse "restUrl" --set nats.url=nats://n:4222 --set slurm.restUrl=slurmrestd:6820

exit $fail
