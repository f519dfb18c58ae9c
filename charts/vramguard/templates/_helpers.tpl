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

{{- define "vramguard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "vramguard.tlsSecret" -}}
{{- if .Values.tls.existingSecret -}}{{ .Values.tls.existingSecret }}{{- else -}}{{ include "vramguard.fullname" . }}-webhook-tls{{- end -}}
{{- end -}}
