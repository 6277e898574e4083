{{/* Names, labels and the shared container pieces of the three control-plane services. */}}

{{- define "sandpod.name" -}}sandpod{{- end }}

{{/* <release>-sandpod, or the release name alone when it already says sandpod. */}}
{{- define "sandpod.fullname" -}}
{{- if contains "sandpod" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-sandpod" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{- define "sandpod.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "sandpod.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandpod
{{- end }}

{{/* Selector labels of one service; call with (dict "root" $ "component" "gateway"). */}}
{{- define "sandpod.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandpod.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "sandpod.componentLabels" -}}
{{ include "sandpod.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "sandpod.serviceAccountName" -}}
{{- printf "%s-%s" (include "sandpod.fullname" .root) .component -}}
{{- end }}

{{- define "sandpod.image" -}}
{{- printf "%s/sandpod-%s:%s" .root.Values.image.repository .component (.root.Values.image.tag | default .root.Chart.AppVersion) -}}
{{- end }}

{{/* The NATS URL every service uses: natsUrl, else the bundled subchart's client Service. */}}
{{- define "sandpod.natsUrl" -}}
{{- if .Values.natsUrl -}}
{{- .Values.natsUrl -}}
{{- else if .Values.bundledNats.enabled -}}
{{- printf "nats://%s-nats.%s.svc:4222" (include "sandpod.fullname" .) .Release.Namespace -}}
{{- else if .Values.nats.enabled -}}
{{- $name := .Values.nats.fullnameOverride | default (ternary .Release.Name (printf "%s-nats" .Release.Name) (contains "nats" .Release.Name)) -}}
{{- printf "nats://%s.%s.svc:4222" ($name | trunc 63 | trimSuffix "-") .Release.Namespace -}}
{{- else -}}
{{- fail "natsUrl is required when nats.enabled=false (the services need a NATS server)" -}}
{{- end -}}
{{- end }}

{{/* Env every service gets (each service's settings.py documents its variables). */}}
{{- define "sandpod.commonEnv" -}}
- name: SANDPOD_NATS_URL
  value: {{ include "sandpod.natsUrl" . | quote }}
- name: SANDPOD_PREFIX
  value: {{ .Values.prefix | quote }}
- name: SANDPOD_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
# readOnlyRootFilesystem: home, temp files and local state go to the /tmp emptyDir.
- name: HOME
  value: /tmp
- name: SANDPOD_STATE_DIR
  value: /tmp/state
{{- end }}

{{/* Env of the controllers (lifecycle, pool): cluster mode, their namespace and replica id. */}}
{{- define "sandpod.controllerEnv" -}}
{{ include "sandpod.commonEnv" . }}
- name: SANDPOD_STORE
  value: {{ .Values.store | quote }}
- name: SANDPOD_RUNTIME
  value: {{ .Values.runtime | quote }}
- name: SANDPOD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: SANDPOD_REPLICA_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
# What sandbox Pods run: the execd bundle image of this release, the default sandbox image, and
# the Secret (rendered by this chart in every sandbox namespace) holding execd's NATS URL.
- name: SANDPOD_POD_EXECD_IMAGE
  value: {{ include "sandpod.image" (dict "root" . "component" "execd") | quote }}
- name: SANDPOD_POD_NATS_SECRET
  value: {{ .Values.sandboxes.natsSecret | quote }}
{{- with .Values.sandboxes.defaultImage }}
- name: SANDPOD_POD_DEFAULT_IMAGE
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{/* Pod-level pieces shared by the three Deployments; call with (dict "root" $ "component" c). */}}
{{- define "sandpod.podSpecCommon" -}}
{{- $v := .root.Values -}}
serviceAccountName: {{ include "sandpod.serviceAccountName" . }}
{{- if ne .component "gateway" }}
automountServiceAccountToken: true
{{- else }}
automountServiceAccountToken: false
{{- end }}
securityContext:
  {{- toYaml $v.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $v.topologySpread.enabled }}
topologySpreadConstraints:
{{- range $v.topologySpread.topologyKeys }}
  - maxSkew: {{ $v.topologySpread.maxSkew }}
    topologyKey: {{ . }}
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "sandpod.selectorLabels" $ | nindent 8 }}
{{- end }}
{{- end }}
volumes:
  # readOnlyRootFilesystem: the only writable place is this scratch dir (HOME, TMPDIR, state).
  - name: tmp
    emptyDir:
      sizeLimit: 256Mi
{{- with $v.natsAuth.secret }}
  # This service's NATS creds (and, for lifecycle, the account seed): only its own keys.
  - name: nats-auth
    secret:
      secretName: {{ . }}
      defaultMode: 0400
      items:
        - key: {{ $.component }}.creds
          path: nats.creds
        {{- if or (eq $.component "lifecycle") (and (eq $.component "gateway") $v.natsAuth.tenantCredentials) }}
        - key: account.seed
          path: account.seed
        {{- end }}
{{- end }}
{{- end }}

{{- define "sandpod.containerCommon" -}}
image: {{ include "sandpod.image" . }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
securityContext:
  {{- toYaml .root.Values.securityContext | nindent 2 }}
volumeMounts:
  - name: tmp
    mountPath: /tmp
{{- if .root.Values.natsAuth.secret }}
  - name: nats-auth
    mountPath: /etc/sandpod/nats
    readOnly: true
{{- end }}
{{- end }}

{{/* NATS operator mode: the service's creds file (and lifecycle's account seed). */}}
{{- define "sandpod.natsAuthEnv" -}}
{{- if .root.Values.natsAuth.secret }}
- name: SANDPOD_NATS_CREDS
  value: /etc/sandpod/nats/nats.creds
{{- if or (eq .component "lifecycle") (and (eq .component "gateway") .root.Values.natsAuth.tenantCredentials) }}
- name: SANDPOD_NATS_ACCOUNT_SEED_FILE
  value: /etc/sandpod/nats/account.seed
{{- end }}
{{- end }}
{{- end }}
