{{/* Chart name, truncated to a DNS label. */}}
{{- define "leasehold.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of object names: the release name, unless it already contains the chart name. */}}
{{- define "leasehold.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "leasehold.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "leasehold.labels" -}}
helm.sh/chart: {{ include "leasehold.chart" . }}
{{ include "leasehold.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: leasehold
{{- end }}

{{/* Labels that select the controller pods. */}}
{{- define "leasehold.selectorLabels" -}}
app.kubernetes.io/name: {{ include "leasehold.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "leasehold.controllerName" -}}
{{- printf "%s-controller" (include "leasehold.fullname" .) }}
{{- end }}

{{- define "leasehold.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "leasehold.controllerName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The controller's user name, as the apiserver authenticates its ServiceAccount token. */}}
{{- define "leasehold.controllerUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "leasehold.serviceAccountName" .) }}
{{- end }}

{{- define "leasehold.webhookService" -}}
{{- printf "%s-webhook" (include "leasehold.fullname" .) }}
{{- end }}

{{- define "leasehold.tlsSecret" -}}
{{- printf "%s-webhook-tls" (include "leasehold.fullname" .) }}
{{- end }}

{{- define "leasehold.certificate" -}}
{{- printf "%s-webhook" (include "leasehold.fullname" .) }}
{{- end }}

{{/* repository:tag or repository@digest. */}}
{{- define "leasehold.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The sidecar image: the controller's unless overridden. */}}
{{- define "leasehold.sidecarImage" -}}
{{- $repository := default .Values.image.repository .Values.sidecar.image.repository }}
{{- if .Values.sidecar.image.tag }}
{{- printf "%s:%s" $repository .Values.sidecar.image.tag }}
{{- else if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The DNS names of the webhook Service, for its certificate. */}}
{{- define "leasehold.webhookDnsNames" -}}
{{- $svc := include "leasehold.webhookService" . }}
{{- list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.%s" $svc .Release.Namespace .Values.clusterDomain) | toJson }}
{{- end }}

{{/* Namespaces the webhooks never see: the configured ones and the release's own. */}}
{{- define "leasehold.webhookNamespaceSelector" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values:
      {{- range (append .Values.webhook.excludeNamespaces .Release.Namespace | uniq) }}
      - {{ . | quote }}
      {{- end }}
{{- end }}

{{/* A memory quantity (plain bytes, or with a k/M/G/T or Ki/Mi/Gi/Ti suffix) in bytes. */}}
{{- define "leasehold.quantityBytes" -}}
{{- $quantity := toString . }}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 }}
{{- $number := regexFind "^[0-9]+" $quantity }}
{{- $suffix := trimPrefix $number $quantity }}
{{- if or (not $number) (not (hasKey $units $suffix)) }}
{{- fail (printf "memory quantity %q: expected a whole number of bytes, optionally with a k, M, G, T, Ki, Mi, Gi or Ti suffix" $quantity) }}
{{- end }}
{{- mul (atoi $number) (get $units $suffix) }}
{{- end }}

{{/* PromQL label matchers of this release's controller series. */}}
{{- define "leasehold.controllerMatchers" -}}
{{- .Values.metrics.prometheusRule.controllerSelector | default (printf "namespace=%q" .Release.Namespace) }}
{{- end }}
