{{/* The chart's name (nameOverride replaces it). */}}
{{- define "arbiter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The name of the release's objects (fullnameOverride replaces it). */}}
{{- define "arbiter.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "arbiter.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "arbiter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "arbiter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "arbiter.labels" -}}
{{ include "arbiter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
The operator's image: [REGISTRY/]REPOSITORY, then @DIGEST if one is set, else :TAG (default:
the chart's appVersion). global.imageRegistry wins over image.registry.
*/}}
{{- define "arbiter.image" -}}
{{- $registry := (.Values.global).imageRegistry | default .Values.image.registry -}}
{{- $name := .Values.image.repository -}}
{{- if $registry }}{{ $name = printf "%s/%s" $registry $name }}{{ end -}}
{{- if .Values.image.digest -}}
{{ $name }}@{{ .Values.image.digest }}
{{- else -}}
{{ $name }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The namespaces the operator arbitrates, as a JSON list (empty: all): operator.watchNamespaces
     and operator.watchNamespace together. */}}
{{- define "arbiter.watchNamespaces" -}}
{{- $l := list -}}
{{- range .Values.operator.watchNamespaces }}{{- if . }}{{- $l = append $l . -}}{{- end }}{{- end -}}
{{- with .Values.operator.watchNamespace }}{{- $l = append $l . -}}{{- end -}}
{{- $l | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* operator.namespaceSelector (a LabelSelector) as a label selector string for
     --namespace-selector (empty: none). Fails when combined with watchNamespaces. */}}
{{- define "arbiter.namespaceSelector" -}}
{{- $s := .Values.operator.namespaceSelector | default dict -}}
{{- $parts := list -}}
{{- range $k, $v := ($s.matchLabels | default dict) }}{{- $parts = append $parts (printf "%s=%s" $k $v) -}}{{- end -}}
{{- range ($s.matchExpressions | default list) -}}
{{- if eq .operator "In" }}{{- $parts = append $parts (printf "%s in (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "NotIn" }}{{- $parts = append $parts (printf "%s notin (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "Exists" }}{{- $parts = append $parts .key -}}
{{- else }}{{- $parts = append $parts (printf "!%s" .key) -}}
{{- end -}}
{{- end -}}
{{- if and $parts (include "arbiter.watchNamespaces" . | fromJsonArray) -}}
{{- fail "operator.namespaceSelector cannot be combined with operator.watchNamespaces (or watchNamespace)" -}}
{{- end -}}
{{- join "," $parts -}}
{{- end -}}
