{{/* The chart's name, at most 63 characters. */}}
{{- define "outboxd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' base name: the release's name when it contains the
chart's (a release named outboxd makes objects named outboxd-*, as the
plain manifests in deploy/kubernetes). */}}
{{- define "outboxd.fullname" -}}
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

{{- define "outboxd.labels" -}}
app.kubernetes.io/name: {{ include "outboxd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ include "outboxd.tag" . | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Every pod of the release, relay and migration alike. */}}
{{- define "outboxd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outboxd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The relay's pods. */}}
{{- define "outboxd.relayLabels" -}}
{{ include "outboxd.selectorLabels" . }}
app.kubernetes.io/component: relay
{{- end }}

{{- define "outboxd.tag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "outboxd.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "outboxd.tag" .) }}
{{- end }}

{{- define "outboxd.relaySecret" -}}
{{- default (printf "%s-secrets" (include "outboxd.fullname" .)) .Values.secrets.relay }}
{{- end }}

{{- define "outboxd.migrateSecret" -}}
{{- default (printf "%s-migrate-secrets" (include "outboxd.fullname" .)) .Values.secrets.migrate }}
{{- end }}

{{- define "outboxd.tokenSecret" -}}
{{- default (printf "%s-http-token" (include "outboxd.fullname" .)) .Values.httpToken.existingSecret }}
{{- end }}

{{/* idempotency.store as the relay resolves it: the contract's default
is postgres with lock.backend postgres, else redis. */}}
{{- define "outboxd.idempotencyStore" -}}
{{- if .Values.idempotency.store }}{{ .Values.idempotency.store }}
{{- else if eq .Values.lock.backend "postgres" }}postgres
{{- else }}redis
{{- end }}
{{- end }}

{{/* "true" when the leases or the idempotency marks are in Redis. */}}
{{- define "outboxd.needsRedis" -}}
{{- if or (eq .Values.lock.backend "redis") (eq (include "outboxd.idempotencyStore" .) "redis") }}true{{ end }}
{{- end }}

{{/* The Secrets of the lease's and marks' servers, mounted as files in
the relay container: a YAML list of {name, secretName, mountPath}. */}}
{{- define "outboxd.serverSecrets" -}}
{{- $out := list }}
{{- if include "outboxd.needsRedis" . }}
{{- with .Values.redis.passwordSecret.name }}
{{- $out = append $out (dict "name" "redis-auth" "secretName" . "mountPath" "/etc/outboxd/redis-auth") }}
{{- end }}
{{- if .Values.redis.tls.enabled }}{{ with .Values.redis.tls.secretName }}
{{- $out = append $out (dict "name" "redis-tls" "secretName" . "mountPath" "/etc/outboxd/redis-tls") }}
{{- end }}{{ end }}
{{- end }}
{{- if eq .Values.lock.backend "etcd" }}
{{- with .Values.lock.etcd.passwordSecret.name }}
{{- $out = append $out (dict "name" "etcd-auth" "secretName" . "mountPath" "/etc/outboxd/etcd-auth") }}
{{- end }}
{{- if .Values.lock.etcd.tls.enabled }}{{ with .Values.lock.etcd.tls.secretName }}
{{- $out = append $out (dict "name" "etcd-tls" "secretName" . "mountPath" "/etc/outboxd/etcd-tls") }}
{{- end }}{{ end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* A client TLS section (redis.tls, lock.etcd.tls) from its values
(.tls) and the directory its Secret is mounted at (.dir). */}}
{{- define "outboxd.tlsConfig" -}}
{{- if .tls.enabled }}
tls:
  enabled: true
  {{- if and .tls.secretName .tls.caFile }}
  ca_file: {{ printf "%s/%s" .dir .tls.caFile }}
  {{- end }}
  {{- if and .tls.secretName .tls.certFile }}
  cert_file: {{ printf "%s/%s" .dir .tls.certFile }}
  {{- end }}
  {{- if and .tls.secretName .tls.keyFile }}
  key_file: {{ printf "%s/%s" .dir .tls.keyFile }}
  {{- end }}
  {{- with .tls.serverName }}
  server_name: {{ . | quote }}
  {{- end }}
{{- end }}
{{- end }}

{{/* The keys of config.yaml the chart sets itself: where each secret is
mounted, the lease backend and its servers, the operations port. */}}
{{- define "outboxd.managedConfig" -}}
postgres:
  dsn_file: /etc/outboxd/secrets/postgres-dsn
lock:
  backend: {{ .Values.lock.backend }}
  {{- if eq .Values.lock.backend "etcd" }}
  etcd:
    endpoints: {{ toJson .Values.lock.etcd.endpoints }}
    {{- with .Values.lock.etcd.username }}
    username: {{ . | quote }}
    {{- end }}
    {{- if .Values.lock.etcd.passwordSecret.name }}
    password_file: /etc/outboxd/etcd-auth/{{ .Values.lock.etcd.passwordSecret.key }}
    {{- end }}
    {{- include "outboxd.tlsConfig" (dict "tls" .Values.lock.etcd.tls "dir" "/etc/outboxd/etcd-tls") | nindent 4 }}
  {{- end }}
{{- with .Values.idempotency.store }}
idempotency:
  store: {{ . }}
{{- end }}
{{- if include "outboxd.needsRedis" . }}
redis:
  addrs: {{ toJson .Values.redis.addrs }}
  mode: {{ .Values.redis.mode }}
  key_prefix: {{ .Values.redis.keyPrefix | quote }}
  {{- with .Values.redis.masterName }}
  master_name: {{ . | quote }}
  {{- end }}
  {{- with .Values.redis.username }}
  username: {{ . | quote }}
  {{- end }}
  {{- if .Values.redis.passwordSecret.name }}
  password_file: /etc/outboxd/redis-auth/{{ .Values.redis.passwordSecret.key }}
  {{- end }}
  {{- include "outboxd.tlsConfig" (dict "tls" .Values.redis.tls "dir" "/etc/outboxd/redis-tls") | nindent 2 }}
{{- end }}
http:
  addr: {{ printf "0.0.0.0:%v" .Values.service.port | quote }}
  auth_token_file: /etc/outboxd/http-token/{{ .Values.httpToken.key }}
{{- end }}

{{/* config.yaml: .Values.config with the managed keys over it. */}}
{{- define "outboxd.config" -}}
{{- $managed := include "outboxd.managedConfig" . | fromYaml }}
{{- if hasKey $managed "Error" }}
{{- fail (printf "outboxd.managedConfig: %s" $managed.Error) }}
{{- end }}
{{- toYaml (mergeOverwrite (deepCopy .Values.config) $managed) }}
{{- end }}

{{/* The ports a list of addresses (host:port or URL) names, each once;
def when an address names none. */}}
{{- define "outboxd.ports" -}}
{{- $ports := list }}
{{- range .addrs }}
{{- $p := regexFind "[0-9]+$" (regexFind ":[0-9]+/?$" .) }}
{{- $ports = append $ports (default (toString $.def) $p | atoi) }}
{{- end }}
{{- toJson (uniq $ports) }}
{{- end }}
