{{/* The name of the release's objects. */}}
{{- define "arbiter.fullname" -}}
{{- if contains "arbiter" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-arbiter" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "arbiter.selectorLabels" -}}
app.kubernetes.io/name: arbiter
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "arbiter.labels" -}}
{{ include "arbiter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
