{{/* Names and labels. */}}
{{- define "vlembed.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "vlembed.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vlembed.labels" -}}
{{ include "vlembed.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Secret holding the API key, or "" when no key is configured. */}}
{{- define "vlembed.apiKeySecret" -}}
{{- if and .Values.apiKey.existingSecret .Values.apiKey.create -}}
{{- fail "apiKey: set existingSecret or create, not both" -}}
{{- else if .Values.apiKey.existingSecret -}}
{{- .Values.apiKey.existingSecret -}}
{{- else if .Values.apiKey.create -}}
{{- if not .Values.apiKey.value -}}
{{- fail "apiKey.create needs apiKey.value (or use apiKey.existingSecret)" -}}
{{- end -}}
{{- printf "%s-api-key" (include "vlembed.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The model volume source: exactly one of existingClaim, hostPath, persistence. */}}
{{- define "vlembed.modelClaim" -}}
{{- $m := .Values.model -}}
{{- $n := 0 -}}
{{- if $m.existingClaim }}{{ $n = add1 $n }}{{ end -}}
{{- if $m.hostPath }}{{ $n = add1 $n }}{{ end -}}
{{- if $m.persistence.enabled }}{{ $n = add1 $n }}{{ end -}}
{{- if ne (int $n) 1 -}}
{{- fail "model: set exactly one of existingClaim, hostPath, persistence.enabled" -}}
{{- end -}}
{{- if $m.existingClaim -}}
{{- $m.existingClaim -}}
{{- else if $m.persistence.enabled -}}
{{- printf "%s-models" (include "vlembed.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "vlembed.modelVolume" -}}
- name: models
{{- $claim := include "vlembed.modelClaim" . }}
{{- if $claim }}
  persistentVolumeClaim:
    claimName: {{ $claim }}
    readOnly: true
{{- else }}
  hostPath:
    path: {{ .Values.model.hostPath }}
    type: Directory
{{- end }}
{{- end -}}

{{/* VLEMBED_BACKENDS: TASK=http://127.0.0.1:PORT for each llama-server container. */}}
{{- define "vlembed.backends" -}}
{{- $urls := list -}}
{{- range $i, $task := .Values.model.tasks -}}
{{- $urls = append $urls (printf "%s=http://127.0.0.1:%d" $task (add (int $.Values.llamaServer.port) $i)) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/* Resources of one llama-server container: computed from the variant unless given. */}}
{{- define "vlembed.llamaResources" -}}
{{- $l := .Values.llamaServer -}}
{{- if $l.resources -}}
{{- toYaml $l.resources -}}
{{- else -}}
{{- $size := index $l.sizing .Values.model.variant -}}
{{- if not $size -}}
{{- fail (printf "llamaServer.sizing has no entry for model.variant %q" .Values.model.variant) -}}
{{- end -}}
{{- $mib := add (int $size.modelMiB) (int $l.headroomMiB) -}}
{{- if $l.kvInMemory -}}
{{- /* f16 KV cache: 36 layers x (K, V) x 2 KV heads x 128 x 2 B = 36,864 B per token */ -}}
{{- $kv := mul 36864 (int .Values.ctxSize) (int .Values.parallel) -}}
{{- $mib = add $mib (div (add $kv 1048575) 1048576) -}}
{{- end -}}
{{- $mib = mul (div (add $mib 255) 256) 256 -}}
requests:
  memory: {{ printf "%dMi" $mib }}
  {{- if $l.threads }}
  cpu: {{ $l.threads | quote }}
  {{- else if $l.cpuRequest }}
  cpu: {{ $l.cpuRequest | quote }}
  {{- end }}
limits:
  memory: {{ printf "%dMi" $mib }}
  {{- if $l.threads }}
  cpu: {{ $l.threads | quote }}
  {{- end }}
  {{- if $l.gpus }}
  nvidia.com/gpu: {{ $l.gpus }}
  {{- end }}
{{- end -}}
{{- end -}}

{{- define "vlembed.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}
