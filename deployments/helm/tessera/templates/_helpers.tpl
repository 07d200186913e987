{{/* The driver name is fixed: DeviceClasses, ResourceSlices and the plugin agree on it. */}}
{{- define "tessera.driverName" -}}gpu.tessera.dev{{- end -}}

{{- define "tessera.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tessera.fullname" -}}
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

{{- define "tessera.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tessera
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "controller"). */}}
{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessera.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tessera.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "tessera.plugin.fullname" -}}{{ include "tessera.fullname" . | trunc 48 | trimSuffix "-" }}-kubelet-plugin{{- end -}}
{{- define "tessera.controller.fullname" -}}{{ include "tessera.fullname" . | trunc 52 | trimSuffix "-" }}-controller{{- end -}}

{{- define "tessera.plugin.serviceAccountName" -}}
{{- if .Values.kubeletPlugin.serviceAccount.create -}}
{{- default (include "tessera.plugin.fullname" .) .Values.kubeletPlugin.serviceAccount.name -}}
{{- else -}}
{{- required "kubeletPlugin.serviceAccount.name is required when kubeletPlugin.serviceAccount.create is false" .Values.kubeletPlugin.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tessera.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create -}}
{{- default (include "tessera.controller.fullname" .) .Values.controller.serviceAccount.name -}}
{{- else -}}
{{- required "controller.serviceAccount.name is required when controller.serviceAccount.create is false" .Values.controller.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The canary controller (canary-controller.yaml): its Deployment and ServiceAccount. */}}
{{- define "tessera.canary.fullname" -}}{{ include "tessera.controller.fullname" . | trunc 56 | trimSuffix "-" }}-canary{{- end -}}

{{/* The service accounts allowed to admit (ungate) and to write tessera.dev/
keys: the controller's and, with controller.canary.enabled, the canary's; as a JSON list
of user names for the admission policies. */}}
{{- define "tessera.controller.usernames" -}}
{{- $names := list (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "tessera.controller.serviceAccountName" .)) -}}
{{- if .Values.controller.canary.enabled -}}
{{- $names = append $names (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "tessera.canary.fullname" .)) -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/* Webhook objects: the controller is told these names so that it patches exactly them. */}}
{{- define "tessera.webhook.serviceName" -}}{{ include "tessera.fullname" . | trunc 55 | trimSuffix "-" }}-webhook{{- end -}}
{{- define "tessera.webhook.mutatingName" -}}{{ include "tessera.fullname" . }}-pod-admission{{- end -}}
{{- define "tessera.webhook.validatingName" -}}{{ include "tessera.fullname" . }}-queue-validation{{- end -}}
{{- define "tessera.webhook.secretName" -}}
{{- default (printf "%s-webhook-tls" (include "tessera.fullname" .)) .Values.webhook.certificates.secretName -}}
{{- end -}}
{{- define "tessera.webhook.certName" -}}{{ include "tessera.fullname" . }}-webhook{{- end -}}

{{/* Host names the serving certificate covers: the URL's host, or the Service's DNS names. */}}
{{- define "tessera.webhook.certHosts" -}}
{{- if .Values.webhook.url -}}
{{- (urlParse .Values.webhook.url).hostname -}}
{{- else -}}
{{- $svc := include "tessera.webhook.serviceName" . -}}
{{- printf "%s.%s.svc,%s.%s.svc.cluster.local" $svc .Release.Namespace $svc .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* clientConfig of one webhook: include with (dict "ctx" $ "path" "/x"). */}}
{{- define "tessera.webhook.clientConfig" -}}
{{- if .ctx.Values.webhook.url }}
url: {{ printf "%s%s" (trimSuffix "/" .ctx.Values.webhook.url) .path | quote }}
{{- else }}
service:
  name: {{ include "tessera.webhook.serviceName" .ctx }}
  namespace: {{ .ctx.Release.Namespace }}
  port: 443
  path: {{ .path | quote }}
{{- end }}
{{- end -}}

{{/* Does the plugin need a ConfigMap (mock node description, per-GPU time slices)? */}}
{{- define "tessera.plugin.needsConfig" -}}
{{- if or .Values.kubeletPlugin.timeSlicesPerGPU (and (eq .Values.kubeletPlugin.gpuBackend "mock") .Values.kubeletPlugin.mock.config) -}}true{{- end -}}
{{- end -}}

{{/* Class-level GpuConfig, or nothing. */}}
{{- define "tessera.deviceClassConfig" -}}
{{- $d := .Values.deviceClasses.defaults -}}
{{- if or $d.enforcement $d.minEnforcement $d.timeSliceInterval $d.frameworkCaps $d.computeDefault }}
config:
- opaque:
    driver: {{ include "tessera.driverName" . }}
    parameters:
      apiVersion: tessera.dev/v1alpha1
      kind: GpuConfig
      {{- with $d.enforcement }}
      enforcement: {{ . }}
      {{- end }}
      {{- with $d.minEnforcement }}
      minEnforcement: {{ . }}
      {{- end }}
      {{- with $d.timeSliceInterval }}
      timeSliceInterval: {{ . }}
      {{- end }}
      {{- with $d.frameworkCaps }}
      frameworkCaps: {{ toJson . }}
      {{- end }}
      {{- with $d.computeDefault }}
      computeDefault: {{ . }}
      {{- end }}
{{- end }}
{{- end -}}

{{/* Checks of combinations the schema cannot express. */}}
{{- define "tessera.validate" -}}
{{- if and .Values.controller.enabled (gt (int .Values.controller.replicas) 1) (not .Values.controller.leaderElection.enabled) -}}
{{- fail "controller.replicas > 1 needs controller.leaderElection.enabled=true" -}}
{{- end -}}
{{- if and .Values.webhook.enabled (not .Values.controller.enabled) -}}
{{- fail "webhook.enabled=true needs controller.enabled=true: the controller serves the webhooks" -}}
{{- end -}}
{{- if .Values.controller.canary.enabled -}}
{{- if not .Values.controller.enabled -}}
{{- fail "controller.canary.enabled=true needs controller.enabled=true: the canary decides only the queues that name it, next to the main controller" -}}
{{- end -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" (toString .Values.controller.canary.controllerName)) -}}
{{- fail (printf "controller.canary.controllerName=%q is not a DNS label: use lower-case letters, digits and '-', at most 63 (Queue spec.controllerName names it)" (toString .Values.controller.canary.controllerName)) -}}
{{- end -}}
{{- if eq .Values.controller.canary.controllerName "default" -}}
{{- fail "controller.canary.controllerName=default is the main controller's name: pick another, e.g. canary" -}}
{{- end -}}
{{- end -}}
{{- $p := .Values.kubeletPlugin -}}
{{- if and (eq $p.healthcheck.mode "grpc") $p.hostNetwork $p.seamlessUpgrade -}}
{{- fail "kubeletPlugin.healthcheck.mode=grpc with hostNetwork: the health port is a host port, which the new pod of a seamless upgrade cannot share with the old one; use healthcheck.mode=exec (the default) or seamlessUpgrade=false" -}}
{{- end -}}
{{- if and (dig "canary" "enabled" false $p) (not $p.seamlessUpgrade) -}}
{{- fail "kubeletPlugin.canary.enabled=true needs kubeletPlugin.seamlessUpgrade=true: while a node moves between the main and the canary DaemonSet both plugin pods run there, and only the rolling-update mode lets two pods of one driver serve a node side by side" -}}
{{- end -}}
{{- if and .Values.kubeletPlugin.interposer.install.enabled (not .Values.kubeletPlugin.interposer.install.image) -}}
{{- fail "kubeletPlugin.interposer.install.enabled=true needs kubeletPlugin.interposer.install.image: the image that holds libvgpu.so" -}}
{{- end -}}
{{- if and .Values.kubeletPlugin.interposer.install.enabled .Values.kubeletPlugin.interposerLibrary -}}
{{- fail "set either kubeletPlugin.interposerLibrary (a library already on the nodes) or kubeletPlugin.interposer.install.enabled (copy it from an image), not both" -}}
{{- end -}}
{{- if and .Values.translation.enabled (not (and .Values.controller.enabled .Values.webhook.enabled)) -}}
{{- fail "translation.enabled=true needs controller.enabled=true and webhook.enabled=true: the controller's webhook translates pods" -}}
{{- end -}}
{{- end -}}

{{/* key=value,... of a map, keys sorted (a flag of pflag's StringToString). */}}
{{- define "tessera.keyValues" -}}
{{- $m := . -}}
{{- range $i, $k := keys $m | sortAlpha }}{{ if $i }},{{ end }}{{ $k }}={{ index $m $k }}{{ end -}}
{{- end -}}

{{/* The value of a component's --feature-gates: (dict "set" <the user's
featureGates> "auto" <gates the chart's other values need>); the user's
value of a gate wins. Empty when both are. */}}
{{- define "tessera.featureGates" -}}
{{- $g := dict -}}
{{- range $k, $v := (.auto | default dict) }}{{ $_ := set $g $k $v }}{{ end -}}
{{- /* set, not merge: merge would take a user's false for unset */ -}}
{{- range $k, $v := (.set | default dict) }}{{ $_ := set $g $k $v }}{{ end -}}
{{- range $i, $k := keys $g | sortAlpha }}{{ if $i }},{{ end }}{{ $k }}={{ index $g $k }}{{ end -}}
{{- end -}}

{{/* A component's verbosity: (list override global); 0 is a valid override. */}}
{{- define "tessera.verbosity" -}}
{{- if kindIs "invalid" (index . 0) -}}{{ index . 1 }}{{- else -}}{{ index . 0 }}{{- end -}}
{{- end -}}

{{/* What an admission controller does with the API (the main controller's
ClusterRole and the canary's): see controller-rbac.yaml. */}}
{{- define "tessera.controller.rules" -}}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
# Evictions (the Eviction API, PodDisruptionBudgets honoured): reclaim
# (controller.reclaim), idle reclaim (Queue spec.idle: Evict) and pods
# whose node pin went stale.
- apiGroups: [""]
  resources: ["pods/eviction"]
  verbs: ["create"]
{{- if and .Values.controller.reclaim .Values.controller.reclaimPastBudgets }}
# Reclaim deletes an over-quota victim whose eviction a
# PodDisruptionBudget refused when no other over-quota work makes room
# (controller.reclaimPastBudgets); the policy <controller>-pod-deletes
# allows it only on queued pods it marked Reclaimed.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["delete"]
{{- end }}
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
# The webhook reads the pod's namespace: its queue label, and its labels
# against the queue's namespaceSelector (from an informer: every pod
# creation waits for the webhook).
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaims", "resourceclaimtemplates", "resourceslices", "deviceclasses", "devicetaintrules"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["tessera.dev"]
  resources: ["queues"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["tessera.dev"]
  resources: ["queues/status"]
  verbs: ["update", "patch"]
{{- end -}}

{{/*
The extended resource names the pod policies count as DRA devices besides
deviceclass.resource.kubernetes.io/<class> (DRAExtendedResource: every
DeviceClass answers to it): the chart's gpu.tessera.dev extendedResourceName
when enabled, and admissionPolicies.extendedResourceNames (names that
DeviceClasses made outside the chart serve). A JSON list.
*/}}
{{- define "tessera.extendedResourceNames" -}}
{{- $names := .Values.admissionPolicies.extendedResourceNames | default list -}}
{{- if .Values.deviceClasses.extendedResourceName.enabled -}}
{{- $names = append $names .Values.deviceClasses.extendedResourceName.name -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/*
CEL over a container `c`: it gets devices through DRA, by a claim or by an
extended resource a DeviceClass serves. Policies cannot read DeviceClasses:
for the implicit name every class counts, for explicit names those of
tessera.extendedResourceNames (the webhook reads the live classes).
*/}}
{{- define "tessera.cel.containerUsesDevices" -}}
has(c.resources) && ((has(c.resources.claims) && size(c.resources.claims) > 0) || (has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith("deviceclass.resource.kubernetes.io/") || k in {{ include "tessera.extendedResourceNames" . }})))
{{- end -}}

{{/* CEL over `object` (a pod): it gets devices through DRA. */}}
{{- define "tessera.cel.podUsesDevices" -}}
(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0) || (object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])).exists(c, {{ include "tessera.cel.containerUsesDevices" . }})
{{- end -}}

{{/* Which pods the sandbox policy (<release>-sandbox) holds to Tessera's
sandbox, as one CEL expression over object and namespaceObject: every pod
of a managed namespace (label tessera.dev/queue), and anywhere else a pod
that may hold one of Tessera's devices: queued (label tessera.dev/queue),
or getting devices through DRA (tessera.cel.podUsesDevices: one definition
of a device user for every policy). */}}
{{- define "tessera.sandbox.podMatches" -}}
namespaceObject.metadata.?labels[?"tessera.dev/queue"].hasValue() ||
      object.metadata.?labels[?"tessera.dev/queue"].hasValue() ||
      {{ include "tessera.cel.podUsesDevices" . }}
{{- end -}}

{{/* A sandbox check over the containers a request adds (variables.regular,
variables.ephemeral: two types, two lists): the names (or "name", a CEL
expression over c) of those for which "test" holds. */}}
{{- define "tessera.sandbox.each" -}}
{{- $name := .name | default "c.name" -}}
variables.regular.filter(c, {{ .test }}).map(c, {{ $name }}) + variables.ephemeral.filter(c, {{ .test }}).map(c, {{ $name }})
{{- end -}}
