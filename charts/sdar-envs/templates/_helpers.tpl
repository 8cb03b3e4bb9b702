{{/*
Names, labels and the image reference shared by every template of the chart.
*/}}

{{/* The families this chart knows, in a fixed order (values keys of the same names). */}}
{{- define "sdar-envs.families" -}}
household shop searchqa
{{- end -}}

{{- define "sdar-envs.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "<release>-<chart>", or the release name alone when it already holds the chart name. */}}
{{- define "sdar-envs.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of one family's objects; call with (dict "root" $ "family" "household"). */}}
{{- define "sdar-envs.familyName" -}}
{{- $base := include "sdar-envs.fullname" .root | trunc (int (sub 62 (len .family))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base .family -}}
{{- end -}}

{{- define "sdar-envs.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the pods of the release (stable across upgrades). */}}
{{- define "sdar-envs.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sdar-envs.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sdar-envs.labels" -}}
helm.sh/chart: {{ include "sdar-envs.chart" . }}
{{ include "sdar-envs.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sdar
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one family: the release's plus the component. */}}
{{- define "sdar-envs.familySelectorLabels" -}}
{{ include "sdar-envs.selectorLabels" .root }}
app.kubernetes.io/component: {{ .family }}
{{- end -}}

{{- define "sdar-envs.familyLabels" -}}
{{ include "sdar-envs.labels" .root }}
app.kubernetes.io/component: {{ .family }}
{{- end -}}

{{- define "sdar-envs.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sdar-envs.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespaceSelector of a networkPolicy client, call with (dict "root" $ "client" .):
namespaces by name (the kubernetes.io/metadata.name label no pod can set), narrowed by
namespaceLabels; namespaceLabels alone select by those labels; neither: this release's namespace. */}}
{{- define "sdar-envs.clientNamespaces" -}}
{{- $c := .client -}}
{{- if or $c.namespaces (not $c.namespaceLabels) -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: In
    values:
      {{- toYaml (default (list .root.Release.Namespace) $c.namespaces) | nindent 6 }}
{{- end }}
{{- with $c.namespaceLabels }}
matchLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The Secret holding the operator token (existing or created), or "" when there is none. */}}
{{- define "sdar-envs.operatorSecretName" -}}
{{- if .Values.operatorToken.existingSecret -}}
{{- .Values.operatorToken.existingSecret -}}
{{- else if .Values.operatorToken.create -}}
{{- printf "%s-operator" (include "sdar-envs.fullname" . | trunc 54 | trimSuffix "-") -}}
{{- end -}}
{{- end -}}

{{/* registry/repository:tag or registry/repository@digest; global.image.registry wins. */}}
{{- define "sdar-envs.image" -}}
{{- $registry := .Values.image.registry -}}
{{- if and .Values.global .Values.global.image .Values.global.image.registry -}}
{{- $registry = .Values.global.image.registry -}}
{{- end -}}
{{- $repository := .Values.image.repository -}}
{{- if $registry -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag | toString) -}}
{{- end -}}
{{- end -}}

{{/* The imagePullSecrets block (global then chart secrets), or nothing. */}}
{{- define "sdar-envs.imagePullSecrets" -}}
{{- $secrets := concat (default (list) (and .Values.global .Values.global.imagePullSecrets)) .Values.imagePullSecrets -}}
{{- with $secrets -}}
imagePullSecrets:
{{ toYaml . }}
{{- end -}}
{{- end -}}

{{/* Fail early, with the fix, on value combinations the schema cannot express clearly. */}}
{{- define "sdar-envs.validate" -}}
{{- $h := .Values.household -}}
{{- if and $h.enabled (eq $h.backend "alfworld") (not $h.alfworld.dataPVC) -}}
{{- fail "household.backend=alfworld needs the ALFWorld games: set household.alfworld.dataPVC to the name of a PersistentVolumeClaim that holds json_2.1.1/ (as alfworld-download lays it out), or use household.backend=sim" -}}
{{- end -}}
{{- if eq (int .Values.probePort) (int .Values.containerPort) -}}
{{- fail (printf "probePort and containerPort are both %d: the probe port must be a port of its own (outside the clients' connection limits), e.g. probePort=8081" (int .Values.containerPort)) -}}
{{- end -}}
{{- $np := .Values.networkPolicy -}}
{{- if and $np.enabled $np.pinServiceAccounts (semverCompare "<1.30.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "networkPolicy.pinServiceAccounts needs Kubernetes >= 1.30 (ValidatingAdmissionPolicy v1), this cluster is %s: upgrade, or set networkPolicy.pinServiceAccounts=false and keep other pods from wearing the clients' podLabels another way" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- $any := false -}}
{{- range $family := splitList " " (include "sdar-envs.families" .) -}}
{{- if (index $.Values $family).enabled -}}{{- $any = true -}}{{- end -}}
{{- end -}}
{{- if not $any -}}
{{- fail "every family is disabled (household.enabled, shop.enabled, searchqa.enabled are all false): enable at least one, or do not install the chart" -}}
{{- end -}}
{{- end -}}
