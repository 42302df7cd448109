{{/* The chart name, or nameOverride. */}}
{{- define "dradriver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object name: "dradriver" for a release called dradriver (the names of
deploy/ then), else <release>-<name>, unless fullnameOverride. */}}
{{- define "dradriver.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "dradriver.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dradriver.plugin" -}}
{{- include "dradriver.fullname" . -}}-kubelet-plugin
{{- end -}}

{{/* Labels of every object: deploy/'s part-of, Helm's own, and commonLabels. */}}
{{- define "dradriver.labels" -}}
app.kubernetes.io/part-of: dradriver
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ default .Chart.AppVersion .Values.image.tag | trunc 63 | trimSuffix "-" | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* metadata.labels and metadata.annotations of every object; `labels` and `annotations` add more. */}}
{{- define "dradriver.metadata" -}}
{{- $root := .root -}}
labels:
  {{- include "dradriver.labels" $root | nindent 2 }}
  {{- with .labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with merge (dict) (.annotations | default dict) $root.Values.commonAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The plugin pods' selector (immutable: as deploy/ has it). */}}
{{- define "dradriver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dradriver.name" . }}
app.kubernetes.io/component: kubelet-plugin
{{- end -}}

{{- define "dradriver.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- .Values.image.repository }}:{{ $tag }}{{ with .Values.image.digest }}@{{ . }}{{ end }}
{{- end -}}

{{- define "dradriver.fake" -}}
{{- if eq .Values.hostDriver.layout "fake" }}true{{ end -}}
{{- end -}}

{{/* "true" when the pods are GPU clients of the GPU operator (hostDriver.gpuOperatorClient;
null: with the gpu-operator layout), so that its driver manager can take them off the node. */}}
{{- define "dradriver.gpuOperatorClient" -}}
{{- $on := .Values.hostDriver.gpuOperatorClient -}}
{{- if kindIs "invalid" $on }}{{ $on = eq .Values.hostDriver.layout "gpu-operator" }}{{ end -}}
{{- if $on }}true{{ end -}}
{{- end -}}

{{/* The host driver's root on the host: hostDriver.root, else the layout's. */}}
{{- define "dradriver.driverRoot" -}}
{{- $roots := dict "host" "/" "gpu-operator" "/run/nvidia/driver" "gke" "/home/kubernetes/bin/nvidia" -}}
{{- default (get $roots .Values.hostDriver.layout) .Values.hostDriver.root -}}
{{- end -}}

{{/* This driver's own kubelet plugin directory: socket, lock and checkpoint. */}}
{{- define "dradriver.pluginDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubelet.rootDir) .Values.driverName -}}
{{- end -}}

{{- define "dradriver.idleEvents" -}}
{{- if not (kindIs "invalid" .Values.serve.idleThreshold) }}true{{ end -}}
{{- end -}}

{{/* A file of the repository the chart links to (files/), with this driver name in place of
every quoted "gpu.dradriver.dev" (CEL; the config API version gpu.dradriver.dev/v1alpha1 stays). */}}
{{- define "dradriver.file" -}}
{{- .root.Files.Get .path | replace "\"gpu.dradriver.dev\"" (printf "%q" .root.Values.driverName) -}}
{{- end -}}

{{/* The objects of a multi-document file under files/ (one source with deploy/), each renamed
from deploy/'s "dradriver-" prefix to this release's and labelled as the chart's objects. */}}
{{- define "dradriver.fileObjects" -}}
{{- $root := .root -}}
{{- $fullname := include "dradriver.fullname" $root -}}
{{- range $doc := splitList "\n---\n" (include "dradriver.file" .) }}
{{- $object := fromYaml $doc }}
{{- $meta := $object.metadata }}
{{- $_ := set $meta "name" (printf "%s%s" $fullname (trimPrefix "dradriver" $meta.name)) }}
{{- if $object.spec.policyName }}
{{- $_ := set $object.spec "policyName" (printf "%s%s" $fullname (trimPrefix "dradriver" $object.spec.policyName)) }}
{{- end }}
{{- $_ := merge $meta (fromYaml (include "dradriver.metadata" (dict "root" $root))) }}
---
{{ toYaml $object }}
{{- end }}
{{- end -}}
