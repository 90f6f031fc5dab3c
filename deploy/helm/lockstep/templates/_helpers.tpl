{{/* Names, labels, the image, and lockstep.toml. */}}

{{- define "lockstep.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lockstep.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "lockstep.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lockstep.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "lockstep.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "lockstep.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "lockstep.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lockstep.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "lockstep.replicas" -}}
{{- if eq .Values.mode "embedded" }}1{{ else }}{{ .Values.replicaCount }}{{ end }}
{{- end }}

{{- define "lockstep.image" -}}
{{- $tag := .Values.image.tag }}
{{- if not $tag }}
{{- $tag = .Chart.AppVersion }}
{{- if .Values.slurm.scontrol.enabled }}
{{- $tag = printf "%s-slurm%s" $tag .Values.slurm.scontrol.slurmVersion }}
{{- end }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/*
lockstep.toml. Paths are the pod's: config and policy from their ConfigMaps,
the store on the data volume, the JWT from its Secret, slurm.conf from its
ConfigMap.
*/}}
{{- define "lockstep.config" -}}
data_dir = "/var/lib/lockstep"
policy_file = "/etc/lockstep/policy/policy.json"
[log]
{{- if eq .Values.mode "nats" }}
nats_url = {{ required "nats.url is required in mode nats" .Values.nats.url | quote }}
{{- end }}
duplicate_window_s = {{ int64 .Values.nats.duplicateWindowSeconds }}
max_age_s = {{ int64 .Values.nats.maxAgeSeconds }}
max_bytes = {{ int64 .Values.nats.maxBytes }}
[service]
batch_max = {{ int64 .Values.loop.batchMax }}
read_wait_ms = {{ int64 .Values.loop.readWaitMs }}
tick_interval_ms = {{ int64 .Values.loop.tickIntervalMs }}
policy_poll_ms = {{ int64 .Values.loop.policyPollMs }}
checkpoint_every_records = {{ int64 .Values.loop.checkpointEveryRecords }}
checkpoint_every_ms = {{ int64 .Values.loop.checkpointEveryMs }}
snapshot_every_ms = {{ int64 .Values.loop.snapshotEveryMs }}
snapshots_kept = {{ int64 .Values.loop.snapshotsKept }}
{{- if hasKey .Values.loop "retentionSeconds" }}
retention_s = {{ int64 .Values.loop.retentionSeconds }}
{{- end }}
transparent_huge_pages = {{ .Values.loop.transparentHugePages }}
[telemetry]
listen = "0.0.0.0:{{ .Values.telemetry.port }}"
log_format = {{ .Values.telemetry.logFormat | quote }}
[kubernetes]
observe = {{ .Values.kubernetes.observe }}
actuate = {{ .Values.kubernetes.actuate }}
node_labels = {{ .Values.kubernetes.nodeLabels | toJson }}
actions_in_flight_max = {{ int64 .Values.kubernetes.actionsInFlightMax }}
{{- if or .Values.slurm.restUrl .Values.slurm.scontrol.enabled }}
[slurm]
{{- with .Values.slurm.restUrl }}
rest_url = {{ . | quote }}
{{- end }}
rest_user = {{ .Values.slurm.restUser | quote }}
{{- if .Values.slurm.jwt.existingSecret }}
jwt_file = "/run/secrets/slurm-jwt/{{ .Values.slurm.jwt.key }}"
{{- end }}
{{- if .Values.slurm.scontrol.enabled }}
slurm_conf = "/etc/slurm/slurm.conf"
{{- if and .Values.slurm.restUrl .Values.slurm.scontrol.listNodes }}
nodes_through_scontrol = true
{{- end }}
{{- end }}
poll_interval_ms = {{ int64 .Values.slurm.pollIntervalMs }}
{{- if .Values.slurm.jobsPollIntervalMs }}
jobs_poll_interval_ms = {{ int64 .Values.slurm.jobsPollIntervalMs }}
{{- end }}
resync_every_polls = {{ int64 .Values.slurm.resyncEveryPolls }}
observe = {{ .Values.slurm.observe }}
actuate = {{ .Values.slurm.actuate }}
{{- end }}
{{- if eq .Values.mode "nats" }}
[leader_election]
# namespace and identity: POD_NAMESPACE and POD_NAME
lease_name = {{ default (include "lockstep.fullname" .) .Values.leaderElection.leaseName | quote }}
lease_duration_ms = {{ int64 .Values.leaderElection.leaseDurationMs }}
renew_deadline_ms = {{ int64 .Values.leaderElection.renewDeadlineMs }}
retry_period_ms = {{ int64 .Values.leaderElection.retryPeriodMs }}
{{- end }}
{{- end }}

{{/* The pod template, shared by the Deployment and the StatefulSet. */}}
{{- define "lockstep.podTemplate" -}}
metadata:
  labels:
    {{- include "lockstep.selectorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    # lockstep.toml changes restart the pods; the policy does not (it
    # reaches the running service as PolicyChanged).
    checksum/config: {{ include "lockstep.config" . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "lockstep.serviceAccountName" . }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if .Values.hostNetwork }}
  hostNetwork: true
  {{- end }}
  {{- if .Values.dnsPolicy }}
  dnsPolicy: {{ .Values.dnsPolicy }}
  {{- else if .Values.hostNetwork }}
  dnsPolicy: ClusterFirstWithHostNet
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- if .Values.slurm.scontrol.enabled }}
  initContainers:
    # munged for scontrol: a sidecar (restartPolicy Always) started before lockstep.
    - name: munged
      image: {{ include "lockstep.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      restartPolicy: Always
      command: ["/usr/local/bin/lockstep-munged"]
      env:
        - name: SLURM_CONF
          value: /etc/slurm/slurm.conf
        - name: MUNGE_KEY_FILE
          value: /etc/munge-key/{{ .Values.slurm.scontrol.munge.key }}
      securityContext:
        runAsUser: 0
        runAsNonRoot: false
        allowPrivilegeEscalation: false
      resources:
        requests:
          cpu: 10m
          memory: 16Mi
        limits:
          memory: 64Mi
      volumeMounts:
        - name: slurm-conf
          mountPath: /etc/slurm
          readOnly: true
        - name: munge-key
          mountPath: /etc/munge-key
          readOnly: true
        - name: munge-socket
          mountPath: {{ .Values.slurm.scontrol.munge.socketDir }}
  {{- end }}
  containers:
    - name: lockstep
      image: {{ include "lockstep.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["run", "--config", "/etc/lockstep/config/lockstep.toml"]
      env:
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        - name: RUST_LOG
          value: {{ .Values.telemetry.logLevel | quote }}
        {{- with .Values.kubernetes.apiServer.host }}
        - name: KUBERNETES_SERVICE_HOST
          value: {{ . | quote }}
        {{- end }}
        {{- with .Values.kubernetes.apiServer.port }}
        - name: KUBERNETES_SERVICE_PORT
          value: {{ . | quote }}
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: metrics
          containerPort: {{ .Values.telemetry.port }}
          protocol: TCP
      livenessProbe:
        httpGet:
          path: /livez
          port: metrics
        {{- toYaml .Values.probes.liveness | nindent 8 }}
      readinessProbe:
        httpGet:
          path: /readyz
          port: metrics
        {{- toYaml .Values.probes.readiness | nindent 8 }}
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      securityContext:
        {{- $sc := deepCopy .Values.securityContext }}
        {{- if .Values.slurm.scontrol.enabled }}
        {{- $_ := set $sc "runAsUser" (int64 .Values.slurm.scontrol.runAsUser) }}
        {{- if eq (int64 .Values.slurm.scontrol.runAsUser) 0 }}
        {{- $_ := set $sc "runAsNonRoot" false }}
        {{- end }}
        {{- end }}
        {{- toYaml $sc | nindent 8 }}
      volumeMounts:
        - name: config
          mountPath: /etc/lockstep/config
          readOnly: true
        # A directory, not a subPath: the kubelet updates it in place when
        # the ConfigMap changes, and lockstep reads the file again.
        - name: policy
          mountPath: /etc/lockstep/policy
          readOnly: true
        - name: data
          mountPath: /var/lib/lockstep
        - name: tmp
          mountPath: /tmp
        {{- if .Values.slurm.jwt.existingSecret }}
        - name: slurm-jwt
          mountPath: /run/secrets/slurm-jwt
          readOnly: true
        {{- end }}
        {{- if .Values.slurm.scontrol.enabled }}
        - name: slurm-conf
          mountPath: /etc/slurm
          readOnly: true
        - name: munge-socket
          mountPath: {{ .Values.slurm.scontrol.munge.socketDir }}
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "lockstep.fullname" . }}-config
    - name: policy
      configMap:
        name: {{ include "lockstep.fullname" . }}-policy
    - name: tmp
      emptyDir: {}
    {{- if not (and (eq .Values.mode "embedded") .Values.embedded.persistence.enabled) }}
    # The store (and in mode embedded the log): in mode nats a cache of the
    # log that a new pod rebuilds from the newest snapshot kept in NATS and
    # the records after it.
    - name: data
      emptyDir: {}
    {{- end }}
    {{- if .Values.slurm.jwt.existingSecret }}
    - name: slurm-jwt
      secret:
        secretName: {{ .Values.slurm.jwt.existingSecret }}
    {{- end }}
    {{- if .Values.slurm.scontrol.enabled }}
    - name: slurm-conf
      configMap:
        name: {{ required "slurm.scontrol.slurmConf.existingConfigMap is required with slurm.scontrol.enabled" .Values.slurm.scontrol.slurmConf.existingConfigMap }}
        items:
          - key: {{ .Values.slurm.scontrol.slurmConf.key }}
            path: slurm.conf
    - name: munge-key
      secret:
        secretName: {{ required "slurm.scontrol.munge.keySecret is required with slurm.scontrol.enabled" .Values.slurm.scontrol.munge.keySecret }}
    - name: munge-socket
      emptyDir: {}
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  affinity:
    {{- if .Values.affinity }}
    {{- toYaml .Values.affinity | nindent 4 }}
    {{- else }}
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector:
              matchLabels:
                {{- include "lockstep.selectorLabels" . | nindent 16 }}
    {{- end }}
{{- end }}
