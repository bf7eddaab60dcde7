{{/* The name of every object: the release name, or release-chart when the release name lacks the chart's. */}}
{{- define "gcagent.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The selector labels: fixed, since a DaemonSet's selector cannot change. */}}
{{- define "gcagent.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
{{- end -}}

{{/* A value as the agent reads it: numbers without an exponent, the rest as they are. */}}
{{- define "gcagent.setting" -}}
{{- if kindIs "float64" . -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- end -}}

{{/* The NATS Secret's name, and the keys it holds (a list). */}}
{{- define "gcagent.natsSecret" -}}
{{- .Values.nats.existingSecret | default (printf "%s-nats" (include "gcagent.fullname" .)) -}}
{{- end -}}
{{- define "gcagent.natsKeys" -}}
{{- $keys := list -}}
{{- if .Values.nats.existingSecret -}}
{{- $keys = .Values.nats.existingSecretKeys -}}
{{- else -}}
{{- $a := .Values.nats.auth -}}
{{- range $k, $v := dict "creds" $a.creds "nkey" $a.nkeySeed "password" $a.password "token" $a.token "ca.crt" $a.tlsCA "tls.crt" $a.tlsCert "tls.key" $a.tlsKey -}}
{{- if $v }}{{ $keys = append $keys $k }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toJson $keys -}}
{{- end -}}
