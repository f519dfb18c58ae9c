{{- define "vramguard.name" -}}vramguard{{- end -}}

{{- define "vramguard.fullname" -}}
{{- if contains "vramguard" .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-vramguard" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "vramguard.labels" -}}
app.kubernetes.io/name: vramguard
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Pod selector of one component: include with (list . "webhook"). */}}
{{- define "vramguard.selector" -}}
app.kubernetes.io/name: vramguard
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "vramguard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "vramguard.agentImage" -}}
{{ .Values.agent.image.repository }}:{{ .Values.agent.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "vramguard.tlsSecret" -}}
{{- if eq .Values.tls.mode "secret" -}}{{ .Values.tls.secret.name }}{{- else -}}{{ include "vramguard.fullname" . }}-webhook-tls{{- end -}}
{{- end -}}

{{- define "vramguard.serviceHost" -}}
{{ include "vramguard.fullname" . }}.{{ .Release.Namespace }}.svc
{{- end -}}

{{/*
Combinations values.schema.json cannot express. Each message names the value and what
would be valid. Rendered once, from deployment.yaml.
*/}}
{{- define "vramguard.validate" -}}
{{- $v := .Values -}}
{{- if and (eq $v.tls.mode "secret") (not $v.tls.secret.name) -}}
{{- fail "tls.mode=secret needs tls.secret.name: a kubernetes.io/tls Secret in the release namespace (or tls.mode=certManager, or tls.mode=generated)" -}}
{{- end -}}
{{- if and (eq $v.tls.mode "secret") (not $v.tls.secret.caBundle) -}}
{{- fail "tls.mode=secret needs tls.secret.caBundle: the base64 PEM of the CA that signed tls.secret.name, so the API server can trust the webhook" -}}
{{- end -}}
{{- if and (ne $v.tls.mode "secret") (or $v.tls.secret.name $v.tls.secret.caBundle) -}}
{{- fail (printf "tls.secret.name and tls.secret.caBundle are only read with tls.mode=secret; tls.mode is %s" $v.tls.mode) -}}
{{- end -}}
{{- if and (ne $v.tls.mode "certManager") $v.tls.certManager.issuerRef -}}
{{- fail (printf "tls.certManager.issuerRef is only read with tls.mode=certManager; tls.mode is %s" $v.tls.mode) -}}
{{- end -}}
{{- if and $v.webhook.podDisruptionBudget.enabled (le (int $v.webhook.replicas) (int $v.webhook.podDisruptionBudget.minAvailable)) -}}
{{- fail (printf "webhook.podDisruptionBudget.minAvailable=%d with webhook.replicas=%d would block every node drain: raise webhook.replicas above it, or set webhook.podDisruptionBudget.enabled=false" (int $v.webhook.podDisruptionBudget.minAvailable) (int $v.webhook.replicas)) -}}
{{- end -}}
{{- if and (eq $v.webhook.failurePolicy "Fail") (lt (int $v.webhook.replicas) 2) -}}
{{- fail "webhook.failurePolicy=Fail with webhook.replicas=1: every restart of the one replica blocks TrainingJob admission; use 2 or more replicas, or failurePolicy=Ignore" -}}
{{- end -}}
{{- if and (gt (int $v.agent.verifyMiB) 0) (not $v.agent.nvrtcHostPath) -}}
{{- fail "agent.verifyMiB > 0 needs NVRTC (libnvrtc.so), which the agent image does not carry: set agent.nvrtcHostPath to a host directory holding it, or agent.verifyMiB=0" -}}
{{- end -}}
{{- if and $v.agent.nvrtcHostPath (eq (int $v.agent.verifyMiB) 0) -}}
{{- fail "agent.nvrtcHostPath is only used by the memory check: set agent.verifyMiB above 0, or leave agent.nvrtcHostPath empty" -}}
{{- end -}}
{{- end -}}
