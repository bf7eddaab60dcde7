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
{{- include "gcagent.natsKeysOf" .Values.nats -}}
{{- end -}}

{{/* The keys a Secret holds for nats values (the agent's nats, or cluster.nats), as a JSON list. */}}
{{- define "gcagent.natsKeysOf" -}}
{{- $keys := list -}}
{{- if .existingSecret -}}
{{- $keys = .existingSecretKeys -}}
{{- else -}}
{{- $a := .auth -}}
{{- range $k, $v := dict "creds" $a.creds "nkey" $a.nkeySeed "password" $a.password "token" $a.token "ca.crt" $a.tlsCA "tls.crt" $a.tlsCert "tls.key" $a.tlsKey -}}
{{- if $v }}{{ $keys = append $keys $k }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toJson $keys -}}
{{- end -}}

{{/* The cluster component's name, <fullname>-cluster: gcagent-cluster for the release gcagent. */}}
{{- define "gcagent.cluster.fullname" -}}
{{- printf "%s-cluster" (include "gcagent.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{/* The cluster component's selector labels (a Deployment's selector cannot change). */}}
{{- define "gcagent.cluster.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-cluster
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The cluster component's NATS Secret. */}}
{{- define "gcagent.cluster.natsSecret" -}}
{{- .Values.cluster.nats.existingSecret | default (printf "%s-nats" (include "gcagent.cluster.fullname" .)) -}}
{{- end -}}

{{/* The cluster component's NATS URL: cluster.nats.url, else the agents' nats.url; neither is an error. */}}
{{- define "gcagent.cluster.natsURL" -}}
{{- if not .Values.nats.url -}}
{{- fail "cluster.enabled needs the agents on a fleet NATS: set nats.url (every agent's --nats-url; the embedded per-node servers listen on each node's loopback, out of the cluster's reach)" -}}
{{- end -}}
{{- .Values.cluster.nats.url | default .Values.nats.url -}}
{{- end -}}
